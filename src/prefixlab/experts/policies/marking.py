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

import numpy as np

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


def _swap_remove(x: int, items: list[int], where: dict[int, int]) -> None:
    i = where.pop(x)
    last = items.pop()
    if last != x:
        items[i] = last
        where[last] = i


@register("marking")
class Marking(ExpertPolicy):
    """Randomised marking: on a fault evict a uniformly random unmarked page (seeded)."""

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = seed

    def resolve(self, seed: int) -> Marking:
        return self if self.seed is not None else Marking(seed=seed)

    def reset(self, ctx: PolicyContext) -> None:
        self._rng = np.random.default_rng(0 if self.seed is None else self.seed)
        self._resident: list[int] = []
        self._resident_at: dict[int, int] = {}
        self._unmarked: list[int] = []
        self._unmarked_at: dict[int, int] = {}

    def on_hit(self, page: int, t: int) -> None:
        if page in self._unmarked_at:
            _swap_remove(page, self._unmarked, self._unmarked_at)

    def on_insert(self, page: int, t: int) -> None:
        self._resident_at[page] = len(self._resident)
        self._resident.append(page)

    def victim(self, page: int, t: int) -> int:
        unmarked = self._unmarked
        if not unmarked:  # all marked: a new phase
            unmarked.extend(sorted(self._resident))
            self._unmarked_at = {p: i for i, p in enumerate(unmarked)}
        m = len(unmarked)
        v = unmarked[min(int(self._rng.random() * m), m - 1)]
        _swap_remove(v, unmarked, self._unmarked_at)
        _swap_remove(v, self._resident, self._resident_at)
        return v

    def tracked(self) -> list[int]:
        return list(self._resident)

    def run_fast(self, ctx: PolicyContext, record: bool) -> KernelRun | None:
        num_pages = ctx.num_layers * ctx.num_experts
        seed = 0 if self.seed is None else self.seed
        return _kernels.run_marking(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, seed
        )
