"""LRU: evict the evictable entry whose last access (hit or insert) is oldest."""

from __future__ import annotations

import numpy as np

from prefixlab.cache.view import EntryView
from prefixlab.policies._segments import SegmentQueue
from prefixlab.policies.base import EvictionPolicy, register
from prefixlab.types import I64


@register("lru")
class LRU(EvictionPolicy):
    """Least recently used: recency by hit or insertion, entry by entry in event order."""

    reads_access_metadata = False

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._queue = SegmentQueue(view.num_entries)
        self._free = np.zeros(view.num_entries, dtype=bool)

    def _grow(self) -> None:
        n = self.view.num_entries
        if self._free.shape[0] < n:
            self._queue.resize(n)
            self._free = np.concatenate([self._free, np.zeros(n - self._free.shape[0], bool)])

    def on_insert(self, entries: I64) -> None:
        self._grow()
        self._queue.push(entries)

    def on_access(self, entries: I64) -> None:
        self._queue.push(entries)

    def on_split(self, upper: int, lower: int) -> None:
        # The upper part is as old as the node it came from: queue it right behind it.
        self._grow()
        self._queue.insert_after(lower, upper)

    def on_evictable(self, entries: I64) -> None:
        self._free[entries] = True

    def on_pinned(self, entries: I64) -> None:
        self._free[entries] = False

    def on_remove(self, entries: I64) -> None:
        self._free[entries] = False
        self._queue.drop(entries)

    def evict(self, n: int) -> I64:
        victims = self._queue.pop(n, self._free)
        self._free[victims] = False
        return victims
