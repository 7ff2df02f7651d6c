"""Randomised marking (Fiat, Karp, Luby, McGeoch, Sleator, Young, 1991).

Each resident page is marked or unmarked. A hit marks the page. On a fault with a full
cache: if every resident page is marked, a new phase starts and all of them are unmarked;
then a uniformly random unmarked page is evicted. The requested page is inserted marked.

Randomness is injected: ``seed`` (default: the simulator's seed) seeds
``np.random.default_rng``, and each eviction takes the next uniform ``u`` of that stream
and evicts ``unmarked[floor(u * num_unmarked)]``. The unmarked pages are kept in a
swap-remove list (removing a page moves the last one into its slot); at a phase start the
list is refilled with the resident pages in ascending page id. The compiled kernel keeps
the same list and the same stream, so both give identical victims for a seed.
"""

from __future__ import annotations

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("marking")
class Marking(ExpertPolicy):
    """Randomised marking: on a fault evict a uniformly random unmarked page (seeded)."""

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = seed

    def resolve(self, seed: int) -> Marking:
        return self if self.seed is not None else Marking(seed=seed)

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun:
        num_pages = ctx.num_layers * ctx.num_experts
        seed = 0 if self.seed is None else self.seed
        return _kernels.run_marking(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, seed, compiled
        )
