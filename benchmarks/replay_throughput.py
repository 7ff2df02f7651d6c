"""Replay throughput (blocks/s) of prefixlab's block cache against a naive baseline.

Run: ``python benchmarks/replay_throughput.py`` (``--quick`` for a small trace).

The workload is a hash-form multi-turn trace (agentic sessions with a growing context,
16-token blocks, as in the Qwen-Bailian traces) of at least 2 million blocks. The baseline,
measured in the same run on the same trace, is a plain ``OrderedDict`` LRU block cache:
per block a dict lookup, ``move_to_end`` on hit, insert and ``popitem`` on miss, with no
reference counts or pinning. Every policy is reported as blocks/s and as a ratio to it
(best of ``--repeat`` runs each); ``vllm``, ``lru`` and ``fifo`` are reported twice, with the
compiled kernel (the ``fast`` extra) and on the numpy path.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict

from prefixlab.runner._fast import HAVE_NUMBA, POLICY_CODES
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators.sessions import generate_sessions
from prefixlab.workload.trace import BlockLayout, Trace, to_hash_form


def make_trace(min_blocks: int, seed: int = 0) -> Trace:
    """Agentic multi-turn sessions in hash form, grown until they hold min_blocks blocks."""
    num_sessions = 64
    while True:
        tok = generate_sessions(
            num_sessions=num_sessions,
            session_rate_per_s=0.5,
            preset="agentic",
            mean_turns=12,
            max_turns=40,
            system_tokens=2048,
            num_system_prompts=16,
            mean_user_tokens=384,
            mean_output_tokens=256,
            seed=seed,
        )
        trace = to_hash_form(tok, 16)
        layout = trace.block_layout()
        if int(layout.num_blocks_held.sum()) >= min_blocks:
            return trace
        num_sessions = int(num_sessions * 1.6)


def naive_ordered_dict(layout: BlockLayout, capacity_blocks: int) -> tuple[float, int]:
    """The baseline: an OrderedDict LRU over block keys. Returns (seconds, hit blocks)."""
    keys_per_req = [
        layout.keys[layout.key_offsets[r] : layout.key_offsets[r + 1]].tolist()
        for r in range(layout.key_offsets.shape[0] - 1)
    ]
    lookups = layout.num_lookup_blocks.tolist()
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    start = time.perf_counter()
    for keys, nl in zip(keys_per_req, lookups, strict=True):
        for k in keys[:nl]:
            if k not in cache:
                break
            hits += 1
        for k in keys:
            if k in cache:
                cache.move_to_end(k)
            else:
                cache[k] = None
                if len(cache) > capacity_blocks:
                    cache.popitem(last=False)
    return time.perf_counter() - start, hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-blocks", type=int, default=2_000_000)
    ap.add_argument("--quick", action="store_true", help="the smallest trace (about 700k blocks)")
    ap.add_argument("--capacity-fraction", type=float, default=0.02)
    ap.add_argument("--policies", default="vllm,lru,arc,s3fifo,opt")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = ap.parse_args(argv)
    min_blocks = 200_000 if args.quick else args.min_blocks
    trace = make_trace(min_blocks)
    layout = trace.block_layout()
    num_blocks = int(layout.num_blocks_held.sum())
    capacity = max(int(num_blocks * args.capacity_fraction), int(layout.num_blocks_held.max()))
    print(
        f"trace: {len(trace):,} requests, {num_blocks:,} blocks "
        f"({num_blocks / len(trace):.0f} per request), {layout.num_distinct_keys:,} distinct "
        f"keys; capacity {capacity:,} blocks"
    )
    base_s = min(naive_ordered_dict(layout, capacity)[0] for _ in range(args.repeat))
    base_rate = num_blocks / base_s
    print(f"compiled kernel (numba): {'yes' if HAVE_NUMBA else 'no (install the fast extra)'}")
    print(f"{'policy':<22}{'blocks/s':>14}{'x naive':>10}{'token hit':>11}")
    print(f"{'naive OrderedDict':<22}{base_rate:>14,.0f}{1.0:>10.2f}{'-':>11}")
    rows = [(spec, True) for spec in args.policies.split(",")]
    # The same policies without the compiled kernel (numpy path), where the kernel applies.
    rows += [(spec, False) for spec in args.policies.split(",") if spec in POLICY_CODES]
    for spec, fast in rows:
        runs = [
            replay(trace, spec, ReplayConfig(capacity_blocks=capacity), fast=fast)
            for _ in range(args.repeat)
        ]
        res = min(runs, key=lambda r: r.elapsed_s)
        rate = num_blocks / res.elapsed_s
        label = spec if fast else f"{spec} (numpy path)"
        print(
            f"{label:<22}{rate:>14,.0f}{rate / base_rate:>10.2f}"
            f"{res.metrics['token_hit_ratio']:>11.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
