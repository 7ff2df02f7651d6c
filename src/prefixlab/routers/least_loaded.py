"""``least-loaded``: the replica with the least outstanding work the router knows of:
requests routed and not finished (``by=requests``, as the SGLang router counts a worker's
load) or prompt tokens still waiting for their first token (``by=tokens``). Ties go to the
lowest index."""

from __future__ import annotations

import numpy as np

from prefixlab.routers._compiled import LEAST_REQUESTS, LEAST_TOKENS
from prefixlab.routers.base import Router, least, register
from prefixlab.types import F64, Scalar

BY = ("requests", "tokens")


@register("least-loaded")
class LeastLoaded(Router):
    """The replica with the fewest outstanding requests (or prefill tokens)."""

    def __init__(self, by: str = "requests") -> None:
        if by not in BY:
            raise ValueError(f"by must be one of {', '.join(BY)}, got {by!r}")
        self.by = by

    def params(self) -> dict[str, Scalar]:
        return {"by": self.by}

    def route(self, r: int, now: float) -> int:
        loads = self.fleet.loads
        return least(loads.outstanding if self.by == "requests" else loads.prefill_tokens)

    def compiled(self) -> tuple[int, F64] | None:
        if type(self).route is not LeastLoaded.route:
            return None
        return (LEAST_REQUESTS if self.by == "requests" else LEAST_TOKENS), np.zeros(0)
