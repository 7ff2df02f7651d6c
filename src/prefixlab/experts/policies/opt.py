"""OPT: Belady's offline optimum (evict the page whose next request is furthest away).

Offline (``needs_future``): next requests are precomputed with numpy, in one stable sort
(``_kernels.next_use_keys``). Every request time is distinct, so the only possible tie is
between pages never requested again; among those, the least recently requested goes
first. Both rules are folded into one key per
request, unique across the run::

    key(t) = next request time of pages[t]   if there is one (< N)
           = 2N - t                          otherwise (> N, larger for older t)

and the victim is the resident page with the largest key of its latest request.
"""

from __future__ import annotations

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import (
    ExpertPolicy,
    KernelRun,
    PolicyContext,
    register,
)


@register("opt")
class Opt(ExpertPolicy):
    """Belady's offline optimum: evict the page whose next request is furthest away."""

    needs_future = True

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_opt(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, compiled
        )
