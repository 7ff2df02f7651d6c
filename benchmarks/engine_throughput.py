"""Engine runner throughput: simulated requests per second, and where the time goes.

Run: ``python benchmarks/engine_throughput.py`` (``--quick`` for a small trace).

The workload is a multi-turn chat trace from the session generator (about 20,000 requests,
mean output 128 tokens), served by the engine runner with an LRU prefix cache on a KV pool
of 20,000 16-token blocks, Llama-3.1-8B/H100 power-law prefill and 20 ms per decode step.
The baseline, measured in the same run on the same trace, is the replay runner's generic
(numpy) path, which does the same cache work per request without time, batching or
decode steps. The time spent inside the cache (match, acquire, grow, commit, release:
structure plus policy) is measured by wrapping those methods; the rest is the scheduler,
the event loop and the timing model.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from prefixlab.cache.block import BlockCache
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import generate_sessions

CACHE_METHODS = ("match", "acquire", "grow", "commit", "release")


class CacheTimer:
    """Wraps BlockCache's lifecycle methods to add up the time spent in them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> CacheTimer:
        for name in CACHE_METHODS:
            original = getattr(BlockCache, name)
            self._saved[name] = original

            def timed(self_: BlockCache, *a: Any, _f: Any = original, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _f(self_, *a, **k)
                finally:
                    self.seconds += time.perf_counter() - t0

            setattr(BlockCache, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(BlockCache, name, original)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sessions = 400 if args.quick else 4000
    trace = generate_sessions(
        num_sessions=sessions, session_rate_per_s=2.0, mean_output_tokens=128, seed=0
    )
    trace.block_layout(16, None, False, 1)  # hash once, outside both timings
    timing = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.02")
    cfg = EngineConfig(capacity_blocks=20_000, block_tokens=16)
    n = len(trace)

    t0 = time.perf_counter()
    base = replay(trace, "lru", ReplayConfig(capacity_blocks=20_000, block_tokens=16), fast=False)
    t_replay = time.perf_counter() - t0

    with CacheTimer() as timer:
        t0 = time.perf_counter()
        res = simulate(trace, "lru", cfg, timing)
        t_engine = time.perf_counter() - t0
    m = res.metrics
    print(f"trace: {n:,} requests in {sessions:,} sessions, "
          f"{int(trace.input_length.sum()):,} input / {int(trace.output_length.sum()):,} output "
          f"tokens; {m['num_steps']:,} engine steps")  # fmt: skip
    print(f"{'runner':<28}{'requests/s':>12}{'x replay':>10}{'token hit':>11}")
    print(f"{'replay (numpy path)':<28}{n / t_replay:>12,.0f}{1.0:>10.2f}"
          f"{base.metrics['token_hit_ratio']:>11.4f}")  # fmt: skip
    print(f"{'engine':<28}{n / t_engine:>12,.0f}{t_replay / t_engine:>10.2f}"
          f"{m['token_hit_ratio']:>11.4f}")  # fmt: skip
    share = timer.seconds / t_engine
    print(
        f"engine time: {100 * share:.1f}% in the cache (structure + policy), "
        f"{100 * (1 - share):.1f}% in the scheduler, event loop and timing model"
    )
    print(
        f"simulated: mean TTFT {m['mean_ttft_s'] * 1e3:.1f} ms, mean QTTFT "
        f"{m['mean_qttft_s'] * 1e3:.1f} ms, makespan {m['makespan_s']:,.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
