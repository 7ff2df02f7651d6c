"""LLRU (layered LRU), the policy the paper proposes for l-layer paging.

Definition 2 of Angelopoulos, Marchal, Obrecht, Simon, "Cache Management for
Mixture-of-Experts LLMs" (extended version, Sec. 4; ``../shared/papers/moe-expert-caching.md``):
"Given a page p in the cache at the current time t, let tau(p,t) denote the last time that p
was requested. We define the last-round index of p ... R(p,t) = floor((t - tau(p,t)) / l),
as the number of rounds between tau(p,t) and t. We also define the relative layer distance
of p, noted D(p,t) = tau(p,t) - t mod l, as the number of requests needed before reaching
the layer in which p belongs. ... LLRU ... on a cache miss at time t, evicts the page p with
largest index R(p,t), and in the event of ties evicts the page with largest index D(p,t)."
Requests come in rounds, one page per layer in layer order (request t belongs to layer
t mod l).

For D = 1 .. l-1 the largest D is the page whose layer is requested again furthest in the
future (the layer requested at t - 1 comes back at t + l - 1). D = 0 is a page of the layer
being requested now: read as (tau - t) mod l, the formula puts it *last*, although its
layer's next request after this one is at t + l, and Sec. 4's prose ("a more reasonable
choice is to evict a page of layer i-1 or even i") points the other way. Fig. 3, which
would settle it, did not survive the paper's conversion. We keep the formula; ranking that
page first instead (D' = (tau - t - 1) mod l) changes faults by -0.7% to +0.1% on the
Llama-MoE-like and Mixtral-like traces of docs/experts.md.

Request times are distinct, so pages with the largest R have tau in the window
(t - (R+1) l, t - R l], at most l of them, and their D values are distinct: no further tie
rule is needed. Those pages are the oldest in LRU order, so a victim costs O(l)::

    LRU order (oldest first), t = 20, l = 4:   tau: 9  11  12  14 ...
    R(9) = 2 -> window tau <= 20 - 2*4 = 12  -> candidates 9, 11, 12
    D = (tau - 20) mod 4:   9 -> 1, 11 -> 3, 12 -> 0   -> evict the page with tau 11
"""

from __future__ import annotations

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("llru")
class Llru(ExpertPolicy):
    """Layered LRU: evict the largest last-round index R, ties to the largest layer distance D."""

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_llru(
            ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record, compiled
        )
