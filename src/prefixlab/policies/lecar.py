"""LeCaR (Vietri et al., HotStorage'18): regret-minimising mix of LRU and LFU.

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.lecar`.
"""

from __future__ import annotations

import numpy as np

from prefixlab.cache.view import EntryView
from prefixlab.policies._arrays import FS, State, new_state
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.lecar import CODE, DISCOUNT, RATE, W_LRU


@register("lecar")
class LeCaR(ArrayPolicy):
    """LeCaR: LRU and LFU experts weighted by regret over their ghost histories."""

    code = CODE

    def __init__(self, learning_rate: float = 0.45, seed: int = 0) -> None:
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
            raise ValueError(f"learning_rate must be a number, got {learning_rate!r}")
        if not 0 < learning_rate < float("inf"):
            raise ValueError(f"learning_rate must be positive and finite, got {learning_rate}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.learning_rate = learning_rate
        self.seed = seed

    def bind(self, view: EntryView) -> None:
        self.rng = np.random.default_rng(self.seed)
        super().bind(view)

    def init_state(self, num_entries: int) -> State:
        st = new_state(num_entries, 1, (num_entries, num_entries))
        st[1][FS, DISCOUNT] = 0.005 ** (1.0 / num_entries)
        st[1][FS, W_LRU] = 0.5
        st[1][FS, RATE] = self.learning_rate
        return st

    @property
    def w_lru(self) -> float:
        """The LRU expert's weight."""
        return float(self.state[1][FS, W_LRU])
