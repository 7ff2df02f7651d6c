"""LPC on the LPC workload: does a learned continuation predictor beat recency?

1. Train the predictor (hashed n-gram embedder, 3-layer MLP) on one half of the
   conversations of a text-bearing LPC workload and evaluate it on the other half:
   MCC and macro-F1 against the turns-only ablation.
2. Replay 20 simulated minutes of a fresh LPC workload (lambda_chat 100 s between a
   conversation's turns, at most N_conv = 200 conversations active, another seed) through
   a block cache at six sizes, under LRU, LPC and LPC-oracle (the true labels), and report
   the cache size LPC saves at equal hit ratio and how much of the LRU-to-oracle gap it
   closes.

Run: python examples/lpc/lpc_workload.py  (about half a minute on 2 cores; output checked
in CI)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from prefixlab.learn.predictor import TrainConfig, evaluate, train
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import GENERATORS

FRACTIONS = (0.03, 0.05, 0.1, 0.15, 0.2, 0.3)


def size_for(hit: float, sizes: list[int], hits: list[float]) -> float:
    """Cache size a policy needs for ``hit``, by linear interpolation on its curve."""
    curve = np.maximum.accumulate(np.array(hits))
    if hit <= curve[0]:
        return sizes[0] * hit / curve[0]
    if hit > curve[-1]:
        return float("nan")
    return float(np.interp(hit, curve, np.array(sizes, dtype=float)))


def main() -> None:
    train_trace = GENERATORS["lpc"].fn(num_conversations=2000, seed=0)
    pred, mask = train(train_trace, TrainConfig(epochs=10))
    ev = evaluate(pred, train_trace, mask)
    print("1. Continuation predictor (held-out half of 2,000 conversations)")
    print(f"   MCC {ev.mcc:.3f}  macro-F1 {ev.f1_macro:.3f}  turns-only MCC "
          f"{ev.turns_only_mcc:.3f}  ({ev.num_examples:,} requests)")  # fmt: skip

    full = GENERATORS["lpc"].fn(num_conversations=3000, seed=11, lambda_chat=100.0, n_conv=200)
    trace = full.take(np.flatnonzero(full.arrival_s < 1200.0))  # 20 simulated minutes
    ws = trace.block_layout(16).num_distinct_keys
    tokens = int(trace.input_length.sum())
    print(f"\n2. LPC workload, 20 minutes: {len(trace):,} requests, {tokens:,} input tokens, "
          f"{ws:,} distinct 16-token blocks")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        model = str(pred.save(Path(tmp) / "lpc").with_suffix(""))
        sizes = [int(f * ws) for f in FRACTIONS]
        curves: dict[str, list[float]] = {"lru": [], "lpc": [], "lpc-oracle": []}
        for size in sizes:
            cfg = ReplayConfig(capacity_blocks=size, block_tokens=16)
            for name, spec in (("lru", "lru"), ("lpc", f"lpc:model={model}"),
                               ("lpc-oracle", "lpc-oracle")):  # fmt: skip
                curves[name].append(float(replay(trace, spec, cfg).metrics["token_hit_ratio"]))
    print(f"   {'blocks':>7} {'lru':>7} {'lpc':>7} {'oracle':>7} {'LPC size for LRU hit':>21} "
          f"{'gap closed':>11}")  # fmt: skip
    for i, size in enumerate(sizes):
        lru, lpc, orc = (curves[k][i] for k in ("lru", "lpc", "lpc-oracle"))
        need = size_for(lru, sizes, curves["lpc"])
        saving = 1 - need / size
        gap = (lpc - lru) / (orc - lru) if orc > lru else float("nan")
        print(f"   {size:7,} {lru:7.3f} {lpc:7.3f} {orc:7.3f} {need:10,.0f} ({saving:+6.1%}) "
              f"{gap:10.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
