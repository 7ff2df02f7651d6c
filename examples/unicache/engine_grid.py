"""UniCache and its baselines under the engine runner: hit ratio and QTTFT, 0.5A-0.9A.

The grid of the UniCache paper's evaluation, on prefixlab's mixes #1-#3 (the ``mix``
generator) served on one A100 (85.9 GB):

- models Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B; A = GPU memory left after the
  weights, in 16-token KV blocks of the model (159,126, 43,310 and 33,302 blocks);
- cache budgets 0.5A, 0.7A and 0.9A;
- policies LRU, LFU, FIFO, LeCaR, ARC, WA, UniCache and offline OPT;
- on Llama-3.1-8B also UniCache without stage 2, UniCache-OPT and OPT-online, and the block
  size ablation (8 and 32 tokens per block, 0.7A: LRU, UniCache, UniCache without stage 2,
  OPT).

Requests: 3,000 per mix for the 3B and 8B models; 10,000 for the 1B model, whose A holds
all of a 3,000-request mix (the 10,000-request mixes have 233k-283k distinct blocks). Timing:
the FLOP/bandwidth roofline of each model on the A100 (MFU 0.5) for prefill, a constant
20 ms per decode step. Everything else is the engine's defaults (continuous batching,
chunked prefill, 256 sequences, 8,192 tokens per step, blocks cached while running).

    python examples/unicache/engine_grid.py --run      # the whole grid: about 75 min on 2 cores,
                                                       # writes engine_grid.csv beside this file
    python examples/unicache/engine_grid.py            # tables from engine_grid.csv, and two
                                                       # cells simulated again to show they match

The second form is what CI runs (about 25 s): it prints the tables of the checked-in results
and re-runs two cells (8B, trace #2, 0.5A: LRU and UniCache), which must give the same
numbers bit for bit.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

from prefixlab.experiments.config import resolve_capacity
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine.simulator import EngineConfig, simulate
from prefixlab.workload.generators import GENERATORS

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "engine_grid.csv"
MODELS = {"llama-3.2-1b": 10_000, "llama-3.2-3b": 3000, "llama-3.1-8b": 3000}
BUDGETS = ["0.5A", "0.7A", "0.9A"]
BASELINES = ["lru", "lfu", "fifo", "lecar", "arc", "wa"]
GRID = [*BASELINES, "unicache", "opt"]
EXTRA_8B = ["unicache:stage2=false", "unicache-opt", "opt-online"]
ABLATION = ["lru", "unicache", "unicache:stage2=false", "opt"]
SHORT = {"unicache:stage2=false": "uc-nostage2", "unicache-opt": "uc-opt"}
FIELDS = ["model", "trace", "budget", "block_tokens", "policy", "capacity_blocks",
          "num_requests", "token_hit_ratio", "mean_qttft_s", "p95_qttft_s",
          "mean_ttft_s"]  # fmt: skip


class Cell(NamedTuple):
    model: str
    trace: int
    budget: str
    block_tokens: int
    policy: str


def cells() -> list[Cell]:
    """Every cell of the grid, the slow 1B model first so two workers stay busy."""
    out: list[Cell] = []
    for model in MODELS:
        for t in (1, 2, 3):
            for b in BUDGETS:
                extra = EXTRA_8B if model == "llama-3.1-8b" else []
                out += [Cell(model, t, b, 16, p) for p in [*GRID, *extra]]
                if model == "llama-3.1-8b" and b == "0.7A":
                    out += [Cell(model, t, b, bt, p) for bt in (8, 32) for p in ABLATION]
    return out


def run_cell(c: Cell) -> dict[str, str]:
    """Simulate one cell and return its CSV row (numbers as repr strings: exact)."""
    trace = GENERATORS["mix"].fn(trace=c.trace, num_requests=MODELS[c.model])
    ws = trace.block_layout(c.block_tokens).num_distinct_keys
    cap = resolve_capacity(c.budget, working_set_blocks=ws, block_tokens=c.block_tokens,
                           model=c.model, gpu="a100")  # fmt: skip
    timing = make_timing(["roofline", "tpot:s=0.02"], model=c.model, gpu="a100")
    config = EngineConfig(capacity_blocks=cap, block_tokens=c.block_tokens)
    m = simulate(trace, c.policy, config, timing).metrics
    row = {**c._asdict(), "capacity_blocks": cap, "num_requests": len(trace)}
    row.update({k: m[k] for k in FIELDS[7:]})
    return {k: repr(v) if isinstance(v, float) else str(v) for k, v in row.items()}


def key(row: dict[str, str]) -> Cell:
    return Cell(row["model"], int(row["trace"]), row["budget"], int(row["block_tokens"]),
                row["policy"])  # fmt: skip


def load() -> dict[Cell, dict[str, str]]:
    if not RESULTS.is_file():
        return {}
    with RESULTS.open() as f:
        return {key(r): r for r in csv.DictReader(f)}


def run_grid(workers: int) -> None:
    """Run the missing cells, appending each row as it finishes (a rerun resumes)."""
    done = load()
    todo = [c for c in cells() if c not in done]
    new = not RESULTS.is_file()
    with RESULTS.open("a", newline="") as f, ProcessPoolExecutor(workers) as pool:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        for i, row in enumerate(pool.map(run_cell, todo), 1):
            w.writerow(row)
            f.flush()
            print(
                f"[{i}/{len(todo)}] {' '.join(row[k] for k in FIELDS[:5])} "
                f"hit {float(row['token_hit_ratio']):.3f}",
                file=sys.stderr,
                flush=True,
            )


def value(rows: dict[Cell, dict[str, str]], c: Cell, field: str) -> float:
    return float(rows[c][field])


def grid_tables(rows: dict[Cell, dict[str, str]]) -> None:
    """Hit ratio and mean QTTFT per model, trace and budget; UniCache's margin and wins."""
    wins = total = 0
    for model in MODELS:
        policies = GRID + (EXTRA_8B if model == "llama-3.1-8b" else [])
        names = [SHORT.get(p, p) for p in policies]
        for field, label, fmt in (("token_hit_ratio", "token hit ratio", "{:.3f}"),
                                  ("mean_qttft_s", "mean QTTFT (s)", "{:.3f}")):  # fmt: skip
            print(f"\n{model} ({MODELS[model]:,} requests per mix): {label}")
            tail = "  margin  to OPT" if field == "token_hit_ratio" else ""
            print(f"{'':>14} " + " ".join(f"{n:>11}" for n in names) + tail)
            for t in (1, 2, 3):
                for b in BUDGETS:
                    cs = [Cell(model, t, b, 16, p) for p in policies]
                    v = [value(rows, c, field) for c in cs]
                    cap = int(rows[cs[0]]["capacity_blocks"])
                    line = f"{f'#{t} {b} {cap:,}':>14} " + " ".join(
                        f"{fmt.format(x):>11}" for x in v
                    )
                    if field == "token_hit_ratio":
                        hr = dict(zip(policies, v, strict=True))
                        best = max(hr[p] for p in BASELINES)
                        wins += hr["unicache"] >= best
                        total += 1
                        line += f"  {hr['unicache'] - best:+.3f}  {hr['unicache'] - hr['opt']:+.3f}"
                    print(line)
    print(f"\nunicache >= every online baseline (hit ratio) in {wins} of {total} cells")
    print(f"unicache's mean QTTFT <= every online baseline's in {qttft_wins(rows)} of {total}")
    cs = [(Cell("llama-3.1-8b", t, b, 16, "unicache"), Cell("llama-3.1-8b", t, b, 16,
          "unicache:stage2=false")) for t in (1, 2, 3) for b in BUDGETS]  # fmt: skip
    better = sum(value(rows, a, "token_hit_ratio") > value(rows, n, "token_hit_ratio")
                 for a, n in cs)  # fmt: skip
    print(f"llama-3.1-8b: unicache better than without stage 2 in {better} of {len(cs)} cells")


