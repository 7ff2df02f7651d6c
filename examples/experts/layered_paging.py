"""Expert caching as l-layer paging: the checks and figures of docs/experts.md.

1. The theorems on their adversarial sequences (Theorem 3.3's cycle, Theorem 3.1's instance).
2. Llama-MoE-like (n=16 experts, l=32 layers, top-4) and Mixtral-like (n=8, l=32, top-2)
   synthetic traces at k = 200: faults of every policy, mean over 5 seeds; with b = 1 (the
   setting chosen first) and with classic Zipf, b = 0 (added afterwards, see docs).
3. Faults / OPT against the Zipf exponent a (Llama-MoE-like, k = 200).
4. OPT-dist / OPT and LLRU / LRU over n and l (k = 40% of the n x l pages), through the
   sweep layer (results folder, then figures from the saved results only).
5. Layers unlike each other: the Zipf exponent varies by layer (``a_spread``), added after
   the first results to show when fixed per-layer shares hurt (see docs/experts.md).

Synthetic traces: the ``zipf`` generator with p_j ~ 1/(j+1)^a (b = 1), a = 1 unless varied,
each layer its own random popularity order, temporal reuse r = 0.5 (a token keeps the
previous token's expert at a layer with probability 0.5), 2,000 tokens. These parameters
were fixed before the first run and not changed after.

Run: python examples/experts/layered_paging.py [--figures DIR]   (about 10 s; output checked in CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from prefixlab.experts import generate, simulate, sweep_capacities
from prefixlab.experts.config import parse_sweep_config
from prefixlab.experts.report import load_expert_results, make_expert_figures
from prefixlab.experts.sweep import run_expert_sweep
from prefixlab.report.plots import write_figures

POLICIES = ["lru", "fifo", "lfu", "marking", "lru-dist", "llru", "opt-dist", "opt"]
SEEDS = range(5)
BASE = {"num_tokens": 2000, "a": 1.0, "b": 1.0, "r": 0.5}


def theorems() -> None:
    print("1. Theorems")
    t = generate("thm33", k=31, l=4, num_cycles=50)  # n = 8 experts per layer, 32 pages
    lru = simulate(t, capacity=31, policy="lru").num_faults
    opt = simulate(t, capacity=31, policy="opt").num_faults
    warm = opt - 32  # the first use of each of the k + 1 = 32 pages
    print(
        f"  Theorem 3.3 (k=31, l=4, n=8, {t.num_requests:,} requests): LRU faults "
        f"{lru:,} (every request: {lru == t.num_requests}); OPT {opt:,}: 32 first uses, "
        f"then {warm} in {t.num_requests - 32:,} requests "
        f"(1 per {(t.num_requests - 32) / warm:.1f})"
    )
    for rounds in (100, 1000):
        t = generate("thm31", k=8, l=4, num_rounds=rounds)
        f = {
            p: simulate(t, capacity=8, policy=p).num_faults
            for p in ("lru-dist", "opt-dist", "opt", "llru")
        }
        print(
            f"  Theorem 3.1 (k=8, l=4, {rounds:>4} rounds): "
            + ", ".join(f"{p} {n:,}" for p, n in f.items())
        )


def mean_faults(params: dict[str, float | int], capacity: int) -> dict[str, float]:
    out = dict.fromkeys(POLICIES, 0.0)
    for seed in SEEDS:
        trace = generate("zipf", **params, seed=seed)
        for row in sweep_capacities(trace, [capacity], POLICIES, seed=seed):
            out[str(row["spec"])] += float(str(row["num_faults"])) / len(SEEDS)
    return out


def models() -> None:
    print("\n2. k = 200, mean faults over 5 seeds (2,000 tokens)")
    print(f"{'':>27} " + " ".join(f"{p:>9}" for p in POLICIES) + "  llru/lru  llru/dist")
    llama = {"num_experts": 16, "num_layers": 32, "top_k": 4}
    mixtral = {"num_experts": 8, "num_layers": 32, "top_k": 2}
    shapes = (("Llama-MoE (16x32, top4)", llama), ("Mixtral (8x32, top2)", mixtral))
    for b in (1.0, 0.0):
        for name, shape in shapes:
            f = mean_faults({**BASE, "b": b, **shape}, 200)
            cells = " ".join(f"{f[p]:>9,.0f}" for p in POLICIES)
            ratios = f"{f['llru'] / f['lru']:>8.3f}  {f['llru'] / f['lru-dist']:>9.3f}"
            print(f"{name + f' b={b:g}':>27} {cells}  {ratios}")


def zipf_sweep() -> None:
    print("\n3. Faults / OPT against Zipf a (Llama-MoE-like, k = 200, mean over 5 seeds)")
    print(f"{'a':>6} " + " ".join(f"{p:>9}" for p in POLICIES))
    for a in (0.5, 0.8, 1.0, 1.2, 1.5, 2.0):
        f = mean_faults({**BASE, "a": a, "num_experts": 16, "num_layers": 32, "top_k": 4}, 200)
        print(f"{a:>6} " + " ".join(f"{f[p] / f['opt']:>9.3f}" for p in POLICIES))


def heterogeneity() -> None:
    print("\n5. Layers unlike each other (k = 200, b = 1, mean over 5 seeds): layer j's Zipf")
    print("   exponent is 1 + a_spread * u_j, u_j uniform in [-1, 1] (clipped at 0)")
    print(f"{'':>27} {'opt-dist/opt':>12} {'llru/lru':>9} {'llru/dist':>10} {'lru-dist/lru':>12}")
    shapes = (
        ("Llama-MoE", {"num_experts": 16, "num_layers": 32, "top_k": 4}),
        ("Mixtral", {"num_experts": 8, "num_layers": 32, "top_k": 2}),
    )
    for name, shape in shapes:
        for spread in (0.0, 0.5, 1.0, 2.0, 4.0):
            f = mean_faults({**BASE, **shape, "a_spread": spread}, 200)
            print(
                f"{f'{name} a_spread={spread:g}':>27} {f['opt-dist'] / f['opt']:>12.3f}"
                f" {f['llru'] / f['lru']:>9.3f} {f['llru'] / f['lru-dist']:>10.3f}"
                f" {f['lru-dist'] / f['lru']:>12.3f}"
            )


def grid(figures: Path | None) -> None:
    print("\n4. Over n and l (k = 0.4 n l, 1,000 tokens, seeds 0-1), via a results folder")
    cfg = parse_sweep_config(
        {
            "name": "experts-n-l",
            "workload": {
                "trace": "gen:zipf",
                "params": {"num_tokens": 1000, "a": 1.0, "b": 1.0, "r": 0.5},
                "vary": {"num_experts": [4, 8, 16, 32, 64], "num_layers": [8, 16, 32]},
            },
            "cache": {"capacities": ["0.4nl"], "policies": ["lru", "llru", "opt-dist", "opt"]},
            "seeds": [0, 1],
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_expert_sweep(cfg, tmp)
        res = load_expert_results(tmp)
        for title, ratio in (
            ("OPT-dist / OPT", lambda w: res.mean("fault_ratio_to_opt", **w, policy="opt-dist")),
            (
                "LLRU / LRU",
                lambda w: (
                    res.mean("num_faults", **w, policy="llru")
                    / res.mean("num_faults", **w, policy="lru")
                ),
            ),
        ):
            print(f"{title:>14} " + " ".join(f"{'l=' + str(x):>7}" for x in cfg.vary["num_layers"]))
            for n in cfg.vary["num_experts"]:
                vals = [ratio({"num_experts": n, "num_layers": x}) for x in cfg.vary["num_layers"]]
                print(f"{'n=' + str(n):>14} " + " ".join(f"{v:>7.3f}" for v in vals))
        if figures is not None:
            figures.mkdir(parents=True, exist_ok=True)
            for path in write_figures(make_expert_figures(res), figures):
                print(f"  figure: {path.name}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--figures", type=Path, help="also write the sweep's figures here")
    args = ap.parse_args()
    theorems()
    models()
    zipf_sweep()
    grid(args.figures)
    heterogeneity()


if __name__ == "__main__":
    main()
