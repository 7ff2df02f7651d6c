"""``round-robin``: replicas in turn (SGLang router's ``round_robin`` policy)."""

from __future__ import annotations

import numpy as np

from prefixlab.routers._compiled import DRAWN
from prefixlab.routers.base import Router, register
from prefixlab.types import F64, I64


@register("round-robin")
class RoundRobin(Router):
    """Replicas in turn, from replica 0."""

    depends_on = "order"

    def __init__(self) -> None:
        self._next = 0

    def route(self, r: int, now: float) -> int:
        i = self._next
        self._next = (i + 1) % self.fleet.replicas
        return i

    def compiled(self) -> tuple[int, F64] | None:
        return (DRAWN, np.zeros(0)) if type(self).route is RoundRobin.route else None

    def draws(self, count: int) -> I64:
        out = np.zeros((count, 2), np.int64)
        out[:, 0] = (self._next + np.arange(count)) % self.fleet.replicas
        self._next = (self._next + count) % self.fleet.replicas
        return out
