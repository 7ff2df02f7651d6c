"""``cache-aware``: the SGLang router's ``cache_aware`` policy.

The router keeps, per replica, an approximate prefix tree of the prompts it sent there (it
never asks a replica what it cached). For each request::

    imbalanced = max - min > balance_abs_threshold and max > min * balance_rel_threshold
                 (over each replica's outstanding requests)
    imbalanced:  the replica with the fewest outstanding requests
    otherwise:   the replica whose tree matches the longest prefix of the prompt, if the
                 match covers more than cache_threshold of the prompt; else the replica
                 with the smallest tree (the most room)

and the prompt joins the chosen replica's tree. Every ``eviction_interval`` seconds each
tree drops its least recently used leaves until it holds at most ``max_tree_size``
entries. Parameters and defaults are the router's (``--cache-threshold`` 0.5,
``--balance-abs-threshold`` 32, ``--balance-rel-threshold`` 1.0001, ``--eviction-interval``
60, ``--max-tree-size`` 16777216). One difference: SGLang's tree holds the prompt's
characters, ours its block keys (a key names its whole prefix, so a tree is the set of
keys, and a match the run of leading keys found), so the match rate and the tree size
count blocks, not characters.
"""

from __future__ import annotations

import numpy as np

from prefixlab.routers._compiled import CACHE_AWARE
from prefixlab.routers.base import Fleet, Router, leading_run, least, register
from prefixlab.types import F64, Scalar


@register("cache-aware")
class CacheAware(Router):
    """SGLang router's cache_aware: longest prefix match unless load is imbalanced."""

    def __init__(
        self,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.0001,
        eviction_interval: float = 60.0,
        max_tree_size: int = 16777216,
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold!r}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 0:
            raise ValueError("the balance thresholds must be >= 0")
        if eviction_interval <= 0 or max_tree_size < 0:
            raise ValueError("eviction_interval must be > 0 and max_tree_size >= 0")
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.eviction_interval = float(eviction_interval)
        self.max_tree_size = int(max_tree_size)

    def params(self) -> dict[str, Scalar]:
        return {
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": self.balance_rel_threshold,
            "eviction_interval": self.eviction_interval,
            "max_tree_size": self.max_tree_size,
        }

    def compiled(self) -> tuple[int, F64] | None:
        if type(self).route is not CacheAware.route or type(self).routed is not CacheAware.routed:
            return None
        par = (
            self.cache_threshold,
            self.balance_abs_threshold,
            self.balance_rel_threshold,
            self.eviction_interval,
            self.max_tree_size,
        )
        return CACHE_AWARE, np.array(par, np.float64)

    def bind(self, fleet: Fleet) -> None:
        super().bind(fleet)
        #: per replica: block key -> (last access, depth), the tree as the set of its keys
        self.trees: list[dict[int, tuple[float, int]]] = [{} for _ in range(fleet.replicas)]
        #: the router's eviction thread runs every eviction_interval from the start (t=0)
        self._next_eviction = self.eviction_interval

    def route(self, r: int, now: float) -> int:
        self._evict_due(now)
        load = self.fleet.loads.outstanding
        hi, lo = int(load.max()), int(load.min())
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            return least(load)
        keys = self.fleet.prompt_keys(r).tolist()
        matched = [leading_run(keys, tree) for tree in self.trees]
        best = int(np.argmax(matched))  # ties to the lowest index
        if keys and matched[best] / len(keys) > self.cache_threshold:
            return best
        return least(np.array([len(t) for t in self.trees], dtype=np.int64))

    def routed(self, r: int, replica: int, now: float) -> None:
        tree = self.trees[replica]
        for depth, k in enumerate(self.fleet.prompt_keys(r).tolist()):
            tree[k] = (now, depth)

    def _evict_due(self, now: float) -> None:
        """Run the eviction cycle due by ``now``, if any (cycles at every multiple of
        ``eviction_interval``; several due at once are one, nothing having changed)."""
        if now < self._next_eviction:
            return
        while self._next_eviction <= now:
            self._next_eviction += self.eviction_interval
        for tree in self.trees:
            extra = len(tree) - self.max_tree_size
            if extra > 0:  # least recently used first; a leaf before its parent
                order = sorted(tree.items(), key=lambda kv: (kv[1][0], -kv[1][1]))
                for k, _ in order[:extra]:
                    del tree[k]
