"""LFU: on a fault with a full cache, evict the resident page requested least often.

The classic in-cache LFU: a page's count starts at 1 when it is inserted and grows by one
per hit; an evicted page forgets its count (a later fault starts it at 1 again). Ties go to
the least recently requested page, so the order is (count, last request time), both
ascending, and never depends on page ids.
"""

from __future__ import annotations

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("lfu")
class Lfu(ExpertPolicy):
    """Least frequently used since insertion; ties to the least recently used."""

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_lfu(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, compiled
        )
