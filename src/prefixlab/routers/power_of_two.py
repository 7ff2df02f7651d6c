"""``power-of-two``: two distinct replicas drawn at random, the one with fewer outstanding
requests taken (SGLang router's ``power_of_two``; Mitzenmacher's two choices), seeded."""

from __future__ import annotations

import numpy as np

from prefixlab.routers._compiled import POWER_OF_TWO
from prefixlab.routers.base import SeededRouter, least, register
from prefixlab.types import F64, I64


@register("power-of-two")
class PowerOfTwo(SeededRouter):
    """The less loaded of two replicas drawn at random (seeded)."""

    def route(self, r: int, now: float) -> int:
        n = self.fleet.replicas
        if n == 1:
            return 0
        return least(self.fleet.loads.outstanding, self._pair(n))

    def _pair(self, n: int) -> I64:
        pair: I64 = np.sort(self.rng.choice(n, size=2, replace=False))
        return pair

    def compiled(self) -> tuple[int, F64] | None:
        if type(self).route is not PowerOfTwo.route:
            return None
        return POWER_OF_TWO, np.zeros(0)

    def draws(self, count: int) -> I64:
        """The pairs :meth:`route` would draw (none with one replica: it draws nothing)."""
        n = self.fleet.replicas
        pairs = np.zeros((count if n > 1 else 0, 2), np.int64)
        for k in range(pairs.shape[0]):
            pairs[k] = self._pair(n)
        return pairs
