"""``power-of-two``: two distinct replicas drawn at random, the one with fewer outstanding
requests taken (SGLang router's ``power_of_two``; Mitzenmacher's two choices), seeded."""

from __future__ import annotations

import numpy as np

from prefixlab.routers.base import SeededRouter, least, register


@register("power-of-two")
class PowerOfTwo(SeededRouter):
    """The less loaded of two replicas drawn at random (seeded)."""

    def route(self, r: int, now: float) -> int:
        n = self.fleet.replicas
        if n == 1:
            return 0
        pair = np.sort(self.rng.choice(n, size=2, replace=False))
        return least(self.fleet.loads.outstanding, pair)
