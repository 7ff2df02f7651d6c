"""OPT online: Belady's rule with only what a serving engine can see, its waiting queue.

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.opt_online`.
"""

from __future__ import annotations

from typing import ClassVar

from prefixlab.policies._arrays import NEG_ROWS, SC, State, new_state
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.opt_online import CODE, HPOS, KHEAD, KNEXT, KPREV, WGEN, WPOS


@register("opt-online")
class OPTOnline(ArrayPolicy):
    """Farthest next use among waiting requests; blocks no waiting request needs go first (LRU)."""

    uses_lookahead: ClassVar[bool] = True
    requires_engine: ClassVar[bool] = True
    compiled_waiting: ClassVar[bool] = True
    code = CODE

    def init_state(self, num_entries: int) -> State:
        ist, fst = new_state(num_entries, 1, (1, 1), extra=(9, 1))
        for row in (KNEXT, KPREV, WPOS, WGEN, KHEAD, HPOS):
            ist[row] = -1
            ist[SC, NEG_ROWS] |= 1 << row
        return ist, fst
