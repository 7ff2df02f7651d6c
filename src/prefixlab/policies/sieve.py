"""SIEVE (Zhang et al., NSDI'24): a FIFO with a moving hand and one visited bit.

New entries enter at the head. A hit sets the entry's visited bit. To evict, the hand walks
from where it stopped towards the head (wrapping to the tail): a visited entry loses its bit
and is passed, the first unvisited evictable entry is evicted. Pinned entries are passed
without touching their bit.

The state is arrays and the hooks are :func:`prefixlab._jit.jit` functions: the policy
class calls them in batches, the compiled replay kernel entry by entry::

    link[0, e] towards the tail (older)    link[1, e] towards the head (newer)
    flag[e]    1 queued | 2 visited | 4 evictable
    st         head, tail, hand, number evictable
"""

from __future__ import annotations

import numpy as np

from prefixlab._jit import jit
from prefixlab.cache.view import EntryView
from prefixlab.policies.base import EvictionPolicy, register
from prefixlab.types import I64

QUEUED, VISITED, FREE = 1, 2, 4


@jit()
def sieve_state(num_entries: int) -> tuple[I64, I64, I64]:
    """(link, flag, st) for ``num_entries`` entries, all empty."""
    st = np.full(4, -1, np.int64)
    st[3] = 0
    return np.full((2, num_entries), -1, np.int64), np.zeros(num_entries, np.int64), st


@jit(nrt=False)
def sieve_insert(link: I64, flag: I64, st: I64, e: int) -> None:
    head = st[0]
    link[0, e] = head
    link[1, e] = -1
    if head >= 0:
        link[1, head] = e
    st[0] = e
    if st[1] < 0:
        st[1] = e
    flag[e] = QUEUED


@jit(inline=True)
def sieve_access(flag: I64, e: int) -> None:
    if flag[e] & QUEUED:
        flag[e] |= VISITED


@jit(inline=True)
def sieve_evictable(flag: I64, st: I64, e: int) -> None:
    if not flag[e] & FREE:
        flag[e] |= FREE
        st[3] += 1


@jit(inline=True)
def sieve_pinned(flag: I64, st: I64, e: int) -> None:
    if flag[e] & FREE:
        flag[e] &= ~FREE
        st[3] -= 1


@jit(nrt=False)
def _unlink(link: I64, flag: I64, st: I64, e: int) -> None:
    p, n = link[0, e], link[1, e]
    if p >= 0:
        link[1, p] = n
    else:
        st[1] = n
    if n >= 0:
        link[0, n] = p
    else:
        st[0] = p
    if st[2] == e:
        st[2] = n
    flag[e] = 0


@jit(nrt=False)
def sieve_remove(link: I64, flag: I64, st: I64, e: int) -> None:
    sieve_pinned(flag, st, e)
    if flag[e] & QUEUED:
        _unlink(link, flag, st, e)


@jit(nrt=False)
def sieve_pop(link: I64, flag: I64, st: I64) -> int:
    """Move the hand to the next victim and evict it; -1 when nothing is evictable."""
    if st[3] == 0:
        return -1
    e = st[2] if st[2] >= 0 else st[1]
    while True:
        if e < 0:
            e = st[1]
        f = flag[e]
        if f & FREE:
            if f & VISITED:
                flag[e] = f & ~VISITED
            else:
                st[2] = link[1, e]
                st[3] -= 1
                _unlink(link, flag, st, e)
                return int(e)
        e = link[1, e]


@jit()
def sieve_batch(link: I64, flag: I64, st: I64, entries: I64, hook: int) -> None:
    """Apply one hook to a batch: 0 insert, 1 access, 2 evictable, 3 pinned, 4 remove."""
    for i in range(entries.shape[0]):
        e = entries[i]
        if hook == 0:
            sieve_insert(link, flag, st, e)
        elif hook == 1:
            sieve_access(flag, e)
        elif hook == 2:
            sieve_evictable(flag, st, e)
        elif hook == 3:
            sieve_pinned(flag, st, e)
        else:
            sieve_remove(link, flag, st, e)


@jit()
def sieve_evict(link: I64, flag: I64, st: I64, n: int, out: I64) -> int:
    for i in range(n):
        e = sieve_pop(link, flag, st)
        if e < 0:
            return i
        out[i] = e
    return n


@register("sieve")
class Sieve(EvictionPolicy):
    """SIEVE: FIFO queue, visited bit on hit, a hand that sieves from tail to head."""

    reads_access_metadata = False

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._link, self._flag, self._st = sieve_state(view.num_entries)

    def _hook(self, entries: I64, hook: int) -> None:
        n = self.view.num_entries
        if self._flag.shape[0] < n:  # a radix tree grew
            link, flag, _ = sieve_state(n)
            link[:, : self._link.shape[1]] = self._link
            flag[: self._flag.shape[0]] = self._flag
            self._link, self._flag = link, flag
        if entries.shape[0]:
            sieve_batch(self._link, self._flag, self._st, entries, hook)

    def on_insert(self, entries: I64) -> None:
        self._hook(entries, 0)

    def on_access(self, entries: I64) -> None:
        self._hook(entries, 1)

    def on_evictable(self, entries: I64) -> None:
        self._hook(entries, 2)

    def on_pinned(self, entries: I64) -> None:
        self._hook(entries, 3)

    def on_remove(self, entries: I64) -> None:
        self._hook(entries, 4)

    def evict(self, n: int) -> I64:
        out = np.empty(n, np.int64)
        return out[: sieve_evict(self._link, self._flag, self._st, n, out)]

    @property
    def head(self) -> int:
        return int(self._st[0])

    @property
    def tail(self) -> int:
        return int(self._st[1])

    @property
    def hand(self) -> int:
        return int(self._st[2])
