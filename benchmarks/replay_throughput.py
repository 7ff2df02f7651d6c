"""Replay throughput of every policy on every structure, against a reference and peers.

Run: ``python benchmarks/replay_throughput.py`` (``--quick`` for a small trace).

The workload is a hash-form multi-turn trace (agentic sessions with a growing context,
16-token blocks, as in the Qwen-Bailian traces). The reference, measured in the same run on
the same trace, is the pure-Python model of vLLM v1's ``BlockPool`` that the tests use as an
oracle (``tests/reference/vllm_pool_ref.py``: linked free queue, ref counts, duplicate
holders), replaying requests already parsed. Every replay-capable built-in policy is
timed on the block and radix structures (blocks/s, ratio to the reference, token hit
ratio; best of ``--repeat``), then the peers on the same block stream: KVCache.AI's
``kvcache-simulator`` (C++, LRU / FIFO / optimal) and libCacheSim (C, LRU / FIFO /
Belady), each in its own scratch environment (``benchmarks/_peers.py``).

Times cover the replay loop only (no trace loading; compilation is warmed up first, and
OPT's next-use pass is outside the loop, as a peer's is). ``kernel`` says whether a
request-loop kernel ran (compiled with numba) or the generic path (policy hooks called
per request from Python).

The ``engine`` structure row serves the same trace through the engine runner (block cache,
Llama-3.1-8B/H100 power-law prefill, 20 ms decode steps): requests/s of the compiled engine
and of its reference loop (``simulate(..., fast=False)``) in the same run, their ratio,
and whether both gave the same per-request times and hits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from prefixlab.policies.base import make_policy, registered
from prefixlab.runner import _fast
from prefixlab.runner._fast_radix import radix_code
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators.sessions import generate_sessions
from prefixlab.workload.trace import Trace, to_hash_form

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "reference"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


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
        if int(trace.block_layout().num_blocks_held.sum()) >= min_blocks:
            return trace
        num_sessions = int(num_sessions * 1.6)


def hash_lists(trace: Trace) -> list[list[int]]:
    """Every request's hash ids as a list."""
    assert trace.hash_ids is not None
    values, offsets = trace.hash_ids
    ids = values.astype("int64").tolist()
    return [ids[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def write_mooncake(trace: Trace, path: Path) -> None:
    """The trace as Mooncake-style JSONL (timestamp in ms, lengths, hash_ids), no header."""
    with path.open("w", encoding="utf-8") as fh:
        for t, i, o, h in zip(
            (trace.arrival_s * 1000).round().astype("int64").tolist(),
            trace.input_length.tolist(),
            trace.output_length.tolist(),
            hash_lists(trace),
            strict=True,
        ):
            fh.write(
                json.dumps(
                    {"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h},
                    separators=(",", ":"),
                )
                + "\n"
            )


def reference_vllm(trace: Trace, capacity_blocks: int, block_tokens: int) -> tuple[float, int]:
    """The pure-Python vLLM BlockPool model over pre-parsed requests: (seconds, hit tokens)."""
    from vllm_pool_ref import BlockPool, serve_request  # tests/reference

    reqs = list(
        zip(
            hash_lists(trace),
            trace.input_length.tolist(),
            trace.output_length.tolist(),
            strict=True,
        )
    )
    pool = BlockPool(capacity_blocks)
    start = time.perf_counter()
    hits = sum(serve_request(pool, h, i, o, block_tokens) for h, i, o in reqs)
    return time.perf_counter() - start, hits


def replay_policies() -> list[str]:
    """Built-in policies the replay runner takes (engine-only and hybrid ones excluded)."""
    return [
        name
        for name, cls in registered().items()
        if not cls.requires_engine and cls.structures & {"block", "radix"}
    ]


def engine_rows(trace: Trace, names: list[str], capacity: int, repeat: int) -> None:
    """The engine runner on the trace: compiled and reference requests/s per policy."""
    import numpy as np

    from prefixlab.model.timing import make_timing
    from prefixlab.runner.engine import EngineConfig, simulate

    timing = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.02")
    cfg = EngineConfig(capacity_blocks=capacity, block_tokens=16)
    n = len(trace)
    simulate(trace, "lru", cfg, timing)  # load the compiled kernels
    print(
        f"{'structure':<10}{'policy':<26}{'compiled':<9}{'requests/s':>13}{'x ref':>8}"
        f"{'token hit':>11}  reference requests/s, same results"
    )
    for name in names:
        if "block" not in registered()[name.partition(":")[0]].structures:
            continue
        t_fast = t_ref = float("inf")
        try:
            for _ in range(max(repeat, 1)):
                t0 = time.perf_counter()
                fast = simulate(trace, name, cfg, timing)
                t1 = time.perf_counter()
                ref = simulate(trace, name, cfg, timing, fast=False)
                t2 = time.perf_counter()
                t_fast, t_ref = min(t_fast, t1 - t0), min(t_ref, t2 - t1)
        except Exception as exc:  # a policy that cannot run on this trace says why
            print(f"{'engine':<10}{name:<26}skipped: {exc}")
            continue
        same = all(
            np.array_equal(getattr(fast, f), getattr(ref, f), equal_nan=True)
            for f in ("first_token_s", "finish_s", "hit_tokens", "num_preemptions")
        )
        compiled = _fast.engine_code(make_policy(name)) >= 0
        print(
            f"{'engine':<10}{name:<26}{'yes' if compiled else 'no':<9}{n / t_fast:>13,.0f}"
            f"{t_ref / t_fast:>8.2f}{fast.metrics['token_hit_ratio']:>11.4f}  "
            f"{n / t_ref:,.0f}, {'yes' if same else 'NO'}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-blocks", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="a small trace (about 200k blocks)")
    ap.add_argument("--capacity-fraction", type=float, default=0.02)
    ap.add_argument("--policies", default="", help="comma-separated (default: every one)")
    ap.add_argument("--structures", default="block,radix,engine")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many runs")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args(argv)
    min_blocks = 200_000 if args.quick else args.min_blocks
    trace = make_trace(min_blocks)
    layout = trace.block_layout()
    bt = layout.block_tokens
    num_blocks = int(layout.num_blocks_held.sum())
    capacity = max(int(num_blocks * args.capacity_fraction), int(layout.num_blocks_held.max()))
    print(
        f"trace: {len(trace):,} requests, {num_blocks:,} blocks "
        f"({num_blocks / len(trace):.0f} per request), {layout.num_distinct_keys:,} distinct "
        f"keys; capacity {capacity:,} blocks; numba: "
        f"{'yes' if _fast.HAVE_NUMBA else 'no (install the fast extra)'}"
    )
    ref_s, ref_hits = min(
        (reference_vllm(trace, capacity, bt) for _ in range(args.repeat)), key=lambda x: x[0]
    )
    ref_rate = num_blocks / ref_s
    total_in = int(trace.input_length.sum())
    _fast.warm_up()
    print(
        f"{'structure':<10}{'policy':<26}{'kernel':<9}{'blocks/s':>13}{'x ref':>8}{'token hit':>11}"
    )
    print(
        f"{'block':<10}{'reference (pure Python)':<26}{'-':<9}{ref_rate:>13,.0f}{1.0:>8.2f}"
        f"{ref_hits / total_in:>11.4f}"
    )
    names = [p for p in args.policies.split(",") if p] or replay_policies()
    for structure in args.structures.split(","):
        if structure == "engine":
            engine_rows(trace, names, capacity, args.repeat)
            continue
        for name in names:
            if structure not in registered()[name.partition(":")[0]].structures:
                continue
            try:
                runs = [
                    replay(trace, name, ReplayConfig(capacity_blocks=capacity, structure=structure))
                    for _ in range(args.repeat)
                ]
            except Exception as exc:  # a policy that cannot run on this trace says why
                print(f"{structure:<10}{name:<26}skipped: {exc}")
                continue
            res = min(runs, key=lambda r: r.elapsed_s)
            code = _fast.kernel_code if structure == "block" else radix_code
            kernel = code(make_policy(name)) >= 0
            rate = num_blocks / res.elapsed_s
            print(
                f"{structure:<10}{name:<26}{'yes' if kernel else 'no':<9}{rate:>13,.0f}"
                f"{rate / ref_rate:>8.2f}{res.metrics['token_hit_ratio']:>11.4f}"
            )
    if args.no_peers:
        return 0
    from _peers import run_peers  # benchmarks/_peers.py

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_mooncake(trace, path)
        rows = run_peers(str(path), capacity, bt, repeat=args.repeat)
    notes: dict[str, str] = {}
    for row in rows:
        label = f"{row['peer']} {row['policy']}"
        if row.get("error"):
            print(f"{'peer':<10}{label:<35}unavailable: {row['error']}")
            continue
        notes.setdefault(row["peer"], row["note"])
        rate = row["num_accesses"] / row["seconds"]
        print(
            f"{'peer':<10}{label:<35}{rate:>13,.0f}{rate / ref_rate:>8.2f}{row['hit_ratio']:>11.4f}"
        )
    for peer, note in notes.items():
        print(f"{peer}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
