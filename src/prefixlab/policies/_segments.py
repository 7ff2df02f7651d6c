"""A FIFO of entry ids appended and consumed in numpy batches, with lazy invalidation.

Each push gives its entries fresh stamps; an entry's queued copy is valid only while the
entry still carries that stamp. Re-pushing (a new access) or dropping an entry makes older
copies stale, so nothing is ever searched for and removed from the middle::

    push([4,7,9])  push([2,7])       buffer: 4 7 9 2 7   (stamp[7] = its newest copy)
    pop(2)         -> [4, 9]          the first 7 is stale and is skipped

The queue is one flat buffer with a head index. ``pop`` scans a window from the head (grown
geometrically while stale copies dominate), so a request costs a handful of numpy calls
whatever the number of its blocks. Valid but ineligible ids (pinned entries) found before
the cut are written back just in front of the new head, keeping their order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
#: stamps step by GAP so that ``insert_after`` finds room between two neighbours
GAP = 1 << 16


class SegmentQueue:
    __slots__ = ("_counter", "_head", "_ids", "_st", "_tail", "stamp")

    def __init__(self, num_entries: int) -> None:
        self.stamp = np.full(num_entries, -1, dtype=np.int64)
        size = max(1024, 2 * num_entries)
        self._ids = np.empty(size, dtype=np.int64)
        self._st = np.empty(size, dtype=np.int64)
        self._head = 0
        self._tail = 0
        self._counter = 0

    def resize(self, num_entries: int) -> None:
        if num_entries > self.stamp.shape[0]:
            grown = np.full(num_entries, -1, dtype=np.int64)
            grown[: self.stamp.shape[0]] = self.stamp
            self.stamp = grown

    def push(self, ids: I64) -> None:
        """Append ids at the back (most recent end), in order."""
        n = int(ids.shape[0])
        if n == 0:
            return
        if self._tail + n > self._ids.shape[0]:
            self._make_room(n)
        stamps = self._counter + np.arange(n, dtype=np.int64) * GAP
        self._counter += n * GAP
        self.stamp[ids] = stamps
        self._ids[self._tail : self._tail + n] = ids
        self._st[self._tail : self._tail + n] = stamps
        self._tail += n

    def _make_room(self, n: int) -> None:
        """Drop stale copies and the consumed prefix; grow the buffer if still short."""
        ids = self._ids[self._head : self._tail]
        st = self._st[self._head : self._tail]
        keep = self.stamp[ids] == st
        ids, st = ids[keep], st[keep]
        live = int(ids.shape[0])
        size = self._ids.shape[0]
        while live + n > size // 2:
            size *= 2
        if size != self._ids.shape[0]:
            self._ids = np.empty(size, dtype=np.int64)
            self._st = np.empty(size, dtype=np.int64)
        self._ids[:live] = ids
        self._st[:live] = st
        self._head, self._tail = 0, live

    def insert_after(self, anchor: int, e: int) -> None:
        """Queue ``e`` right behind ``anchor``'s valid copy (same age; popped after it).

        The buffer is sorted by stamp, so the anchor is found by bisection; the new stamp is
        the midpoint to the next copy (stamps are renumbered when no gap is left).
        """
        if self._tail + 1 > self._ids.shape[0]:
            self._make_room(1)
        live = self._st[self._head : self._tail]
        pos = self._head + int(np.searchsorted(live, self.stamp[anchor]))
        assert self._ids[pos] == anchor, "anchor is not queued"
        lo = int(self._st[pos])
        hi = int(self._st[pos + 1]) if pos + 1 < self._tail else lo + 2 * GAP
        if hi - lo < 2:
            self._renumber()
            self.insert_after(anchor, e)
            return
        self._ids[pos + 2 : self._tail + 1] = self._ids[pos + 1 : self._tail]
        self._st[pos + 2 : self._tail + 1] = self._st[pos + 1 : self._tail]
        new = lo + (hi - lo) // 2
        self._ids[pos + 1] = e
        self._st[pos + 1] = self.stamp[e] = new
        self._tail += 1
        # Later pushes must stay behind it (stamps strictly increase along the buffer).
        self._counter = max(self._counter, new + GAP)

    def _renumber(self) -> None:
        self._make_room(0)
        n = self._tail - self._head
        st = np.arange(n, dtype=np.int64) * GAP
        self._st[self._head : self._tail] = st
        self.stamp[self._ids[self._head : self._tail]] = st
        self._counter = n * GAP

    def drop(self, ids: I64) -> None:
        """Forget ids (their queued copies become stale)."""
        self.stamp[ids] = -1

    def pop(self, n: int, eligible: B | None = None) -> I64:
        """Remove and return up to n valid ids from the front, skipping ineligible ones."""
        taken: list[I64] = []
        need = n
        window = max(2 * n, 64)
        while need > 0 and self._head < self._tail:
            head = self._head
            end = min(self._tail, head + window)
            ids = self._ids[head:end]
            valid = self.stamp[ids] == self._st[head:end]
            cand = valid & eligible[ids] if eligible is not None else valid
            pick = np.flatnonzero(cand)
            if pick.shape[0] >= need:
                pick = pick[:need]
                cut = int(pick[-1]) + 1
            else:
                cut = end - head
            chosen = ids[pick]
            if chosen.shape[0]:
                taken.append(chosen)
                self.stamp[chosen] = -1
                need -= int(chosen.shape[0])
            # Valid ids before the cut that were not taken (pinned) keep their place.
            valid[pick] = False
            kept = np.flatnonzero(valid[:cut])
            new_head = head + cut - int(kept.shape[0])
            if kept.shape[0]:
                kept_ids = ids[kept].copy()
                kept_st = self._st[head + kept]
                self._ids[new_head : head + cut] = kept_ids
                self._st[new_head : head + cut] = kept_st
            if new_head == head and cut == end - head:
                # The whole window is pinned: look further without moving the head.
                if end == self._tail:
                    break
                window *= 4
                continue
            self._head = new_head
            window *= 2
        if not taken:
            return np.zeros(0, dtype=np.int64)
        return taken[0] if len(taken) == 1 else np.concatenate(taken)

    def __len__(self) -> int:
        return self._tail - self._head
