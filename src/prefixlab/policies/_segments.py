"""A FIFO of entry ids with lazy invalidation: the order behind lru, fifo and vllm.

Each push gives its entry a fresh stamp; an entry's queued copy is valid only while the
entry still carries that stamp. Re-pushing (a new access) or dropping an entry makes older
copies stale, so nothing is ever searched for and removed from the middle::

    push 4 7 9 2 7               buffer: 4 7 9 2 7   (stamp[7] = its newest copy)
    pop 2 (everything eligible)  -> 4, 9             the first 7 is stale and is skipped

A pop takes the oldest valid copy whose entry is eligible (evictable); valid copies of
pinned entries keep their place. The functions are :func:`prefixlab._jit.jit` functions:
:class:`SegmentQueue` (the lru / fifo / vllm policy classes) calls them in batches and the
compiled replay kernel (:mod:`prefixlab.runner._fast`) one entry at a time, so the order
has one implementation. Stamps step by ``GAP`` so that ``insert_after`` (a radix split:
the upper part is as old as the node it came from) finds room between two neighbours.

    qs = [head, tail, next stamp]    ids / sts: the buffer of (entry, stamp) copies
"""

from __future__ import annotations

import numpy as np

from prefixlab._jit import jit
from prefixlab.types import B1, I64

GAP = 1 << 16


@jit(inline=True)
def sq_compact(ids: I64, sts: I64, stamp: I64, qs: I64) -> None:
    """Keep only valid copies, in order, at the front of the buffer."""
    w = 0
    for i in range(qs[0], qs[1]):
        if sts[i] == stamp[ids[i]]:
            ids[w] = ids[i]
            sts[w] = sts[i]
            w += 1
    qs[0] = 0
    qs[1] = w


@jit(inline=True)
def sq_push(ids: I64, sts: I64, stamp: I64, qs: I64, e: int) -> None:
    """Append e with a fresh stamp; older copies of e become stale. The buffer must hold
    at least one slot more than the valid copies (it is compacted when full)."""
    if qs[1] == ids.shape[0]:
        sq_compact(ids, sts, stamp, qs)
    t = qs[1]
    ids[t] = e
    sts[t] = qs[2]
    stamp[e] = qs[2]
    qs[1] = t + 1
    qs[2] += GAP


@jit(inline=True)
def sq_pop(ids: I64, sts: I64, stamp: I64, elig: I64 | B1, busy_if_set: bool, qs: I64) -> int:
    """Remove and return the oldest valid copy whose entry is eligible, or -1.

    ``elig[e] != 0`` means busy (pinned) when ``busy_if_set`` (the kernel passes ref
    counts), eligible otherwise (a policy's evictable mask)."""
    i = qs[0]
    advance = True
    while i < qs[1]:
        e = ids[i]
        if sts[i] == stamp[e]:
            if (elig[e] != 0) != busy_if_set:
                stamp[e] = -1
                if advance:
                    qs[0] = i + 1
                return int(e)
            advance = False  # a valid pinned copy keeps its place at the front
        elif advance:
            qs[0] = i + 1
        i += 1
    return -1


# Parking (the compiled engine): a pop that meets a valid copy of a pinned entry takes the
# copy out of the buffer and marks the entry parked (pk 1) instead of walking past it on
# every later pop; when the entry becomes evictable again it competes at its old stamp
# from a min-heap of (stamp, entry) (pk 2). The victim is the same, the oldest valid
# eligible stamp, but a pop no longer costs a walk over every pinned entry at the front
# (the engine pins many). A push gives the entry a fresh copy (the caller clears pk).
# qs[3] is the heap's size; an item is live while pk[e] == 2 and stamp[e] is its stamp.
@jit(inline=True)
def _ph_push(hst: I64, hid: I64, qs: I64, st: int, e: int) -> None:
    i = qs[3]
    qs[3] = i + 1
    while i > 0:
        p = (i - 1) // 2
        if hst[p] <= st:
            break
        hst[i], hid[i] = hst[p], hid[p]
        i = p
    hst[i], hid[i] = st, e


