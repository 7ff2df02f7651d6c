"""ARC (Megiddo & Modha, FAST'03): adaptive split between recency (T1) and frequency (T2).

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.arc`.
"""

from __future__ import annotations

from prefixlab.policies._arrays import FS, SC, State, new_state
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.arc import CODE, C


@register("arc")
class ARC(ArrayPolicy):
    """Adaptive Replacement Cache: recency and frequency lists with ghost-driven target p."""

    code = CODE

    def init_state(self, num_entries: int) -> State:
        st = new_state(num_entries, 1, (num_entries, 2 * num_entries))
        st[0][SC, C] = num_entries
        return st

    @property
    def c(self) -> int:
        return int(self.state[0][SC, C])

    @property
    def p(self) -> float:
        """The target size of T1."""
        return float(self.state[1][FS, 0])

    t1 = property(lambda self: self._queue(0), doc="T1's members, oldest first")
    t2 = property(lambda self: self._queue(1), doc="T2's members, oldest first")
    b1 = property(lambda self: self._ghost(0), doc="B1's keys, oldest first")
    b2 = property(lambda self: self._ghost(1), doc="B2's keys, oldest first")
