"""End to end: `prefixlab replay` on a Mooncake-format JSONL trace, from the command line.

Run: ``python benchmarks/load_replay.py`` (``--requests N`` for another size; the default is
the issue's 2M requests, with a quarter of it beside for how time and memory grow;
``--policies`` for others than ``lru``; ``--structure radix`` for the radix tree).

What a user waits for: process start, import, loading, block layout, replay and the
table, for a generated hash-form trace in Mooncake's format (multi-turn sessions whose
contexts grow, 512-token blocks). Each row is one command run as a subprocess (best of
``--repeat``), with its wall time, peak RSS and requests per second; ratios are against
the pure-Python reference measured in the same run: the vLLM ``BlockPool`` model of the
tests (``tests/reference/vllm_pool_ref.py``), which parses each line with ``json.loads``
and replays it (its own end to end). Rows: the default, which streams the file in chunks
(``runner.stream``); ``--no-stream``, which loads it whole (pyarrow's reader, then the
replay); and ``--sample 1.0``, which keeps every request but sends the file through the
line-by-line loader, the path every load took before the columnar one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def write_trace(path: Path, num_requests: int, seed: int = 0) -> None:
    """Sessions of growing contexts: each turn extends its session's ids by 1-5 blocks."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(20.0, num_requests)
    sessions = rng.integers(0, num_requests // 8 + 1, num_requests)
    grow = rng.integers(1, 6, num_requests)
    trim = rng.integers(0, 400, num_requests)
    outs = rng.integers(1, 500, num_requests)
    prefix: dict[int, list[int]] = {}
    next_id = 0
    t = 0.0
    with path.open("w", encoding="utf-8") as fh:
        for i in range(num_requests):
            t += float(gaps[i])
            s = int(sessions[i])
            ids = prefix.get(s, []) + list(range(next_id, next_id + int(grow[i])))
            next_id += int(grow[i])
            prefix[s] = ids[:40]
            row = {
                "timestamp": int(t),
                "input_length": len(ids) * 512 - int(trim[i]),
                "output_length": int(outs[i]),
                "hash_ids": ids,
            }
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")


def run(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (MB) of one subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err}")
    return wall, usage.ru_maxrss // 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2_000_000)
    ap.add_argument("--capacity-blocks", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--policies",
        default="lru",
        help="comma-separated; each gets a streamed and a --no-stream row (opt "
        "streams with its next-use pass)",
    )
    ap.add_argument("--structure", default="block", choices=["block", "radix"])
    args = ap.parse_args(argv)
    base = [
        sys.executable,
        "-m",
        "prefixlab",
        "replay",
        "-f",
        "mooncake",
        "--structure",
        args.structure,
        "--capacity-blocks",
        str(args.capacity_blocks),
    ]
    ref = [
        sys.executable,
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from vllm_pool_ref import replay_mooncake; replay_mooncake(sys.argv[2], "
        "int(sys.argv[3]), 512)",
        str(ROOT / "tests" / "reference"),
    ]
    print(f"{'requests':>10}  {'command':<42}{'wall s':>8}{'req/s':>12}{'x ref':>7}{'peak MB':>9}")
    names = [x for x in args.policies.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp:
        for n in (args.requests // 4, args.requests):
            path = Path(tmp) / f"trace{n}.jsonl"
            write_trace(path, n)
            p = str(path)
            rows = [("reference (pure Python, json.loads)", [*ref, p, str(args.capacity_blocks)])]
            for name in names:
                cmd = [*base, "-p", name, p]
                rows.append((f"prefixlab replay -p {name} (streamed)", cmd))
                rows.append((f"prefixlab replay -p {name} --no-stream", [*cmd, "--no-stream"]))
            if "lru" in names:
                rows.append(
                    (
                        "prefixlab replay -p lru --sample 1.0",
                        [*base, "-p", "lru", p, "--sample", "1.0"],
                    )
                )
            ref_wall = 0.0
            for label, cmd in rows:
                wall, rss = min((run(cmd) for _ in range(args.repeat)), key=lambda x: x[0])
                ref_wall = ref_wall or wall
                print(
                    f"{n:>10,}  {label:<42}{wall:>8.2f}{n / wall:>12,.0f}"
                    f"{ref_wall / wall:>7.2f}{rss:>9,}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
