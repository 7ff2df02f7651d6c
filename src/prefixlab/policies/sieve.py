"""SIEVE (Zhang et al., NSDI'24): a FIFO with a moving hand and one visited bit.

New entries enter at the head. A hit sets the entry's visited bit. To evict, the hand walks
from where it stopped towards the head (wrapping to the tail): a visited entry loses its bit
and is passed, the first unvisited evictable entry is evicted. Pinned entries are passed
without touching their bit.
"""

from __future__ import annotations

from prefixlab.policies.base import EntryView, PerEntryPolicy, register


@register("sieve")
class Sieve(PerEntryPolicy):
    """SIEVE: FIFO queue, visited bit on hit, a hand that sieves from tail to head."""

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._prev: dict[int, int] = {}  # towards the tail (older)
        self._next: dict[int, int] = {}  # towards the head (newer)
        self._visited: set[int] = set()
        self._free: set[int] = set()
        self.head = -1
        self.tail = -1
        self.hand = -1

    def insert(self, e: int) -> None:
        self._prev[e] = self.head
        self._next[e] = -1
        if self.head >= 0:
            self._next[self.head] = e
        self.head = e
        if self.tail < 0:
            self.tail = e

    def access(self, e: int) -> None:
        if e in self._prev:
            self._visited.add(e)

    def evictable(self, e: int) -> None:
        self._free.add(e)

    def pinned(self, e: int) -> None:
        self._free.discard(e)

    def remove(self, e: int) -> None:
        self._free.discard(e)
        if e in self._prev:
            self._unlink(e)

    def _unlink(self, e: int) -> None:
        p, n = self._prev.pop(e), self._next.pop(e)
        if p >= 0:
            self._next[p] = n
        else:
            self.tail = n
        if n >= 0:
            self._prev[n] = p
        else:
            self.head = p
        if self.hand == e:
            self.hand = n
        self._visited.discard(e)

    def pop_victim(self) -> int:
        if not self._free:
            return -1
        e = self.hand if self.hand >= 0 else self.tail
        while True:
            if e < 0:
                e = self.tail
            if e in self._free:
                if e in self._visited:
                    self._visited.discard(e)
                else:
                    self.hand = self._next[e]
                    self._unlink(e)
                    self._free.discard(e)
                    return e
            e = self._next[e]
