"""LRU-dist: LRU inside each layer's fixed share of the cache (the paper's ``LRU-dist``).

Shares: k // l pages per layer, the remainder k mod l one each to the first layers; a
capacity below the number of layers is refused (some layer would get no page).
"""

from __future__ import annotations

from prefixlab.experts.policies.base import register
from prefixlab.experts.policies.lru import Lru
from prefixlab.experts.policies.partition import Partitioned


@register("lru-dist")
class LruDist(Partitioned):
    """LRU within fixed per-layer shares (k // l each, the remainder to the first layers)."""

    inner = Lru
