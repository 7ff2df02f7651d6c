"""A FIFO of entry ids appended and consumed in numpy batches, with lazy invalidation.

Each push gives its entries fresh stamps; an entry's queued copy is valid only while the
entry still carries that stamp. Re-pushing (a new access) or dropping an entry makes older
copies stale, so nothing is ever searched for and removed from the middle::

    push([4,7,9])  push([2,7])         queue: [4 7 9] [2 7]      stamp[7] = newest
    pop(2)         -> [4, 9]            (the first 7 is stale: its stamp moved on)

Cost per request is a handful of numpy calls, whatever the number of blocks.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class SegmentQueue:
    __slots__ = ("_counter", "_queued", "_segments", "stamp")

    def __init__(self, num_entries: int) -> None:
        self.stamp = np.full(num_entries, -1, dtype=np.int64)
        self._segments: deque[tuple[I64, I64]] = deque()
        self._counter = 0
        self._queued = 0

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
        stamps = np.arange(self._counter, self._counter + n, dtype=np.int64)
        self._counter += n
        self.stamp[ids] = stamps
        self._segments.append((ids.copy(), stamps))
        self._queued += n
        if self._queued > 4 * self.stamp.shape[0] + 1024:
            self._compact()

    def drop(self, ids: I64) -> None:
        """Forget ids (their queued copies become stale)."""
        self.stamp[ids] = -1

    def _compact(self) -> None:
        if not self._segments:
            return
        ids = np.concatenate([s[0] for s in self._segments])
        st = np.concatenate([s[1] for s in self._segments])
        keep = self.stamp[ids] == st
        self._segments = deque([(ids[keep], st[keep])]) if keep.any() else deque()
        self._queued = int(keep.sum())

    def pop(self, n: int, eligible: B | None = None) -> I64:
        """Remove and return up to n valid ids from the front, skipping ineligible ones.

        Ineligible valid ids (pinned entries) keep their place in the queue.
        """
        taken: list[I64] = []
        need = n
        segs = self._segments
        i = 0
        while need > 0 and i < len(segs):
            ids, st = segs[i]
            valid = self.stamp[ids] == st
            cand = valid & eligible[ids] if eligible is not None else valid
            pick = np.flatnonzero(cand)[:need]
            if pick.size:
                chosen = ids[pick]
                taken.append(chosen)
                self.stamp[chosen] = -1
                need -= int(pick.size)
                valid[pick] = False
            num_left = int(np.count_nonzero(valid))
            self._queued -= int(ids.shape[0]) - num_left
            if num_left == 0:
                del segs[i]
            else:
                if num_left < ids.shape[0]:
                    segs[i] = (ids[valid], st[valid])
                i += 1
        if not taken:
            return np.zeros(0, dtype=np.int64)
        return taken[0] if len(taken) == 1 else np.concatenate(taken)

    def __len__(self) -> int:
        return self._queued
