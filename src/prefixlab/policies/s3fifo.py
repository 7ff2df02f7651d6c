"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost FIFO.

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.s3fifo`.
"""

from __future__ import annotations

from prefixlab.policies._arrays import SC, State, new_state
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.s3fifo import CODE, SMALL_TARGET, THRESHOLD


@register("s3fifo")
class S3FIFO(ArrayPolicy):
    """S3-FIFO: small + main FIFOs with a ghost queue; quick demotion of one-hit wonders."""

    code = CODE

    def __init__(self, small_ratio: float = 0.1, move_to_main_threshold: int = 1) -> None:
        if isinstance(small_ratio, bool) or not isinstance(small_ratio, (int, float)):
            raise ValueError(f"small_ratio must be a number, got {small_ratio!r}")
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        if (
            isinstance(move_to_main_threshold, bool)
            or not isinstance(move_to_main_threshold, int)
            or move_to_main_threshold < 1
        ):
            raise ValueError(
                f"move_to_main_threshold must be an integer >= 1, got {move_to_main_threshold!r}"
            )
        self.small_ratio = small_ratio
        self.move_to_main_threshold = move_to_main_threshold

    def init_state(self, num_entries: int) -> State:
        small = max(1, round(self.small_ratio * num_entries))
        st = new_state(num_entries, 1, (max(1, num_entries - small), 0))
        st[0][SC, SMALL_TARGET] = small
        st[0][SC, THRESHOLD] = self.move_to_main_threshold
        return st

    @property
    def small_target(self) -> int:
        return int(self.state[0][SC, SMALL_TARGET])

    small = property(lambda self: self._queue(0), doc="S's members, oldest first")
    main = property(lambda self: self._queue(1), doc="M's members, oldest first")
    ghost = property(lambda self: self._ghost(0), doc="G's keys, oldest first")
