"""SGLang's radix-cache LRU (``evict_policy.LRUStrategy``): priority = last access time.

On the radix structure the access times are SGLang's own (``RadixCache`` 0.5.23, see
:mod:`prefixlab.cache.radix`): a match stamps its path and, where it ends inside an edge,
both parts of the split edge; an insertion stamps every node it walks, then its new leaf,
later. SGLang only offers leaves, so a parent is never evicted before its children.
``tests/test_reference_sglang.py`` checks it request by request against SGLang's
RadixCache. On the block cache, ties (blocks of one request) go to the entry that became
evictable first, which the tail-first release makes the deepest.
"""

from __future__ import annotations

from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.base import register


@register("sglang-lru")
class SGLangLRU(KeyedPolicy):
    """SGLang radix LRU: lowest last-access time first (ties: first to become evictable)."""

    sort_key = (("last_access", 1),)
