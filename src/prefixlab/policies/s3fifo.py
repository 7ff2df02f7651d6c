"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost FIFO.

New entries enter S unless their key is in the ghost G (then M). Hits raise a 2-bit counter
(capped at 3). Evicting from S: an entry hit at least ``move_to_main_threshold`` times moves
to M, otherwise it is evicted and its key enters G. Evicting from M: an entry with a non-zero
counter is reinserted with the counter decremented (CLOCK-like), otherwise evicted. S is
drained while it holds at least ``small_ratio`` of the capacity. Pinned entries are skipped.
"""

from __future__ import annotations

from prefixlab.policies._ordered import FreeQueue, GhostList
from prefixlab.policies.base import EntryView, PerEntryPolicy, register


@register("s3fifo")
class S3FIFO(PerEntryPolicy):
    """S3-FIFO: small + main FIFOs with a ghost queue; quick demotion of one-hit wonders."""

    def __init__(self, small_ratio: float = 0.1, move_to_main_threshold: int = 1) -> None:
        if isinstance(small_ratio, bool) or not isinstance(small_ratio, (int, float)):
            raise ValueError(f"small_ratio must be a number, got {small_ratio!r}")
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        if (
            isinstance(move_to_main_threshold, bool)
            or not isinstance(move_to_main_threshold, int)
            or move_to_main_threshold < 1
        ):
            raise ValueError(
                f"move_to_main_threshold must be an integer >= 1, got {move_to_main_threshold!r}"
            )
        self.small_ratio = small_ratio
        self.move_to_main_threshold = move_to_main_threshold

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        cap = view.num_entries
        self.small_target = max(1, round(self.small_ratio * cap))
        self._free: set[int] = set()
        self.small = FreeQueue(self._free)
        self.main = FreeQueue(self._free)
        self.ghost = GhostList(max(1, cap - self.small_target))
        self.freq: dict[int, int] = {}

    def insert(self, e: int) -> None:
        key = int(self.view.key[e])
        self.freq[e] = 0
        if key in self.ghost:
            self.ghost.pop(key)
            self.main.append(e)
        else:
            self.small.append(e)

    def access(self, e: int) -> None:
        if e in self.freq:
            self.freq[e] = min(self.freq[e] + 1, 3)

    def evictable(self, e: int) -> None:
        self._free.add(e)
        self.small.freed(e)
        self.main.freed(e)

    def pinned(self, e: int) -> None:
        self._free.discard(e)

    def remove(self, e: int) -> None:
        self._free.discard(e)
        self.small.discard(e)
        self.main.discard(e)
        self.freq.pop(e, None)

    def _evict_small(self) -> int:
        while (e := self.small.oldest_free()) >= 0:
            self.small.discard(e)
            if self.freq[e] >= self.move_to_main_threshold:
                self.freq[e] = 0
                self.main.append(e)
                continue
            self.ghost.add(int(self.view.key[e]))
            return e
        return -1

    def _evict_main(self) -> int:
        # Every pass over a free entry decrements its counter (<= 3), so this terminates.
        while (e := self.main.oldest_free()) >= 0:
            if self.freq[e] > 0:
                self.freq[e] -= 1
                self.main.append(e)
                continue
            self.main.discard(e)
            return e
        return -1

    def pop_victim(self) -> int:
        if not self._free:
            return -1
        victim = -1
        if len(self.small) >= self.small_target:
            victim = self._evict_small()
        if victim < 0:
            victim = self._evict_main()
        if victim < 0:
            victim = self._evict_small()
        if victim < 0:
            # S's evictable entries had all been hit and were just promoted: evict from M.
            victim = self._evict_main()
        if victim >= 0:
            self._free.discard(victim)
            del self.freq[victim]
        return victim
