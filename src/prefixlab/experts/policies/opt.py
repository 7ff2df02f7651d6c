"""OPT: Belady's offline optimum (evict the page whose next request is furthest away).

Offline (``needs_future``): next requests are precomputed with numpy. Every request time
is distinct, so the only possible tie is between pages never requested again; among
those, the least recently requested goes first. Both rules are folded into one key per
request, unique across the run::

    key(t) = next request time of pages[t]   if there is one (< N)
           = 2N - t                          otherwise (> N, larger for older t)

and the victim is the resident page with the largest key of its latest request.
"""

from __future__ import annotations

import heapq

import numpy as np

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import (
    I64,
    ExpertPolicy,
    KernelRun,
    PolicyContext,
    register,
)


def next_use_keys(pages: I64) -> I64:
    """Belady's eviction key of every request (see the module docstring)."""
    n = int(pages.shape[0])
    keys = 2 * n - np.arange(n, dtype=np.int64)
    if n < 2:
        return keys
    order = np.argsort(pages, kind="stable")  # requests of each page, in time order
    same = pages[order[1:]] == pages[order[:-1]]
    keys[order[:-1][same]] = order[1:][same]
    return keys


@register("opt")
class Opt(ExpertPolicy):
    """Belady's offline optimum: evict the page whose next request is furthest away."""

    needs_future = True

    def reset(self, ctx: PolicyContext) -> None:
        self._keys: list[int] = next_use_keys(ctx.pages).tolist()
        self._current: dict[int, int] = {}  # resident page -> key of its latest request
        self._heap: list[tuple[int, int]] = []  # (-key, page); stale once the key moved

    def _push(self, page: int, t: int) -> None:
        key = self._keys[t]
        self._current[page] = key
        heap = self._heap
        heapq.heappush(heap, (-key, page))
        if len(heap) > 4 * len(self._current) + 64:  # drop stale items (amortised O(1))
            cur = self._current
            self._heap = [(k, p) for k, p in heap if cur.get(p) == -k]
            heapq.heapify(self._heap)

    on_hit = _push
    on_insert = _push

    def victim(self, page: int, t: int) -> int:
        heap, cur = self._heap, self._current
        while True:
            k, p = heapq.heappop(heap)
            if cur.get(p) == -k:
                del cur[p]
                return p

    def tracked(self) -> list[int]:
        return list(self._current)

    def run_fast(self, ctx: PolicyContext, record: bool) -> KernelRun | None:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_opt(ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record)
