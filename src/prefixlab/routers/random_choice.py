"""``random``: a replica drawn uniformly (SGLang router's ``random`` policy), seeded."""

from __future__ import annotations

from prefixlab.routers.base import SeededRouter, register


@register("random")
class RandomChoice(SeededRouter):
    """A replica drawn uniformly at random (seeded)."""

    depends_on = "order"

    def route(self, r: int, now: float) -> int:
        return int(self.rng.integers(self.fleet.replicas))
