"""Fleet sizing: the fewest replicas that meet a P95 time-to-first-token target.

For each router and tier setup, :func:`size_fleet` simulates the fleet on the user's trace
with 1, 2, 4, ... replicas until the P95 of arrival-to-first-token time is within the
target (or ``max_replicas`` is reached), then bisects between the last count that missed
and the first that met it. Each count is simulated once per setup; every run is kept, so
the answer comes with the curve it was read from (hit ratio and P95 against replicas).

Bisection assumes that, between those two counts, more replicas never make the P95
worse. With load-blind routers and a fixed trace that holds in practice, not in theory (a
router that packs for cache hits may trade latency for hits): the evaluated points are
reported so a user can see the curve around the answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prefixlab.errors import ConfigError
from prefixlab.model.timing import TimingModel
from prefixlab.policies.base import Policy
from prefixlab.runner.engine import EngineConfig
from prefixlab.runner.engine.tiers import TierConfig, tier_setup
from prefixlab.runner.fleet import FleetConfig, simulate_fleet
from prefixlab.types import Row
from prefixlab.workload.trace import Trace

#: a tier setup: its label (``none``, or the specs joined by `` + ``) and its tiers
TierSetup = tuple[str, tuple[TierConfig, ...]]


@dataclass(slots=True, frozen=True)
class SizingPoint:
    """One simulated fleet: the setup, the replica count and what it gave."""

    router: str
    tiers: str
    replicas: int
    token_hit_ratio: float
    mean_ttft_s: float  # arrival to first token
    p95_ttft_s: float  # arrival to first token
    meets: bool
    #: the CPU pool per replica of a point of the CPU-size curve, GB (NaN: other points)
    cpu_gb: float = math.nan

    def as_dict(self) -> Row:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Sizing:
    """Every point simulated and, per (router, tiers), the fewest replicas that met the
    target (None: not even ``max_replicas``)."""

    slo_p95_ttft_s: float
    max_replicas: int
    points: list[SizingPoint] = field(default_factory=list)
    answers: dict[tuple[str, str], int | None] = field(default_factory=dict)
    #: the CPU-size curve (:func:`cpu_curve`): each router at one replica count
    cpu_points: list[SizingPoint] = field(default_factory=list)

    def answer_rows(self) -> list[Row]:
        """One row per setup: the replicas needed and the point that met the target."""
        rows: list[Row] = []
        for (router, tiers), n in self.answers.items():
            at = next(
                (p for p in self.points if (p.router, p.tiers, p.replicas) == (router, tiers, n)),
                None,
            )
            rows.append(
                {
                    "router": router,
                    "tiers": tiers,
                    "replicas": n,
                    "p95_ttft_s": at.p95_ttft_s if at else math.nan,
                    "token_hit_ratio": at.token_hit_ratio if at else math.nan,
                }
            )
        return rows


def size_fleet(
    trace: Trace,
    policy: str,
    config: EngineConfig,
    timing: TimingModel,
    *,
    routers: Sequence[str],
    setups: Sequence[TierSetup],
    slo_p95_ttft_s: float,
    max_replicas: int = 64,
    curve: Sequence[int] = (),
    on_point: Callable[[SizingPoint], None] | None = None,
) -> Sizing:
    """The fewest replicas of ``config`` meeting ``slo_p95_ttft_s`` for each router and
    tier setup; ``curve``: replica counts simulated as well, for the figure (``on_point``
    hears each simulation as it ends)."""
    if not (isinstance(slo_p95_ttft_s, int | float) and 0 < slo_p95_ttft_s < math.inf):
        raise ConfigError(f"the P95 TTFT target must be a positive number, got {slo_p95_ttft_s!r}")
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
        raise ConfigError(f"max_replicas must be an integer >= 1, got {max_replicas!r}")
    if not routers or not setups:
        raise ConfigError("give at least one router and one tier setup")
    bad = [n for n in curve if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ConfigError(f"replica counts must be integers >= 1, got {bad[0]!r}")
    for r in routers:
        FleetConfig(1, r).validate()
    for _, tiers in setups:
        dataclasses.replace(config, tiers=tiers).validate()
    sizing = Sizing(float(slo_p95_ttft_s), max_replicas)
    for router in routers:
        for label, tiers in setups:
            cfg = dataclasses.replace(config, tiers=tiers)
            search = _Search(trace, policy, cfg, timing, (router, label), sizing, on_point)
            sizing.answers[(router, label)] = _smallest(search.meets, max_replicas)
            for n in curve:
                search.meets(n)
    return sizing


class _Search:
    """One setup's simulations, each replica count once."""

    def __init__(
        self,
        trace: Trace,
        policy: str,
        cfg: EngineConfig,
        timing: TimingModel,
        setup: tuple[str, str],
        sizing: Sizing,
        on_point: Callable[[SizingPoint], None] | None,
    ) -> None:
        self.args = (trace, policy, cfg, timing)
        self.setup, self.sizing, self.on_point = setup, sizing, on_point
        self.done: dict[int, bool] = {}

    def meets(self, n: int) -> bool:
        if n not in self.done:
            point = _simulate(*self.args, (*self.setup, n), self.sizing.slo_p95_ttft_s)
            self.sizing.points.append(point)
            self.done[n] = point.meets
            if self.on_point is not None:
                self.on_point(point)
        return self.done[n]


def cpu_curve(
    trace: Trace,
    policy: str,
    config: EngineConfig,
    timing: TimingModel,
    sizing: Sizing,
    *,
    routers: Sequence[str],
    cpu_gb: Sequence[float],
    replicas: int,
    on_point: Callable[[SizingPoint], None] | None = None,
) -> None:
    """Each router at ``replicas`` replicas with a CPU pool of each size in ``cpu_gb``
    (0: none) per replica (``lru``, write-through), into ``sizing.cpu_points``."""
    if config.model is None:
        raise ConfigError("a CPU-size curve needs a model (the KV bytes of a block)")
    bt = config.block_tokens or 16
    for router in routers:
        for gb in cpu_gb:
            if not (isinstance(gb, int | float) and 0 <= gb < math.inf):
                raise ConfigError(f"a CPU pool size must be >= 0 GB, got {gb!r}")
            label = f"cpu:size={gb:g}GB" if gb > 0 else "none"
            cfg = dataclasses.replace(config, tiers=tier_setup(label, config.model, bt))
            where = (router, label, replicas)
            point = _simulate(trace, policy, cfg, timing, where, sizing.slo_p95_ttft_s)
            sizing.cpu_points.append(dataclasses.replace(point, cpu_gb=float(gb)))
            if on_point is not None:
                on_point(sizing.cpu_points[-1])


def _simulate(
    trace: Trace,
    policy: str | Policy,
    cfg: EngineConfig,
    timing: TimingModel,
    where: tuple[str, str, int],
    slo_p95_ttft_s: float,
) -> SizingPoint:
    router, label, n = where
    m = simulate_fleet(trace, policy, cfg, FleetConfig(n, router), timing).engine.metrics
    p95 = float(m["p95_ttft_s"])
    point = SizingPoint(
        router,
        label,
        n,
        float(m["token_hit_ratio"]),
        float(m["mean_ttft_s"]),
        p95,
        p95 <= slo_p95_ttft_s,
    )
    return point


def _smallest(meets: Callable[[int], bool], limit: int) -> int | None:
    """The smallest n in 1..limit with ``meets(n)``: doubling, then bisection."""
    lo, hi = 0, 1  # lo missed (0: nothing tried), hi is the next to try
    while not meets(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(2 * hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi
