"""Hybrid (KV + SSM state) cache throughput: requests per second of Marconi and baselines.

Run: ``python benchmarks/hybrid_throughput.py`` (``--quick`` for a small trace).

The workload is agentic: 150 sessions of the session generator with the agentic gap preset,
about 10 turns each, 4,000-token system prompts, 1,500-token user turns and 500-token
replies, so contexts grow long: 1,501 requests and 32.5 M input tokens. The model is
Marconi's 7B hybrid on a 40 GB cache. Two comparisons, each against a baseline measured in
the same run:

1. Each system's requests per second, as a ratio to ``sglang+`` (LRU over leaves: the
   cheapest eviction).
2. Marconi's eviction as implemented (candidates kept in arrays, scored once per pass,
   vectorised, and evicted in order until the order can change) against a reference that
   walks the tree and rescans every candidate for every victim, as Marconi's published
   simulator does, on a chat-like workload (300 sessions, 1,519 requests) at 40 GB, where
   the trees are largest. Both must give the same hits (checked), so the ratio is pure
   implementation speed; the candidate scores each computes measure the work.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from prefixlab.cache.hybrid import HybridCache, Node
from prefixlab.policies.hybrid import Marconi, normalised_score
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Trace


class RescanMarconi(Marconi):
    """Marconi scored the simulator's way: walk the tree and rescan all candidates (every
    node with at most one child, locked ones scored too) for every victim; ties to the
    first in depth-first pre-order."""

    def free(self, need: int) -> int:
        cache: HybridCache = self.cache
        freed = 0
        while freed < need:
            scored = [nd for nd in _preorder(cache.root) if cache.has_candidate_shape(nd)]
            free = np.array([nd.lock == 0 for nd in scored], dtype=bool)
            if not free.any():
                break
            r = self.recency_of([nd.last_access for nd in scored])
            f = np.array([self.efficiency(nd) for nd in scored])
            score = np.where(free, normalised_score(r, f, self.current_alpha), np.inf)
            self.num_scored += len(scored)
            self.num_victims += 1
            victim = scored[int(np.argmin(score))]  # the first minimum
            freed += cache.freed_by(victim)
            cache.remove(victim)
        return freed


def _preorder(root: Node) -> list[Node]:
    out: list[Node] = []
    stack = list(reversed(root.children.values()))
    while stack:
        nd = stack.pop()
        out.append(nd)
        stack.extend(reversed(nd.children.values()))
    return out


def workload(quick: bool) -> Trace:
    sessions = 30 if quick else 150
    return GENERATORS["sessions"].fn(
        num_sessions=sessions, preset="agentic", mean_turns=10, max_turns=40,
        mean_user_tokens=1500, mean_output_tokens=500, system_tokens=4000,
    )  # fmt: skip


class EvictionClock:
    """Adds up the seconds a policy spends choosing and evicting victims (``free``)."""

    def __init__(self, policy: Marconi) -> None:
        self.seconds = 0.0
        inner = policy.free

        def free(need: int) -> int:
            start = time.perf_counter()
            try:
                return inner(need)
            finally:
                self.seconds += time.perf_counter() - start

        policy.free = free  # type: ignore[method-assign]


def timed(trace: Trace, policy: object, config: HybridConfig) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    res = replay_hybrid(trace, policy, config)  # type: ignore[arg-type]
    return time.perf_counter() - start, res.metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small trace (CI smoke run)")
    args = ap.parse_args()
    trace = workload(args.quick)
    n, tokens = len(trace), int(trace.input_length.sum())
    config = HybridConfig(capacity_bytes=40 * 10**9, model="marconi-hybrid-7b")
    print(f"trace: {n:,} requests, {tokens / 1e6:.1f} M input tokens; cache 40 GB, "
          f"{config.model}")  # fmt: skip
    print(f"\n{'system':22} {'req/s':>8} {'M tok/s':>8} {'vs sglang+':>10} {'token hit':>9} "
          f"{'evictions':>9}")  # fmt: skip
    base = None
    for system in ("sglang+", "vllm+", "marconi:alpha=1", "marconi:tune_jobs=2"):
        secs, m = timed(trace, system, config)
        base = base or secs
        print(f"{system:22} {n / secs:8.0f} {tokens / secs / 1e6:8.2f} {base / secs:9.2f}x "
              f"{m['token_hit_ratio']:9.3f} {m['num_evicted_nodes']:9,}")  # fmt: skip
    chat = GENERATORS["sessions"].fn(num_sessions=100 if args.quick else 300, preset="chat")
    k = len(chat)
    ref_pol, ours_pol = RescanMarconi(alpha=1.0), Marconi(alpha=1.0)
    ref_clock, ours_clock = EvictionClock(ref_pol), EvictionClock(ours_pol)
    gb = 10 if args.quick else 40
    cmp_config = HybridConfig(capacity_bytes=gb * 10**9, model="marconi-hybrid-7b")
    ref_s, ref_m = timed(chat, ref_pol, cmp_config)
    ours_s, ours_m = timed(chat, ours_pol, cmp_config)
    same = ref_m["num_hit_tokens"] == ours_m["num_hit_tokens"]
    print(f"\nMarconi eviction, chat-like workload ({k:,} requests), {gb} GB "
          f"({ours_m['num_evicted_nodes']:,} evictions, "
          f"{ours_m['num_nodes']:,} nodes at the end):")  # fmt: skip
    print(f"  rescan per victim (reference): {k / ref_s:8.0f} req/s  "
          f"{ref_pol.num_scored:>9,} candidate scores  "
          f"{ref_clock.seconds:6.3f} s evicting")  # fmt: skip
    print(f"  index, passes until it moves:  {k / ours_s:8.0f} req/s  "
          f"{ours_pol.num_scored:>9,} candidate scores  {ours_clock.seconds:6.3f} s evicting "
          f"({ours_pol.num_passes:,} passes)")  # fmt: skip
    print(f"  {ref_s / ours_s:.2f}x the reference's requests/s; "
          f"{ref_clock.seconds / ours_clock.seconds:.1f}x less time evicting; "
          f"same hits: {same}")  # fmt: skip
    if not same:
        raise SystemExit("the two evictions disagree")


if __name__ == "__main__":
    main()
