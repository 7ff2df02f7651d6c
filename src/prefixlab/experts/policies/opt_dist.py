"""OPT-dist: Belady's optimum inside each layer's fixed share (the paper's ``OPT-dist``).

The best any fixed per-layer partition can do; compared with OPT it measures the price of
partitioning. Shares as in ``lru-dist``.
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
