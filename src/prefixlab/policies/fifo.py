"""FIFO: evict the evictable entry inserted first; hits do not change the order."""

from __future__ import annotations

from prefixlab.policies.base import register
from prefixlab.policies.lru import LRU
from prefixlab.types import I64


@register("fifo")
class FIFO(LRU):
    """First in, first out: insertion order only (hits are ignored)."""

    def on_access(self, entries: I64) -> None:
        return None
