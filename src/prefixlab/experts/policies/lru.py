"""LRU: on a fault with a full cache, evict the resident page requested longest ago.

Classic least-recently-used paging (the paper's baseline ``LRU``): a hit or an insertion
makes the page the most recent one; the layer structure plays no part.
"""

from __future__ import annotations

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("lru")
class Lru(ExpertPolicy):
    """Least recently used: evict the page whose last request is oldest."""

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_lru(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, compiled
        )