def qttft_wins(rows: dict[Cell, dict[str, str]]) -> int:
    """Cells where UniCache's mean QTTFT is at most the best online baseline's."""
    out = 0
    for model in MODELS:
        for t in (1, 2, 3):
            for b in BUDGETS:
                q = {p: value(rows, Cell(model, t, b, 16, p), "mean_qttft_s") for p in GRID}
                out += q["unicache"] <= min(q[p] for p in BASELINES)
    return out


def ablation_table(rows: dict[Cell, dict[str, str]]) -> None:
    print("\nllama-3.1-8b, 0.7A: block size ablation (token hit ratio)")
    print(f"{'':>14} " + " ".join(f"{SHORT.get(p, p):>11}" for p in ABLATION))
    for t in (1, 2, 3):
        for bt in (8, 16, 32):
            cs = [Cell("llama-3.1-8b", t, "0.7A", bt, p) for p in ABLATION]
            cap = int(rows[cs[0]]["capacity_blocks"])
            print(
                f"{f'#{t} {bt} tok {cap:,}':>14} "
                + " ".join(f"{value(rows, c, 'token_hit_ratio'):>11.3f}" for c in cs)
            )


def recheck(rows: dict[Cell, dict[str, str]]) -> None:
    """Simulate two cells again: the checked-in numbers must come back exactly."""
    print("\nrecomputed (llama-3.1-8b, #2, 0.5A):")
    for p in ("lru", "unicache"):
        c = Cell("llama-3.1-8b", 2, "0.5A", 16, p)
        row = run_cell(c)
        same = all(row[k] == rows[c][k] for k in FIELDS)
        print(
            f"  {p:<9} hit {float(row['token_hit_ratio']):.6f} "
            f"QTTFT {float(row['mean_qttft_s']):.6f}  {'same' if same else 'DIFFERENT'}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="simulate the missing cells first")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    if args.run:
        run_grid(args.workers)
    rows = load()
    missing = [c for c in cells() if c not in rows]
    if missing:
        sys.exit(f"{len(missing)} cells missing from {RESULTS}; run with --run")
    grid_tables(rows)
    ablation_table(rows)
    recheck(rows)


if __name__ == "__main__":
    main()
