"""Small helpers shared by per-entry policies."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


def oldest_where(queue: OrderedDict[int, None], ok: Callable[[int], bool]) -> int:
    """The oldest entry of an ordered queue (front = oldest) that satisfies ``ok``, or -1."""
    for e in queue:
        if ok(e):
            return e
    return -1


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
