"""MRU: evict the most recently used evictable entry (good for scans and loops)."""

from __future__ import annotations

from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.base import register


@register("mru")
class MRU(KeyedPolicy):
    """Most recently used first: last access newest evicted first, then deepest."""

    sort_key = (("last_access", -1), ("depth", -1))
