"""OPT-dist: Belady's optimum inside each layer's even share (the paper's ``Opt-Dist``).

The paper's Dist construction applied to Opt (Sec. 5.1: "on each layer with a specific cache
of size k/l per layer"): Belady runs independently in every layer's share of ``k / l``
pages, rounded as in ``lru-dist``. Compared with OPT it measures what an even split costs
(Sec. 5.3, Fig. 6). It is not the best fixed partition: unequal shares can do better when
layers differ (the shares are not optimised here).
"""

from __future__ import annotations

from prefixlab.experts.policies.base import register
from prefixlab.experts.policies.opt import Opt
from prefixlab.experts.policies.partition import Partitioned


@register("opt-dist")
class OptDist(Partitioned):
    """Belady's optimum within fixed per-layer shares (k // l each, remainder to the first)."""

    needs_future = True
    inner = Opt
