"""The hash-table prefix-caching report (``../shared/papers/hashtable-prefix-caching.md``):
its hit-rate experiment (Sec. 3.1-3.2, Fig. 1).

The report's setup (Sec. 3.1): 1,000 requests; each, with probability ``p``, repeats a
prompt from "a pool of frequent sequences", else is "a random request with length 15".
Blocks are keyed by ``hash(prefix, own)``; a sequence's trailing partial block is cached
too, and "a partial block gets longer" as tokens are generated, so it is re-keyed (Sec. 2).
Freed blocks wait in a pool of at most K blocks, evicted oldest first, longest prefix first
among ties (Sec. 2). Not in the report: the pool's size and prompt lengths, the block size,
K, the output length. Ours: 10 pooled prompts of 15 tokens, 16-token blocks, a 64-block
cache, 16 output tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prefixlab.reproduce.base import Claim, Outcome, Reproduction, Row, Scale, num, register

if TYPE_CHECKING:
    from matplotlib.figure import Figure

P_VALUES = tuple(round(0.1 * i, 1) for i in range(1, 11))


@register("hashtable-report")
class HashtableReport(Reproduction):
    paper = "Hash-table prefix caching (hashtable-prefix-caching.md)"
    target = "Sec. 3.2, Fig. 1"
    title = "Hit rate against the probability p of a pooled prompt"

    def run(self, scale: Scale) -> Outcome:
        from prefixlab.runner.replay import ReplayConfig, replay
        from prefixlab.workload.generators import GENERATORS

        n = 1000 if scale == "paper" else 300
        cfg = ReplayConfig(
            capacity_blocks=64, block_tokens=16, cache_partial=True, min_recompute_tokens=0
        )
        table: list[Row] = []
        for p in P_VALUES:
            row: Row = {"p": p}
            for label, output_ids in (("prompt_only", False), ("rekeyed_by_outputs", True)):
                trace = GENERATORS["random-pool"].fn(
                    num_requests=n,
                    p=p,
                    pool_size=10,
                    prompt_tokens=15,
                    output_ids=output_ids,
                    seed=0,
                )
                pooled = int(sum(t == "pool" for t in trace.task))
                row["pooled_share"] = pooled / n
                row[label] = float(replay(trace, "hashtable", cfg).metrics["token_hit_ratio"])
            table.append(row)
        notes = [
            f"{n:,} requests of `gen:random-pool` (10 pooled prompts, 15 tokens, seed 0) per "
            "p; replay, policy `hashtable`, 16-token blocks, 64-block cache, trailing partial "
            "blocks cached, no token forcibly recomputed.",
            "prompt_only: the partial block holds the prompt alone (outputs as lengths); "
            "rekeyed_by_outputs: the generated tokens extend the partial block and re-key "
            "it, as the report's implementation does, so a repeated prompt no longer "
            "matches it.",
        ]
        return Outcome(table, _claims(table), _draw, notes)


def _claims(rows: list[Row]) -> list[Claim]:
    p = np.array([num(r["p"]) for r in rows])
    hit = np.array([num(r["prompt_only"]) for r in rows])
    slope, icpt = np.polyfit(p, hit, 1)
    r2 = 1 - float(((hit - (slope * p + icpt)) ** 2).sum()) / float(((hit - hit.mean()) ** 2).sum())
    rekey = max(num(r["rekeyed_by_outputs"]) for r in rows)
    return [
        Claim(
            "hit rate against p",
            "Sec. 3.2, Fig. 1",
            "increases almost linearly with respect to probability",
            f"prompt_only: slope {slope:.3f}, R^2 {r2:.4f}",
            "agree" if r2 > 0.98 else "differ",
            "" if r2 > 0.98 else "cold misses of the pooled prompts bend the low end",
        ),
        Claim(
            "hit rate when outputs re-key the partial block",
            "Sec. 3.2",
            "8.14% for the repeated 'What is your name?': \"the generated sequences are "
            'different even though they have the same prompt tokens"',
            f"at most {rekey:.1%} over p",
            "n/a",
            "a 15-token prompt fits one 16-token block, which the outputs re-key, so no "
            "repeat of it can match; the report's 8.14% counts hits its text does not "
            'define ("counted only once for the initial prompt")',
        ),
        Claim(
            "throughput with prefix caching",
            "Sec. 3.3, Fig. 2",
            "459.22 against 416.92 items/s (+10.1%) for the repeated prompt",
            "not timed",
            "n/a",
            "the report's GPU and engine are not given; examples/hashtable_report.py "
            "times a longer-prompt variant on the engine runner",
        ),
    ]


def _draw(fig: Figure, rows: list[Row]) -> None:
    ax = fig.subplots()
    p = [num(r["p"]) for r in rows]
    ax.plot(p, [num(r["pooled_share"]) for r in rows], ":", color="grey", label="pooled share")
    ax.plot(p, [num(r["prompt_only"]) for r in rows], "o-", label="hash table (prompt blocks)")
    ax.plot(
        p,
        [num(r["rekeyed_by_outputs"]) for r in rows],
        "s--",
        label="partial block re-keyed by outputs",
    )
    ax.set_xlabel("probability p of a pooled prompt")
    ax.set_ylabel("token hit rate")
    ax.set_title("Hit rate vs p (the report's Fig. 1)")
    ax.legend(fontsize="small")
