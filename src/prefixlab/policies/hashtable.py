"""The hash-table prefix-caching report's policy.

Evict the block whose last access is oldest; among blocks last accessed at the same time,
the one with the longest prefix (deepest) first, so a prefix outlives its extensions.
"""

from __future__ import annotations

from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.base import register


@register("hashtable")
class HashTable(KeyedPolicy):
    """Oldest last access first, ties to the longest prefix (the hash-table report, Sec. 1)."""

    sort_key = (("last_access", 1), ("depth", -1))
