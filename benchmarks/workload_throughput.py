"""Workload throughput: tokenising and loading, each against a naive baseline in the same run.

Run: ``python benchmarks/workload_throughput.py`` (``--quick`` for a smaller input).

1. **Tokenising conversations.** The texts are every message of the shared SWE-agent
   trajectories, repeated to ``--copies`` copies with a copy number in each text (so nothing
   is cached between copies). prefixlab's adapter encodes them with one batch call; the
   baseline encodes the same texts with the same quicktok encoder in a Python loop, one
   ``encode`` per text, and builds the flat array from the lists (what a loader without a
   batch API does). Reported as MB of text per second and tokens per second.
2. **Loading a trace.** The shared Mooncake trace converted to native JSONL, loaded with
   ``load_trace`` (streamed into typed columns); the baseline reads the whole file, parses
   every line with ``json.loads`` into one list, then builds the same trace from Python
   ``Request`` objects. Reported as requests per second.

Each figure is the best of ``--repeat`` runs; ratios are against the baseline of the same
run. Both sides produce identical token ids / traces (checked before timing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from prefixlab.workload.loaders import load_trace
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.tokenizers import get_tokenizer
from prefixlab.workload.trace import Request, Trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def swe_agent_texts(copies: int) -> list[str]:
    texts: list[str] = []
    for path in sorted((SHARED / "swe_agent").glob("*.traj")):
        for msg in json.loads(path.read_text())["history"]:
            if isinstance(msg.get("content"), str):
                texts.append(msg["content"])
    return [f"[copy {c}] {t}" for c in range(copies) for t in texts]


def bench_tokenize(copies: int, repeat: int) -> None:
    texts = swe_agent_texts(copies)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    tok = get_tokenizer("llama3")
    enc = tok._enc  # type: ignore[attr-defined]

    def naive() -> tuple[np.ndarray, np.ndarray]:
        lists = [enc.encode_ordinary(t) for t in texts]
        offs = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in lists], out=offs[1:])
        return np.fromiter((i for x in lists for i in x), np.int64, int(offs[-1])), offs

    ids, offs = tok.encode_batch(texts)
    nids, noffs = naive()
    assert np.array_equal(ids, nids) and np.array_equal(offs, noffs)
    t_naive = _best(naive, repeat)
    t_batch = _best(lambda: tok.encode_batch(texts), repeat)
    n_tok = int(offs[-1])
    print(f"tokenise: {len(texts):,} texts, {megabytes:.1f} MB, {n_tok:,} llama3 tokens")
    print(f"{'method':<34}{'MB/s':>10}{'tokens/s':>14}{'x naive':>10}")
    for name, t in (("naive: encode() per text", t_naive), ("prefixlab encode_batch", t_batch)):
        print(f"{name:<34}{megabytes / t:>10.1f}{n_tok / t:>14,.0f}{t_naive / t:>10.2f}")


def naive_load(path: Path) -> Trace:
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    objs = [json.loads(line) for line in lines[1:] if line.strip()]
    requests = [
        Request(
            arrival_s=o.get("arrival_s", 0.0),
            input_length=o["input_length"],
            output_length=o["output_length"],
            hash_ids=o["hash_ids"],
            hashed_tokens=o.get("hashed_tokens"),
        )
        for o in objs
    ]
    return Trace.from_requests(requests, block_tokens=header["block_tokens"])


def bench_load(limit: int | None, repeat: int) -> None:
    source = load_trace(SHARED / "mooncake" / "conversation_trace.jsonl", "mooncake", limit=limit)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mooncake.jsonl"
        write_native(source, path)
        a, b = load_trace(path), naive_load(path)
        assert all(x == y for x, y in zip(a, b, strict=True))
        t_naive = _best(lambda: naive_load(path), repeat)
        t_ours = _best(lambda: load_trace(path), repeat)
        size = path.stat().st_size / 1e6
    n = len(source)
    print(f"\nload: Mooncake as native JSONL, {n:,} requests, {size:.1f} MB")
    print(f"{'method':<34}{'requests/s':>14}{'x naive':>10}")
    rows = (("naive: json.loads all, then build", t_naive), ("prefixlab load_trace", t_ours))
    for name, t in rows:
        print(f"{name:<34}{n / t:>14,.0f}{t_naive / t:>10.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--copies", type=int, default=20)
    args = ap.parse_args()
    if not SHARED.is_dir():
        print(f"shared data not found at {SHARED}", file=sys.stderr)
        return 1
    bench_tokenize(2 if args.quick else args.copies, args.repeat)
    bench_load(2000 if args.quick else None, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
