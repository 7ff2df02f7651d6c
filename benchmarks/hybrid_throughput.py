"""Hybrid (KV + SSM state) cache throughput: requests per second of Marconi and baselines.

Run: ``python benchmarks/hybrid_throughput.py`` (``--quick`` for a small trace).

The workload is agentic: 150 sessions of the session generator with the agentic gap preset,
about 10 turns each, 4,000-token system prompts, 1,500-token user turns and 500-token
replies, so contexts grow long: 1,501 requests and 32.5 M input tokens. The model is
Marconi's 7B hybrid on a 40 GB cache.

Each system runs twice in the same run: on the object tree (``replay_hybrid(...,
fast=False)``: :class:`~prefixlab.cache.hybrid.HybridCache`, the path a third-party policy
takes, and the reference) and compiled (the default: ``runner/_fast_hybrid.py``). The table
prints both rates, their ratio, and whether every request's hit is the same (it must be).
Tuned Marconi replays its bootstrap window once per alpha of the grid (21 replays), on the
same tree the run uses.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from prefixlab.runner.hybrid import HybridConfig, HybridResult, replay_hybrid
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Trace

SYSTEMS = ("sglang+", "vllm+", "marconi:alpha=1", "marconi", "marconi:tune_jobs=2")


def workload(quick: bool) -> Trace:
    sessions = 30 if quick else 150
    return GENERATORS["sessions"].fn(
        num_sessions=sessions,
        preset="agentic",
        mean_turns=10,
        max_turns=40,
        mean_user_tokens=1500,
        mean_output_tokens=500,
        system_tokens=4000,
    )


def timed(
    trace: Trace, policy: str, config: HybridConfig, fast: bool
) -> tuple[float, HybridResult]:
    start = time.perf_counter()
    res = replay_hybrid(trace, policy, config, fast=fast)
    return time.perf_counter() - start, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small trace (CI smoke run)")
    args = ap.parse_args()
    trace = workload(args.quick)
    n, tokens = len(trace), int(trace.input_length.sum())
    config = HybridConfig(capacity_bytes=40 * 10**9, model="marconi-hybrid-7b")
    print(f"trace: {n:,} requests, {tokens / 1e6:.1f} M input tokens; cache 40 GB, {config.model}")
    trace.sequence_tokens()  # computed once per trace, outside every timing
    replay_hybrid(trace.take(np.arange(min(n, 20))), "marconi:alpha=1", config)  # compile
    print(
        f"\n{'system':22} {'object req/s':>12} {'compiled req/s':>14} {'ratio':>7} "
        f"{'token hit':>9} {'evictions':>9} {'same hits':>9}"
    )
    bad = []
    for system in SYSTEMS:
        slow_s, slow = timed(trace, system, config, fast=False)
        fast_s, fast = timed(trace, system, config, fast=True)
        same = np.array_equal(slow.hit_tokens, fast.hit_tokens) and slow.metrics == fast.metrics
        m = fast.metrics
        print(
            f"{system:22} {n / slow_s:12,.0f} {n / fast_s:14,.0f} {slow_s / fast_s:6.1f}x "
            f"{m['token_hit_ratio']:9.3f} {m['num_evicted_nodes']:9,} {same!s:>9}"
        )
        if not same:
            bad.append(system)
    if bad:
        raise SystemExit(f"compiled and object replays disagree: {', '.join(bad)}")


if __name__ == "__main__":
    main()
