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
        stamps = np.arange(self._counter, self._counter + n, dtype=np.int64)
        self._counter += n
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
