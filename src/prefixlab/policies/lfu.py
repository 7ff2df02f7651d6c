"""LFU: evict the evictable entry with the fewest hits; ties to the least recent."""

from __future__ import annotations

from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.base import register


@register("lfu")
class LFU(KeyedPolicy):
    """Least frequently used: fewest hits since insertion, ties by oldest access, deepest."""

    sort_key = (("hits", 1), ("last_access", 1), ("depth", -1))
