"""SGLang's radix-cache LRU (``evict_policy.LRUStrategy``): priority = last access time.

The structure stamps every entry on the matched path with the request's time; SGLang only
offers leaves, so a parent is never evicted before its children on the radix tree. On the
block cache, ties (blocks of one request) go to the entry that became evictable first,
which the tail-first release makes the deepest.
"""

from __future__ import annotations

from typing import Any

from prefixlab.policies.base import I64, PriorityPolicy, register


@register("sglang-lru")
class SGLangLRU(PriorityPolicy):
    """SGLang radix LRU: lowest last-access time first (ties: first to become evictable)."""

    def priority(self, e: int) -> float:
        return float(self.view.last_access[e])

    def priorities(self, entries: I64) -> list[Any]:
        return self.view.last_access[entries].tolist()  # type: ignore[no-any-return]
