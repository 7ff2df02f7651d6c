"""LLRU (layered LRU), the policy the paper proposes for l-layer paging.

Definitions followed (Angelopoulos, Marchal, Obrecht, Simon, arXiv 2509.02408, as given in
the issue and the paper's summary; paraphrased):

* requests come in rounds, one page per layer in layer order, so request t belongs to
  layer t mod l;
* on a miss at time t, LLRU evicts the resident page with the largest last-round index
  R = floor((t - tau) / l), tau being the time of the page's last request;
* ties are broken by the largest relative layer distance D = (tau - t) mod l.

For D = 1 .. l-1 the largest D is the page whose layer is requested again furthest in the
future (the layer requested at t - 1 comes back at t + l - 1). D = 0 is a page of the layer
being requested now; by the formula as the issue gives it, it goes *last*, although its
layer's next request after this one is at t + l. We keep the formula as given; ranking
that page first instead (D' = (tau - t - 1) mod l) changes faults by -0.7% to +0.1% on
the Llama-MoE-like and Mixtral-like traces of docs/experts.md.

Request times are distinct, so pages with the largest R have tau in the window
(t - (R+1) l, t - R l], at most l of them, and their D values are distinct: no further tie
rule is needed. Those pages are the oldest in LRU order, so a victim costs O(l)::

    LRU order (oldest first), t = 20, l = 4:   tau: 9  11  12  14 ...
    R(9) = 2 -> window tau <= 20 - 2*4 = 12  -> candidates 9, 11, 12
    D = (tau - 20) mod 4:   9 -> 1, 11 -> 3, 12 -> 0   -> evict the page with tau 11
"""

from __future__ import annotations

from collections import OrderedDict

from prefixlab.experts import _kernels
from prefixlab.experts.policies.base import ExpertPolicy, KernelRun, PolicyContext, register


@register("llru")
class Llru(ExpertPolicy):
    """Layered LRU: evict the largest last-round index R, ties to the largest layer distance D."""

    def reset(self, ctx: PolicyContext) -> None:
        self._num_layers = ctx.num_layers
        self._order: OrderedDict[int, int] = OrderedDict()  # page -> last request, oldest first

    def on_hit(self, page: int, t: int) -> None:
        self._order.move_to_end(page)
        self._order[page] = t

    def on_insert(self, page: int, t: int) -> None:
        self._order[page] = t

    def victim(self, page: int, t: int) -> int:
        num_layers = self._num_layers
        items = iter(self._order.items())
        best, tau = next(items)
        limit = t - ((t - tau) // num_layers) * num_layers  # the max-R window ends here
        best_d = (tau - t) % num_layers
        for p, tau in items:
            if tau > limit:
                break
            d = (tau - t) % num_layers
            if d > best_d:
                best, best_d = p, d
        del self._order[best]
        return best

    def tracked(self) -> list[int]:
        return list(self._order)

    def run_fast(self, ctx: PolicyContext, record: bool) -> KernelRun | None:
        num_pages = ctx.num_layers * ctx.num_experts
        return _kernels.run_llru(ctx.pages, ctx.capacity, ctx.num_layers, num_pages, record)
