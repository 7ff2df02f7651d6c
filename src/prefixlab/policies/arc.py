"""ARC (Megiddo & Modha, FAST'03): adaptive split between recency (T1) and frequency (T2).

T1 holds entries seen once, T2 entries hit again; ghost lists B1/B2 remember the keys evicted
from each. A miss on a B1 key grows the target size ``p`` of T1, a miss on a B2 key shrinks
it. ``c`` is the structure's entry capacity. Pinned entries are skipped by the victim search.
"""

from __future__ import annotations

from prefixlab.policies._ordered import FreeQueue, GhostList
from prefixlab.policies.base import I64, EntryView, PerEntryPolicy, register


@register("arc")
class ARC(PerEntryPolicy):
    """Adaptive Replacement Cache: recency and frequency lists with ghost-driven target p."""

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.c = view.num_entries
        self.p = 0.0
        self._free: set[int] = set()
        self.t1 = FreeQueue(self._free)
        self.t2 = FreeQueue(self._free)
        self.b1 = GhostList(self.c)
        self.b2 = GhostList(2 * self.c)
        self._to_t2: set[int] = set()  # missed keys found in a ghost list, adapted already
        self._miss_in_b2 = False
        self._no_ghost = False  # case IV with T1 full: its LRU page leaves no ghost
        self._announced: set[int] = set()  # this request's missed keys, handled by on_miss

    def on_miss(self, keys: I64) -> None:
        # ARC adapts p on a ghost hit *before* REPLACE chooses a victim for the request.
        self._miss_in_b2 = False
        self._announced = set(keys.tolist())
        for key in keys.tolist():
            if self._adapt(key):
                self._to_t2.add(key)
            else:
                self._make_directory_room()

    def _make_directory_room(self) -> None:
        """Case IV of the paper: a page in no list keeps |L1| <= c and |L1|+|L2| <= 2c."""
        l1 = len(self.t1) + len(self.b1)
        if l1 >= self.c:
            if len(self.t1) < self.c:
                self.b1.trim(len(self.b1) - 1)
            else:
                self._no_ghost = True
        elif l1 + len(self.t2) + len(self.b2) >= 2 * self.c:
            self.b2.trim(len(self.b2) - 1)

    def _adapt(self, key: int) -> bool:
        """Adapt p if ``key`` is a ghost; True when it goes to T2."""
        if key in self.b1:
            self.p = min(float(self.c), self.p + max(len(self.b2) / max(len(self.b1), 1), 1.0))
            self.b1.pop(key)
            return True
        if key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / max(len(self.b2), 1), 1.0))
            self.b2.pop(key)
            self._miss_in_b2 = True
            return True
        return False

    def insert(self, e: int) -> None:
        key = int(self.view.key[e])
        if key in self._to_t2:
            self._to_t2.discard(key)
            self.t2.append(e)
        elif key in self._announced:
            # on_miss already handled it. A ghost created since (another holder of the key
            # evicted for this request) must not adapt p a second time.
            self._announced.discard(key)
            self.b1.pop(key)
            self.b2.pop(key)
            self.t1.append(e)
        elif self._adapt(key):  # no on_miss came first (hooks driven directly)
            self.t2.append(e)
        else:
            self.t1.append(e)

    def access(self, e: int) -> None:
        self.t1.discard(e)
        self.t2.append(e)

    def evictable(self, e: int) -> None:
        self._free.add(e)
        self.t1.freed(e)
        self.t2.freed(e)

    def pinned(self, e: int) -> None:
        self._free.discard(e)

    def remove(self, e: int) -> None:
        self._free.discard(e)
        self.t1.discard(e)
        self.t2.discard(e)

    def pop_victim(self) -> int:
        from_t1 = self.t1.oldest_free()
        from_t2 = self.t2.oldest_free()
        t1_over = len(self.t1) > self.p or (self._miss_in_b2 and len(self.t1) == self.p)
        if from_t1 >= 0 and (t1_over or from_t2 < 0):
            victim, queue, ghost = from_t1, self.t1, self.b1
        elif from_t2 >= 0:
            victim, queue, ghost = from_t2, self.t2, self.b2
        else:
            return -1
        queue.discard(victim)
        self._free.discard(victim)
        if queue is self.t1 and self._no_ghost:
            self._no_ghost = False
        else:
            ghost.add(int(self.view.key[victim]))
        # Safety bounds when hooks are driven without on_miss: |T1|+|B1| <= c, all <= 2c.
        self.b1.trim(self.c - len(self.t1))
        self.b2.trim(2 * self.c - len(self.t1) - len(self.t2) - len(self.b1))
        return victim
