"""ARC (Megiddo & Modha, FAST'03): adaptive split between recency (T1) and frequency (T2).

T1 holds entries seen once, T2 entries hit again; ghost lists B1/B2 remember the keys evicted
from each. A miss on a B1 key grows the target size ``p`` of T1, a miss on a B2 key shrinks
it. ``c`` is the structure's entry capacity. Pinned entries are skipped by the victim search.
"""

from __future__ import annotations

from collections import OrderedDict

from prefixlab.policies._ordered import GhostList, oldest_where
from prefixlab.policies.base import EntryView, PerEntryPolicy, register


@register("arc")
class ARC(PerEntryPolicy):
    """Adaptive Replacement Cache: recency and frequency lists with ghost-driven target p."""

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.c = view.num_entries
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1 = GhostList(self.c)
        self.b2 = GhostList(2 * self.c)
        self._free: set[int] = set()

    def insert(self, e: int) -> None:
        key = int(self.view.key[e])
        if key in self.b1:
            self.p = min(float(self.c), self.p + max(len(self.b2) / max(len(self.b1), 1), 1.0))
            self.b1.pop(key)
            self.t2[e] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / max(len(self.b2), 1), 1.0))
            self.b2.pop(key)
            self.t2[e] = None
        else:
            self.t1[e] = None

    def access(self, e: int) -> None:
        if e in self.t1:
            del self.t1[e]
        else:
            self.t2.pop(e, None)
        self.t2[e] = None

    def evictable(self, e: int) -> None:
        self._free.add(e)

    def pinned(self, e: int) -> None:
        self._free.discard(e)

    def remove(self, e: int) -> None:
        self._free.discard(e)
        self.t1.pop(e, None)
        self.t2.pop(e, None)

    def pop_victim(self) -> int:
        free = self._free.__contains__
        from_t1 = oldest_where(self.t1, free)
        from_t2 = oldest_where(self.t2, free)
        if from_t1 >= 0 and (len(self.t1) > self.p or from_t2 < 0):
            victim, queue, ghost = from_t1, self.t1, self.b1
        elif from_t2 >= 0:
            victim, queue, ghost = from_t2, self.t2, self.b2
        else:
            return -1
        del queue[victim]
        self._free.discard(victim)
        ghost.add(int(self.view.key[victim]))
        # ARC's directory bounds: |T1|+|B1| <= c and |T1|+|T2|+|B1|+|B2| <= 2c.
        self.b1.trim(self.c - len(self.t1))
        self.b2.trim(2 * self.c - len(self.t1) - len(self.t2) - len(self.b1))
        return victim
