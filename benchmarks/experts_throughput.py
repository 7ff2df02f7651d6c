"""Expert-cache simulation throughput: simulated requests per second of each policy.

Run: ``python benchmarks/experts_throughput.py`` (``--quick`` for 1M requests instead of 10M).

The trace is Llama-MoE-shaped: 32 layers x 16 experts, Zipf a = 1 (b = 1), temporal reuse
0.5, top-1, 312,500 tokens = 10M requests; the cache holds k = 200 experts. Each policy runs
on the compiled path (numba, the ``fast`` extra) over the whole trace, and on the pure
Python path over its first 1M requests (100k with ``--quick``). The baseline, measured in
the same run, is the Python path of LRU (an ``OrderedDict`` per request); every figure is
printed as a ratio to it. Both paths give the same faults (tests/test_experts_policies.py).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from prefixlab.experts import generate, simulate
from prefixlab.experts._kernels import warm_up
from prefixlab.experts.policies import registered


def rate(pages: np.ndarray, policy: str, backend: str, repeat: int = 2) -> tuple[float, int]:
    """Requests per second (best of ``repeat``) and the faults."""
    best, faults = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        res = simulate(
            pages, capacity=200, policy=policy, num_layers=32, num_experts=16, backend=backend
        )
        best = min(best, time.perf_counter() - start)
        faults = res.num_faults
    return len(pages) / best, faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    tokens = 31_250 if args.quick else 312_500
    start = time.perf_counter()
    trace = generate(
        "zipf", num_layers=32, num_experts=16, num_tokens=tokens, a=1.0, b=1.0, r=0.5, seed=0
    )
    pages = trace.pages
    gen_s = time.perf_counter() - start
    head = pages[: len(pages) // 10]
    print(
        f"trace: {len(pages):,} requests (generated in {gen_s:.1f} s); Python path on the "
        f"first {len(head):,}; k = 200"
    )
    warm_up()
    base, _ = rate(head, "lru", "python", repeat=4)
    print(f"baseline: Python lru {base:,.0f} requests/s\n")
    print(
        f"{'policy':<10} {'numba req/s':>14} {'x base':>8} {'python req/s':>14} {'x base':>8}"
        f" {'faults':>12}"
    )
    for name in registered():
        fast, faults = rate(pages, name, "numba")
        slow, _ = rate(head, name, "python")
        print(
            f"{name:<10} {fast:>14,.0f} {fast / base:>8.1f} {slow:>14,.0f} {slow / base:>8.2f}"
            f" {faults:>12,}"
        )


if __name__ == "__main__":
    main()
