"""MRU: evict the most recently used evictable entry (good for scans and loops)."""

from __future__ import annotations

from typing import Any

from prefixlab.policies.base import I64, PriorityPolicy, register


@register("mru")
class MRU(PriorityPolicy):
    """Most recently used first: last access newest evicted first, then deepest."""

    def priority(self, e: int) -> tuple[float, int]:
        v = self.view
        return (-float(v.last_access[e]), -int(v.depth[e]))

    def priorities(self, entries: I64) -> list[Any]:
        v = self.view
        return list(
            zip((-v.last_access[entries]).tolist(), (-v.depth[entries]).tolist(), strict=True)
        )
