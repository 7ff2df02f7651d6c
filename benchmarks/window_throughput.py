"""Engine throughput for sliding-window models: vLLM's hybrid KV-cache manager (the
``window`` rule, on the reference loop) against keeping every layer (the ``full`` rule,
compiled and on the reference loop); for the models SGLang serves with its SWA pools
(gpt-oss), also SGLang's rule on the radix structure (``sglang-lru``, on the reference
loop) against the radix structure keeping every layer (compiled).

Run: ``python benchmarks/window_throughput.py`` (``--quick`` for a small trace,
``--models gemma-3-27b`` for some).

The workload is the session generator's multi-turn chat (1,000 sessions, ``--quick``
200), served with LRU on 40 GB of each model's KV (whole blocks at every layer; the
window rule turns the same bytes into pages), its roofline on an H100. Printed per model:
requests per second of each run, the ratios to the compiled full rule measured in the
same run, and the token hit ratio each rule gets.
"""

from __future__ import annotations

import argparse
import time

from prefixlab.model.spec import capacity_blocks_for_bytes, get_model
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, EngineResult, simulate
from prefixlab.runner.engine.swa_radix import sglang_hybrid_swa
from prefixlab.workload.generators import generate_sessions

MODELS = ["gpt-oss-20b", "gemma-3-27b"]
BYTES = 40 * 10**9


def _timed(run: object) -> tuple[float, EngineResult]:
    start = time.perf_counter()
    res = run()  # type: ignore[operator]
    return time.perf_counter() - start, res


def bench(model: str, sessions: int) -> None:
    trace = generate_sessions(num_sessions=sessions, seed=0)
    timing = make_timing("roofline", model=model, gpu="h100")
    blocks = capacity_blocks_for_bytes(BYTES, model, 16)
    base = {"capacity_blocks": blocks, "block_tokens": 16, "model": model}
    full = EngineConfig(**base, sliding_window_rule="full")  # type: ignore[arg-type]
    window = EngineConfig(**base)  # type: ignore[arg-type]
    simulate(trace, "lru", full, timing)  # load the compiled kernels
    runs = {
        "full, compiled": lambda: simulate(trace, "lru", full, timing),
        "full, reference": lambda: simulate(trace, "lru", full, timing, fast=False),
        "window, reference": lambda: simulate(trace, "lru", window, timing),
    }
    if sglang_hybrid_swa(get_model(model)):
        radix = {**base, "structure": "radix"}
        radix_full = EngineConfig(**radix, sliding_window_rule="full")  # type: ignore[arg-type]
        radix_window = EngineConfig(**radix)  # type: ignore[arg-type]
        simulate(trace, "sglang-lru", radix_full, timing)  # load the radix kernels
        runs["radix full, compiled"] = lambda: simulate(trace, "sglang-lru", radix_full, timing)
        runs["radix window, ref."] = lambda: simulate(trace, "sglang-lru", radix_window, timing)
    timed = {name: _timed(run) for name, run in runs.items()}
    first = timed["full, compiled"][0]
    print(f"{model}: {len(trace):,} requests, {blocks:,} blocks of 16 tokens")
    for name, (secs, res) in timed.items():
        rate = len(trace) / secs
        hit = res.metrics["token_hit_ratio"]
        print(f"  {name:18s} {rate:10,.0f} req/s  x{first / secs:6.3f}  token hit {hit:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    for model in args.models.split(","):
        bench(model, 200 if args.quick else 1000)


if __name__ == "__main__":
    main()
