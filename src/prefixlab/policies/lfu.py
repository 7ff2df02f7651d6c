"""LFU: evict the evictable entry with the fewest hits; ties to the least recent."""

from __future__ import annotations

from prefixlab.policies.base import PriorityPolicy, register


@register("lfu")
class LFU(PriorityPolicy):
    """Least frequently used: fewest hits since insertion, ties by oldest access, deepest."""

    def priority(self, e: int) -> tuple[int, float, int]:
        v = self.view
        return (int(v.hits[e]), float(v.last_access[e]), -int(v.depth[e]))
