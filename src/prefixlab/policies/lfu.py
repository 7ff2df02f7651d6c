"""LFU: evict the evictable entry with the fewest hits; ties to the least recent."""

from __future__ import annotations

from typing import Any

from prefixlab.policies.base import I64, PriorityPolicy, register


@register("lfu")
class LFU(PriorityPolicy):
    """Least frequently used: fewest hits since insertion, ties by oldest access, deepest."""

    def priority(self, e: int) -> tuple[int, float, int]:
        v = self.view
        return (int(v.hits[e]), float(v.last_access[e]), -int(v.depth[e]))

    def priorities(self, entries: I64) -> list[Any]:
        v = self.view
        return list(
            zip(
                v.hits[entries].tolist(),
                v.last_access[entries].tolist(),
                (-v.depth[entries]).tolist(),
                strict=True,
            )
        )
