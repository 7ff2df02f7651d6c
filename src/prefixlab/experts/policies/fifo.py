"""FIFO: on a fault with a full cache, evict the resident page inserted longest ago.

Hits do not change the order (first-in, first-out since the page's latest insertion).
"""

from __future__ import annotations

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("fifo")
class Fifo(ExpertPolicy):
    """First in, first out: evict the page inserted longest ago; hits change nothing."""

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_fifo(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, compiled
        )
