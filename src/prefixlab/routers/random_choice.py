"""``random``: a replica drawn uniformly (SGLang router's ``random`` policy), seeded."""

from __future__ import annotations

import numpy as np

from prefixlab.routers._compiled import DRAWN
from prefixlab.routers.base import SeededRouter, register
from prefixlab.types import F64, I64


@register("random")
class RandomChoice(SeededRouter):
    """A replica drawn uniformly at random (seeded)."""

    depends_on = "order"

    def route(self, r: int, now: float) -> int:
        return int(self.rng.integers(self.fleet.replicas))

    def compiled(self) -> tuple[int, F64] | None:
        return (DRAWN, np.zeros(0)) if type(self).route is RandomChoice.route else None

    def draws(self, count: int) -> I64:
        out = np.zeros((count, 2), np.int64)
        for k in range(count):
            out[k, 0] = self.route(-1, 0.0)
        return out
