"""Small helpers shared by per-entry policies."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator


class GhostList:
    """A bounded FIFO of keys (evicted entries' history) with O(1) membership."""

    __slots__ = ("_items", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[int, float] = OrderedDict()

    def add(self, key: int, when: float = 0.0) -> None:
        self._items.pop(key, None)
        self._items[key] = when
        self.trim(self.limit)

    def trim(self, limit: int) -> None:
        while len(self._items) > max(limit, 0):
            self._items.popitem(last=False)

    def pop(self, key: int) -> float | None:
        return self._items.pop(key, None)

    def __contains__(self, key: int) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


class FreeQueue:
    """An ordered queue (front = oldest) that finds its oldest *free* member in O(log n)
    amortised, however many pinned members lie ahead of it.

    Walking the queue past every pinned entry on each eviction would, under the engine
    (where running requests pin most of a small cache), cost a scan of the cache per
    victim. Here each member has a position (a counter bumped by
    ``append``), and a heap holds ``(position, entry)`` for every free member; items made
    stale by a later append, a removal or a pin are dropped when they reach the top, and
    ``freed`` pushes a member back only if it has no live item (it was appended while
    pinned, or its item was dropped while it was pinned), so items are never duplicated.
    The owner shares its set of free entries with the queue.
    """

    __slots__ = ("_free", "_heap", "_missing", "_next", "_pos")

    def __init__(self, free: set[int]) -> None:
        self._free = free
        self._pos: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self._missing: set[int] = set()  # members with no live item in the heap
        self._next = 0

    def append(self, e: int) -> None:
        """Put ``e`` at the back (moving it there if it is a member)."""
        self._next += 1
        self._pos.pop(e, None)  # re-inserted, so the dict keeps queue order
        self._pos[e] = self._next
        if e in self._free:
            self._missing.discard(e)
            self._push(self._next, e)
        else:
            self._missing.add(e)

    def discard(self, e: int) -> None:
        self._pos.pop(e, None)
        self._missing.discard(e)

    def freed(self, e: int) -> None:
        """``e`` became evictable: make it findable again if it is a member."""
        if e in self._missing:
            self._missing.discard(e)
            self._push(self._pos[e], e)

    def oldest_free(self) -> int:
        """The oldest free member, or -1."""
        heap, pos, free = self._heap, self._pos, self._free
        while heap:
            p, e = heap[0]
            if pos.get(e) == p:
                if e in free:
                    return e
                self._missing.add(e)  # pinned: ``freed`` pushes it back
            heapq.heappop(heap)
        return -1

    def _push(self, p: int, e: int) -> None:
        heapq.heappush(self._heap, (p, e))
        if len(self._heap) > 2 * len(self._pos) + 64:  # drop the stale items at once
            self._heap = [(q, x) for x, q in self._pos.items() if x in self._free]
            self._missing = {x for x in self._pos if x not in self._free}
            heapq.heapify(self._heap)

    def __contains__(self, e: int) -> bool:
        return e in self._pos

    def __len__(self) -> int:
        return len(self._pos)

    def __iter__(self) -> Iterator[int]:
        """Members from the oldest (for inspection; the dict keeps append order)."""
        return iter(self._pos)
