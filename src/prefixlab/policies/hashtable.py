"""The hash-table prefix-caching report's policy.

Evict the block whose last access is oldest; among blocks last accessed at the same time,
the one with the longest prefix (deepest) first, so a prefix outlives its extensions.
"""

from __future__ import annotations

from typing import Any

from prefixlab.policies.base import I64, PriorityPolicy, register


@register("hashtable")
class HashTable(PriorityPolicy):
    """Oldest last access first, ties to the longest prefix (the hash-table report, Sec. 1)."""

    def priority(self, e: int) -> tuple[float, int]:
        v = self.view
        return (float(v.last_access[e]), -int(v.depth[e]))

    def priorities(self, entries: I64) -> list[Any]:
        v = self.view
        return list(zip(v.last_access[entries].tolist(), (-v.depth[entries]).tolist(), strict=True))
