"""MRU: evict the most recently used evictable entry (good for scans and loops)."""

from __future__ import annotations

from prefixlab.policies.base import PriorityPolicy, register


@register("mru")
class MRU(PriorityPolicy):
    """Most recently used first: last access newest evicted first, then deepest."""

    def priority(self, e: int) -> tuple[float, int]:
        v = self.view
        return (-float(v.last_access[e]), -int(v.depth[e]))
