"""Engine runner throughput: the compiled engine against the reference loop, every policy.

Run: ``python benchmarks/engine_throughput.py`` (``--quick`` for a small trace,
``--policies lru,opt`` for some, ``--structure radix`` for SGLang's radix tree and
``--structure hybrid`` for the hybrid KV + SSM-state tree: every policy that applies to it
unless ``--policies`` says otherwise).

The workload is a multi-turn chat trace from the session generator (2,000 sessions, about
9,800 requests, mean output 128 tokens), served by the engine runner on a KV pool of
20,000 16-token blocks with Llama-3.1-8B/H100 power-law prefill and 20 ms per decode step.
The hybrid structure serves it with Marconi's 7B hybrid model (KV and SSM states) on as
many bytes as 320,000 tokens of its KV (the same tokens as the block pool), priced by
its roofline on an H100.
For each policy, in the same run on the same trace:

* ``reference``: ``simulate(..., fast=False)``, the event loop, scheduler, block cache and
  policy classes in Python (what the engine runner was before it was compiled);
* ``compiled``: ``simulate(...)``, the compiled engine (:mod:`prefixlab.runner.engine._kernel`);

both timed from the call to its return (an offline policy's preparation included), after
one untimed compiled run that loads the kernels; with ``--repeat N`` each is timed N times
(alternating, each after a garbage collection: the reference's object trees are cycles
the collector would otherwise reclaim during the next run) and the fastest kept. The
column ``same`` says whether the two gave the same per-request times, hits and
preemptions, to the last bit.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, EngineResult, simulate
from prefixlab.workload.generators import generate_sessions

POLICIES = [
    "lru",
    "fifo",
    "vllm",
    "lfu",
    "mru",
    "sglang-lru",
    "hashtable",
    "sieve",
    "arc",
    "s3fifo",
    "lecar",
    "opt",
    "wa",
    "wa-atc25",
    "unicache",
    "lpc-oracle",
    "opt-online",
    "unicache-opt",
]
#: the built-in policies that apply to the radix structure
RADIX_POLICIES = [
    "lru",
    "fifo",
    "lfu",
    "mru",
    "sglang-lru",
    "hashtable",
    "sieve",
    "arc",
    "s3fifo",
    "lecar",
    "opt",
    "lpc-oracle",
    "opt-online",
]
#: the hybrid structure's systems (Marconi's and its baselines; ``marconi`` tunes alpha)
HYBRID_POLICIES = ["vanilla", "sglang+", "vllm+", "marconi:alpha=1", "marconi"]


def same(a: EngineResult, b: EngineResult) -> bool:
    arrays = (
        "arrival_s",
        "scheduled_s",
        "first_token_s",
        "finish_s",
        "hit_tokens",
        "num_preemptions",
    )
    return a.num_steps == b.num_steps and all(
        np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True) for f in arrays
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small trace (CI smoke run)")
    ap.add_argument("--policies", default=None, help="comma-separated (default: all)")
    ap.add_argument("--structure", default="block", choices=["block", "radix", "hybrid"])
    ap.add_argument("--repeat", type=int, default=1, help="time each path N times, keep the best")
    ap.add_argument(
        "--timing",
        default="power:preset=llama-3.1-8b-h100+tpot:s=0.02",
        help="timing spec, e.g. roofline (for Llama-3.1-8B on an H100)",
    )
    args = ap.parse_args()
    sessions = 200 if args.quick else 2000
    trace = generate_sessions(
        num_sessions=sessions, session_rate_per_s=2.0, mean_output_tokens=128, seed=0
    )
    trace.block_layout(16, None, False, 1)  # hash once, outside the timings
    timing = make_timing(args.timing, model="llama-3.1-8b", gpu="h100")
    cfg = EngineConfig(capacity_blocks=20_000, block_tokens=16, structure=args.structure)
    every = RADIX_POLICIES if args.structure == "radix" else POLICIES
    if args.structure == "hybrid":
        from prefixlab.model import get_model

        model = "marconi-hybrid-7b"
        timing = make_timing(["roofline"], model, "h100")
        budget = 320_000 * get_model(model).kv_bytes_per_token
        cfg = EngineConfig(
            capacity_blocks=1,
            block_tokens=16,
            structure="hybrid",
            model=model,
            capacity_bytes=budget,
        )
        every = HYBRID_POLICIES
    policies = args.policies.split(",") if args.policies else every
    n = len(trace)
    simulate(trace, every[1], cfg, timing)  # load the compiled kernels
    steps = 0
    print(
        f"{'policy':<12}{'reference':>11}{'compiled':>11}{'x ref':>8}{'token hit':>11}"
        f"{'preempt':>9}  same   (requests/s)"
    )
    for spec in policies:
        t_ref = t_fast = float("inf")
        for _ in range(max(args.repeat, 1)):
            gc.collect()  # neither run pays for the other's garbage (the object trees)
            t0 = time.perf_counter()
            ref = simulate(trace, spec, cfg, timing, fast=False)
            t1 = time.perf_counter()
            gc.collect()
            t2 = time.perf_counter()
            fast = simulate(trace, spec, cfg, timing)
            t3 = time.perf_counter()
            t_ref, t_fast = min(t_ref, t1 - t0), min(t_fast, t3 - t2)
        m = fast.metrics
        steps = fast.num_steps
        print(
            f"{spec:<12}{n / t_ref:>11,.0f}{n / t_fast:>11,.0f}{t_ref / t_fast:>8.1f}"
            f"{m['token_hit_ratio']:>11.4f}{m['num_preemptions']:>9,}  "
            f"{'yes' if same(ref, fast) else 'NO'}"
        )
    print(
        f"trace: {n:,} requests in {sessions:,} sessions, "
        f"{int(trace.input_length.sum()):,} input / {int(trace.output_length.sum()):,} output "
        f"tokens; {steps:,} engine steps (last policy); {args.structure} structure"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
