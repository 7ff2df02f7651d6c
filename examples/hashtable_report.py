"""The hash-table prefix-caching report's experiment, reproduced with prefixlab.

1. Hit ratio vs the pool probability p (0.1 to 1.0): 1000 requests, each repeating one of
   10 frequent 15-token prompts with probability p, else a fresh random prompt. The cache
   keeps a prompt's trailing partial block (the report's hash table caches whole prompts),
   nothing is forcibly recomputed, and the policy is the report's (oldest last access
   first, longest prefix first among ties). Expected: p minus the 10 cold misses / 1000.
2. Simulated serving throughput with and without prefix caching (engine runner,
   Llama-3.1-8B on an H100, UniCache's fitted prefill power law, 20 ms per decode step),
   all 1000 requests arriving within about a second. vLLM caches full blocks only, so a
   15-token prompt never hits a 16-token block; this part uses 2048-token prompts.

Run: python examples/hashtable_report.py  (about 10 s on 2 cores; output checked in CI)
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefixlab.experiments import parse_config, read_table, run_sweep

P_VALUES = [round(0.1 * i, 1) for i in range(1, 11)]

HIT_RATIO = {
    "name": "hashtable-hit-ratio",
    "workload": {
        "source": "gen:random-pool",
        "params": {"num_requests": 1000, "pool_size": 10, "prompt_tokens": 15, "output_ids": False},
        "vary": {"p": P_VALUES},
    },
    "cache": {
        "block_tokens": 16,
        "capacities": [64],
        "cache_partial": True,
        "min_recompute_tokens": 0,
    },
    "policies": ["hashtable", "lru"],
}

THROUGHPUT = {
    "name": "hashtable-throughput",
    "workload": {
        "source": "gen:random-pool",
        "params": {
            "num_requests": 1000,
            "prompt_tokens": 2048,
            "output_tokens": 16,
            "request_rate_per_s": 1000.0,
        },
        "vary": {"p": [0.1, 0.5, 0.9]},
    },
    "model": {
        "name": "llama-3.1-8b",
        "gpu": "h100",
        "timing": ["power:preset=llama-3.1-8b-h100", "tpot:s=0.02"],
    },
    "cache": {"block_tokens": 16, "capacities": ["0.5A"]},
    "runner": {"kind": "engine"},
    "policies": ["hashtable"],
}


def run(config: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    run_sweep(parse_config(config), folder, jobs=2)
    rows: list[dict[str, Any]] = read_table(folder).to_pylist()
    return rows


def pooled_requests(folder: Path) -> dict[str, int]:
    """Requests that drew a pooled prompt, per p (the breakdown table's task 'pool')."""
    rows = read_table(folder, "breakdown").to_pylist()
    pool = [r for r in rows if r["dimension"] == "task" and r["group"] == "pool"]
    return {r["variant"]: r["num_requests"] for r in pool if r["policy"] == "lru"}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(HIT_RATIO, Path(tmp) / "hit")
        pooled = pooled_requests(Path(tmp) / "hit")
        print("1. Token hit ratio vs pool probability p (1000 requests, 64-block cache)")
        print("   bound = (pooled requests - 10 first sightings) / 1000: an unbounded cache")
        print(f"{'p':>5} {'pooled':>7} {'bound':>6} {'hashtable':>10} {'lru':>7}")
        by = {(r["variant"], r["policy"]): r for r in rows}
        for p in P_VALUES:
            v = f"p={p}"
            bound = (pooled[v] - 10) / 1000
            ht, lru = by[(v, "hashtable")], by[(v, "lru")]
            print(
                f"{p:5.1f} {pooled[v]:7d} {bound:6.3f} {ht['token_hit_ratio']:10.3f} "
                f"{lru['token_hit_ratio']:7.3f}"
            )
        print()
        print("2. Serving throughput with and without prefix caching (2048-token prompts)")
        print(
            f"{'p':>5} {'caching':>8} {'hit':>6} {'makespan s':>11} {'tok/s':>9} "
            f"{'mean TTFT s':>12} {'speed-up':>9}"
        )
        results = {}
        for caching in (True, False):
            cfg = {**THROUGHPUT, "runner": {"kind": "engine", "prefix_caching": caching}}
            for r in run(cfg, Path(tmp) / f"thr-{caching}"):
                results[(r["variant"], caching)] = r
        for p in (0.1, 0.5, 0.9):
            base = results[(f"p={p}", False)]["total_throughput_tokens_per_s"]
            for caching in (True, False):
                r = results[(f"p={p}", caching)]
                tput = r["total_throughput_tokens_per_s"]
                print(
                    f"{p:5.1f} {'on' if caching else 'off':>8} {r['token_hit_ratio']:6.3f} "
                    f"{r['makespan_s']:11.2f} {tput:9,.0f} {r['mean_ttft_s']:12.4f} "
                    f"{tput / base:8.2f}x"
                )


if __name__ == "__main__":  # the sweep's worker processes import this file
    main()
