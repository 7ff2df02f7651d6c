"""LeCaR (Vietri et al., HotStorage'18): regret-minimising mix of LRU and LFU.

On each eviction an expert (LRU or LFU) is drawn with probability given by its weight; the
victim's key enters that expert's history. A later miss on a key in an expert's history is
regret for that expert: its weight is multiplied by exp(-learning_rate * discount^age),
with ``discount = 0.005 ** (1 / capacity)`` and age counted in insertions and hits (as the
paper and libCacheSim do). Randomness comes
from a seeded generator.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from prefixlab.policies._ordered import FreeQueue, GhostList
from prefixlab.policies.base import I64, EntryView, PerEntryPolicy, register


@register("lecar")
class LeCaR(PerEntryPolicy):
    """LeCaR: LRU and LFU experts weighted by regret over their ghost histories."""

    def __init__(self, learning_rate: float = 0.45, seed: int = 0) -> None:
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
            raise ValueError(f"learning_rate must be a number, got {learning_rate!r}")
        if not 0 < learning_rate < float("inf"):
            raise ValueError(f"learning_rate must be positive and finite, got {learning_rate}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.learning_rate = learning_rate
        self.seed = seed

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        cap = view.num_entries
        self.discount = 0.005 ** (1.0 / cap)
        self.w_lru = 0.5
        self.rng = np.random.default_rng(self.seed)
        self.freq: dict[int, int] = {}
        self.lfu_heap: list[tuple[int, int, int]] = []
        self.hist_lru = GhostList(cap)
        self.hist_lfu = GhostList(cap)
        self.time = 0
        self._stamp: dict[int, int] = {}
        self._free: set[int] = set()
        self.recency = FreeQueue(self._free)
        self._lfu_dropped: set[int] = set()  # pinned entries whose LFU item was popped

    def _touch(self, e: int) -> None:
        self.time += 1
        self._stamp[e] = self.time
        self._lfu_dropped.discard(e)
        self.recency.append(e)
        heapq.heappush(self.lfu_heap, (self.freq[e], self.time, e))

    def on_miss(self, keys: I64) -> None:
        # Regret is charged when the miss happens, before the request's victims are drawn.
        for key in keys.tolist():
            self._regret(key)

    def _regret(self, key: int) -> None:
        for hist, is_lru in ((self.hist_lru, True), (self.hist_lfu, False)):
            when = hist.pop(key)
            if when is not None:
                regret = self.discount ** (self.time - when)
                w_lru, w_lfu = self.w_lru, 1.0 - self.w_lru
                if is_lru:
                    w_lru *= math.exp(-self.learning_rate * regret)
                else:
                    w_lfu *= math.exp(-self.learning_rate * regret)
                self.w_lru = w_lru / (w_lru + w_lfu)

    def insert(self, e: int) -> None:
        self._regret(int(self.view.key[e]))  # a no-op when on_miss already charged it
        self.freq[e] = 1
        self._touch(e)

    def access(self, e: int) -> None:
        if e in self.freq:
            self.freq[e] += 1
            self._touch(e)

    def evictable(self, e: int) -> None:
        self._free.add(e)
        self.recency.freed(e)
        if e in self._lfu_dropped:  # its LFU item was popped while it was pinned
            self._lfu_dropped.discard(e)
            heapq.heappush(self.lfu_heap, (self.freq[e], self._stamp[e], e))

    def pinned(self, e: int) -> None:
        self._free.discard(e)

    def remove(self, e: int) -> None:
        self._free.discard(e)
        self.recency.discard(e)
        self.freq.pop(e, None)
        self._stamp.pop(e, None)
        self._lfu_dropped.discard(e)

    def _lfu_victim(self) -> int:
        """Fewest hits, then oldest stamp, among free entries. Stale items and pinned
        entries' items are dropped (``evictable`` pushes a pinned entry back)."""
        heap = self.lfu_heap
        while heap:
            _f, t, e = heap[0]
            if self._stamp.get(e) == t:
                if e in self._free:
                    return e
                self._lfu_dropped.add(e)  # pinned: ``evictable`` pushes it back
            heapq.heappop(heap)
        return -1

    def pop_victim(self) -> int:
        if not self._free:
            return -1
        use_lru = self.rng.random() < self.w_lru
        victim = self.recency.oldest_free() if use_lru else self._lfu_victim()
        hist = self.hist_lru if use_lru else self.hist_lfu
        hist.add(int(self.view.key[victim]), float(self.time))
        self.remove(victim)
        return victim
