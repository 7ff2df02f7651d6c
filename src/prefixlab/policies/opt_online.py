"""OPT online: Belady's rule with only what a serving engine can see, its waiting queue.

A block that no waiting request looks up has an unknown next use, taken as +inf: those go
first, least recently used first. Blocks that a waiting request will look up go last, the
one needed by the request furthest back in the queue first (deepest first among blocks of
the same request, so a prefix is never evicted before its extension).

The engine runner hands the waiting queue to the policy before each step's admissions
(``on_waiting``). The replay runner has no queue, so the policy is refused there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from prefixlab.policies.base import I64, EntryView, EvictionPolicy, register


def waiting_positions(waiting_keys: Sequence[I64]) -> dict[int, int]:
    """Key -> position of the first waiting request that looks it up."""
    if not waiting_keys:
        return {}
    keys = np.concatenate(waiting_keys)
    if not keys.shape[0]:
        return {}
    pos = np.repeat(np.arange(len(waiting_keys)), [k.shape[0] for k in waiting_keys])
    uniq, first = np.unique(keys, return_index=True)
    return dict(zip(uniq.tolist(), pos[first].tolist(), strict=True))


@register("opt-online")
class OPTOnline(EvictionPolicy):
    """Farthest next use among waiting requests; blocks no waiting request needs go first (LRU)."""

    uses_lookahead: ClassVar[bool] = True
    requires_engine: ClassVar[bool] = True

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable, least recent first
        self._next_use: dict[int, int] = {}

    def on_waiting(self, waiting_keys: Sequence[I64]) -> None:
        self._next_use = waiting_positions(waiting_keys)

    def on_evictable(self, entries: I64) -> None:
        for e in entries.tolist():
            self._lru[e] = None

    def on_access(self, entries: I64) -> None:
        for e in entries.tolist():
            if e in self._lru:
                self._lru.move_to_end(e)

    def on_pinned(self, entries: I64) -> None:
        for e in entries.tolist():
            self._lru.pop(e, None)

    on_remove = on_pinned

    def evict(self, n: int) -> I64:
        known = self._next_use
        key = self.view.key
        out: list[int] = []
        needed: list[tuple[int, int, int, int]] = []  # (-position, -depth, lru rank, entry)
        for rank, e in enumerate(self._lru):
            if len(out) == n:
                break
            pos = known.get(int(key[e]))
            if pos is None:
                out.append(e)
            else:
                needed.append((-pos, -int(self.view.depth[e]), rank, e))
        if len(out) < n:
            needed.sort()
            out += [e for *_, e in needed[: n - len(out)]]
        for e in out:
            del self._lru[e]
        return np.array(out, dtype=np.int64)
