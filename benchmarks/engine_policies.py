"""Engine runner throughput by policy when running requests pin most of the cache.

Run: ``python benchmarks/engine_policies.py`` (``--quick`` for a small trace).

The workload is UniCache's trace #1 stand-in (the ``mix`` generator, 80% multi-turn, no
shared session prompt) squeezed into ten minutes, on a 6,000-block cache with the 3B power
fit and 20 ms decode steps: the engine runs a backlog, and at any moment most cached blocks
belong to running requests. A policy that walked past every pinned entry to find a victim
paid a scan of the cache per eviction there (ARC, LeCaR and S3-FIFO did until they kept
their free entries in a heap; 5-19x slower than now on this trace). The baseline, measured
in the same run on the same trace, is ``lru``; each policy is reported as requests/s and
as a ratio to it.
"""

from __future__ import annotations

import argparse
import time

from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.workload.generators import GENERATORS

POLICIES = ["lru", "fifo", "lfu", "arc", "lecar", "s3fifo", "sieve", "wa", "unicache", "opt"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small trace (CI smoke run)")
    args = ap.parse_args()
    n = 600 if args.quick else 3000
    trace = GENERATORS["mix"].fn(
        trace=1,
        num_requests=n,
        duration_s=600.0 * n / 3000,
        seed=0,
        system_tokens=0,
        system_pool="per-task",
    )
    trace.block_layout(16, None, False, 1)  # hash once, outside the timings
    cfg = EngineConfig(capacity_blocks=6000 * n // 3000, block_tokens=16)
    timing = make_timing("power:a=0.000144543,b=0.992,c=1.034+tpot:s=0.02")
    simulate(trace, "lru", cfg, timing)  # load the compiled kernels, untimed
    print(f"trace: {len(trace):,} requests, cache {cfg.capacity_blocks:,} blocks")
    print(f"{'policy':<10}{'requests/s':>12}{'x lru':>8}{'token hit':>11}{'mean TTFT':>12}")
    base = 0.0
    for spec in POLICIES:
        t0 = time.perf_counter()
        m = simulate(trace, spec, cfg, timing).metrics
        rate = len(trace) / (time.perf_counter() - t0)
        base = base or rate
        print(
            f"{spec:<10}{rate:>12,.0f}{rate / base:>8.2f}{m['token_hit_ratio']:>11.4f}"
            f"{m['mean_ttft_s']:>11.2f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
