"""LFU: on a fault with a full cache, evict the resident page requested least often.

The classic in-cache LFU: a page's count starts at 1 when it is inserted and grows by one
per hit; an evicted page forgets its count (a later fault starts it at 1 again). Ties go to
the least recently requested page, so the order is (count, last request time), both
ascending, and never depends on page ids.
"""

from __future__ import annotations

import heapq

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("lfu")
class Lfu(ExpertPolicy):
    """Least frequently used since insertion; ties to the least recently used."""

    def reset(self, ctx: PolicyContext) -> None:
        self._count: dict[int, int] = {}
        self._last: dict[int, int] = {}
        # (count, last request, page); an item is stale once the page's last request moved
        self._heap: list[tuple[int, int, int]] = []

    def _push(self, page: int, count: int, t: int) -> None:
        self._count[page] = count
        self._last[page] = t
        heap = self._heap
        heapq.heappush(heap, (count, t, page))
        if len(heap) > 4 * len(self._count) + 64:  # drop stale items (amortised O(1))
            self._heap = [(self._count[p], lt, p) for _, lt, p in heap if self._last.get(p) == lt]
            heapq.heapify(self._heap)

    def on_hit(self, page: int, t: int) -> None:
        self._push(page, self._count[page] + 1, t)

    def on_insert(self, page: int, t: int) -> None:
        self._push(page, 1, t)

    def victim(self, page: int, t: int) -> int:
        heap, last = self._heap, self._last
        while True:
            _, lt, p = heapq.heappop(heap)
            if last.get(p) == lt:
                del last[p], self._count[p]
                return p

    def tracked(self) -> list[int]:
        return list(self._count)

    def run_fast(self, ctx: PolicyContext, record: bool) -> KernelRun | None:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_lfu(ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record)
