"""UniCache and its baselines on UniCache's heterogeneous mixes #1-#3 (replay, hit ratios).

Workloads: the ``mix`` generator, 1,000 requests each (trace #1 ~80% multi-turn chat and
agentic sessions, #2 50%, #3 ~20%; the rest single-turn untemplated, programming, tool-use
and document-QA tasks). 16-token blocks; capacities 10%, 30% of each trace's
distinct blocks. Policies: LRU, LFU, FIFO, ARC, LeCaR, WA (the UniCache paper's: LRU
within each task) and the ATC'25 WA, UniCache and UniCache without stage 2 (each queue
evicts in proportion), and offline OPT.

For each trace and capacity the table gives the token hit ratio of every policy, then
UniCache's margin over the best online baseline and its distance to OPT. Then the block-size
ablation: LRU, UniCache with and without stage 2, and OPT at 8, 16 and 32 tokens per block
on trace #2 (10% capacity).

Run: python examples/unicache/mixes.py  (about 3 minutes on 2 cores; output checked in CI)
"""

from __future__ import annotations

from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Trace

BASELINES = ["lru", "lfu", "fifo", "arc", "lecar", "wa", "wa-atc25"]
OURS = ["unicache", "unicache:stage2=false"]
SHORT = {"unicache:stage2=false": "uc-nostage2", "unicache": "unicache"}
FRACTIONS = [0.1, 0.3]


def hit_ratios(
    trace: Trace, capacity: int, block_tokens: int, policies: list[str] | None = None
) -> dict[str, float]:
    config = ReplayConfig(capacity_blocks=capacity, block_tokens=block_tokens)
    return {
        p: float(replay(trace, p, config).metrics["token_hit_ratio"])
        for p in policies or [*BASELINES, *OURS, "opt"]
    }


def table(rows: list[tuple[str, dict[str, float]]]) -> None:
    names = [SHORT.get(p, p) for p in [*BASELINES, *OURS, "opt"]]
    print(f"{'':>14} " + " ".join(f"{n:>11}" for n in names) + "  margin  to OPT")
    for label, hr in rows:
        best = max(hr[p] for p in BASELINES)
        cells = " ".join(f"{hr[p]:>11.3f}" for p in [*BASELINES, *OURS, "opt"])
        print(
            f"{label:>14} {cells}  {hr['unicache'] - best:+.3f}  {hr['unicache'] - hr['opt']:+.3f}"
        )


def main() -> None:
    print("1. Token hit ratio by trace and capacity (fraction of distinct blocks)")
    wins = total = 0
    stage2 = 0
    for t in (1, 2, 3):
        trace = GENERATORS["mix"].fn(trace=t, num_requests=1000)
        ws = trace.block_layout(16).num_distinct_keys
        rows = []
        for f in FRACTIONS:
            cap = int(ws * f)
            hr = hit_ratios(trace, cap, 16)
            rows.append((f"#{t} {f:.0%} {cap:,}", hr))
            wins += hr["unicache"] >= max(hr[p] for p in BASELINES)
            stage2 += hr["unicache"] > hr["unicache:stage2=false"]
            total += 1
        table(rows)
    print(
        f"\nunicache >= every online baseline in {wins} of {total} cells; "
        f"better than without stage 2 in {stage2} of {total}"
    )

    print("\n2. Block size ablation (trace #2, 10% of its distinct blocks)")
    trace = GENERATORS["mix"].fn(trace=2, num_requests=1000)
    ablation = ["lru", *OURS, "opt"]
    print(f"{'':>14} " + " ".join(f"{SHORT.get(p, p):>11}" for p in ablation))
    for bt in (8, 16, 32):
        cap = int(trace.block_layout(bt).num_distinct_keys * 0.1)
        hr = hit_ratios(trace, cap, bt, ablation)
        print(f"{f'{bt} tok {cap:,}':>14} " + " ".join(f"{hr[p]:>11.3f}" for p in ablation))


if __name__ == "__main__":
    main()
