"""``round-robin``: replicas in turn (SGLang router's ``round_robin`` policy)."""

from __future__ import annotations

from prefixlab.routers.base import Router, register


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