@jit(inline=True)
def _ph_pop(hst: I64, hid: I64, qs: I64) -> None:
    n = qs[3] - 1
    qs[3] = n
    st, e = hst[n], hid[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hst[c + 1] < hst[c]:
            c += 1
        if st <= hst[c]:
            break
        hst[i], hid[i] = hst[c], hid[c]
        i = c
    if n > 0:
        hst[i], hid[i] = st, e


@jit(nrt=False)
def sq_unpark(stamp: I64, pk: I64, hst: I64, hid: I64, qs: I64, e: int) -> None:
    """e became evictable: if a pop parked it, it competes again at its old stamp."""
    if pk[e] != 1:
        return
    if qs[3] == hst.shape[0]:  # full of stale items: keep the live ones
        n = qs[3]
        qs[3] = 0
        for i in range(n):
            x = hid[i]
            if pk[x] == 2 and stamp[x] == hst[i]:
                _ph_push(hst, hid, qs, hst[i], x)
    pk[e] = 2
    _ph_push(hst, hid, qs, stamp[e], e)


@jit(nrt=False)
def sq_pop_parked(
    ids: I64,
    sts: I64,
    stamp: I64,
    elig: I64 | B1,
    busy_if_set: bool,
    qs: I64,
    pk: I64,
    hst: I64,
    hid: I64,
) -> int:
    """:func:`sq_pop` with parking: the same victim (or -1)."""
    i = qs[0]
    a = -1
    while i < qs[1]:
        e = ids[i]
        if sts[i] == stamp[e]:
            if (elig[e] != 0) != busy_if_set:
                a = i
                break
            pk[e] = 1  # pinned: its copy leaves the buffer
        i += 1
    qs[0] = i
    while qs[3] > 0:
        e = hid[0]
        if pk[e] != 2 or stamp[e] != hst[0]:
            _ph_pop(hst, hid, qs)  # stale
        elif (elig[e] != 0) == busy_if_set:
            _ph_pop(hst, hid, qs)  # pinned again: parked without an item
            pk[e] = 1
        else:
            break
    if qs[3] > 0 and (a < 0 or hst[0] < sts[a]):
        e = hid[0]
        _ph_pop(hst, hid, qs)
        pk[e] = 0
        stamp[e] = -1
        return int(e)
    if a >= 0:
        e = ids[a]
        qs[0] = a + 1
        stamp[e] = -1
        return int(e)
    return -1


@jit()
def sq_push_batch(ids: I64, sts: I64, stamp: I64, qs: I64, entries: I64) -> None:
    for i in range(entries.shape[0]):
        sq_push(ids, sts, stamp, qs, entries[i])


@jit()
def sq_pop_batch(
    ids: I64, sts: I64, stamp: I64, elig: I64 | B1, busy_if_set: bool, qs: I64, out: I64
) -> int:
    """Pop up to len(out) entries into out; returns how many."""
    for k in range(out.shape[0]):
        e = sq_pop(ids, sts, stamp, elig, busy_if_set, qs)
        if e < 0:
            return k
        out[k] = e
    return int(out.shape[0])


@jit(nrt=False)
def sq_insert_after(ids: I64, sts: I64, stamp: I64, qs: I64, anchor: int, e: int) -> bool:
    """Queue e right behind anchor's valid copy (same age; popped after it). Stamps are
    sorted along the buffer, so the anchor is found by bisection and e takes the midpoint
    stamp to the next copy. Returns False when no gap is left (renumber, then retry)."""
    lo, hi = qs[0], qs[1]
    target = stamp[anchor]
    while lo < hi:
        mid = (lo + hi) // 2
        if sts[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    pos = lo
    a = sts[pos]
    b = sts[pos + 1] if pos + 1 < qs[1] else a + 2 * GAP
    if b - a < 2:
        return False
    for i in range(qs[1], pos + 1, -1):
        ids[i] = ids[i - 1]
        sts[i] = sts[i - 1]
    new = a + (b - a) // 2
    ids[pos + 1] = e
    sts[pos + 1] = new
    stamp[e] = new
    qs[1] += 1
    # Later pushes must stay behind it (stamps strictly increase along the buffer).
    qs[2] = max(qs[2], new + GAP)
    return True


@jit(nrt=False)
def sq_renumber(ids: I64, sts: I64, stamp: I64, qs: I64) -> None:
    """Compact, then space the stamps GAP apart again."""
    sq_compact(ids, sts, stamp, qs)
    for i in range(qs[1]):
        sts[i] = i * GAP
        stamp[ids[i]] = i * GAP
    qs[2] = qs[1] * GAP


class SegmentQueue:
    """The queue for a policy class: batches in, the jit functions above do the work."""

    __slots__ = ("_ids", "_none", "_qs", "_sts", "stamp")

    def __init__(self, num_entries: int) -> None:
        self.stamp = np.full(num_entries, -1, dtype=np.int64)
        self._none = np.zeros(num_entries, dtype=np.int64)  # nothing pinned
        size = max(1024, 2 * num_entries)
        self._ids = np.empty(size, dtype=np.int64)
        self._sts = np.empty(size, dtype=np.int64)
        self._qs = np.zeros(3, dtype=np.int64)

    def resize(self, num_entries: int) -> None:
        if num_entries > self.stamp.shape[0]:
            grown = np.full(num_entries, -1, dtype=np.int64)
            grown[: self.stamp.shape[0]] = self.stamp
            self.stamp = grown
            self._none = np.zeros(num_entries, dtype=np.int64)

    def _room(self, n: int) -> None:
        """Make room for n more copies: compact, and grow the buffer if still short."""
        if self._qs[1] + n <= self._ids.shape[0]:
            return
        sq_compact(self._ids, self._sts, self.stamp, self._qs)
        live = int(self._qs[1])
        size = self._ids.shape[0]
        while live + n > size // 2:
            size *= 2
        if size != self._ids.shape[0]:
            ids = np.empty(size, dtype=np.int64)
            sts = np.empty(size, dtype=np.int64)
            ids[:live] = self._ids[:live]
            sts[:live] = self._sts[:live]
            self._ids, self._sts = ids, sts

    def push(self, ids: I64) -> None:
        """Append ids at the back (most recent end), in order."""
        if ids.shape[0]:
            self._room(int(ids.shape[0]))
            sq_push_batch(self._ids, self._sts, self.stamp, self._qs, ids)

    def insert_after(self, anchor: int, e: int) -> None:
        """Queue ``e`` right behind ``anchor``'s valid copy (same age; popped after it)."""
        assert self.stamp[anchor] >= 0, "anchor is not queued"
        self._room(1)
        if not sq_insert_after(self._ids, self._sts, self.stamp, self._qs, anchor, e):
            sq_renumber(self._ids, self._sts, self.stamp, self._qs)
            assert sq_insert_after(self._ids, self._sts, self.stamp, self._qs, anchor, e)

    def drop(self, ids: I64) -> None:
        """Forget ids (their queued copies become stale)."""
        self.stamp[ids] = -1

    def pop(self, n: int, eligible: B1 | None = None) -> I64:
        """Remove and return up to n valid ids from the front, skipping ineligible ones."""
        out = np.empty(n, dtype=np.int64)
        if eligible is None:
            k = sq_pop_batch(self._ids, self._sts, self.stamp, self._none, True, self._qs, out)
        else:
            k = sq_pop_batch(self._ids, self._sts, self.stamp, eligible, False, self._qs, out)
        return out[:k]

    def __len__(self) -> int:
        return int(self._qs[1] - self._qs[0])
