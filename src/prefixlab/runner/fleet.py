"""The fleet runner: replicas of one engine behind a router, on one virtual clock.

Each replica is the engine runner's reference loop (:mod:`prefixlab.runner.engine`): its own
cache, policy and continuous-batching scheduler. Arrivals go through a router
(:mod:`prefixlab.routers`), which sees the request and the answers of the requests it
routed, nothing of the replicas' caches or queues. One
:class:`~prefixlab.runner.engine.run.Run` drives them all, so with one replica the fleet
is the engine runner, result for result (tested). Results are the engine's, over the whole
fleet (every request once, on the replica that served it), plus the replica of each
request and a row per replica. Tiers: each replica has its own CPU pool; the store, when
there is one, is one pool that every replica reads and writes, each over its own link.

A router that reads nothing of the replicas (``round-robin``, ``random``, ``session``)
routes ahead instead, and each replica runs apart on the compiled engine
(:mod:`prefixlab.runner.fleet_split`), with the same results.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np

from prefixlab.cache.events import Event, Observer, Removed, Stored
from prefixlab.errors import ConfigError
from prefixlab.metrics.replay import ReplayMetrics
from prefixlab.model.timing import TimingModel
from prefixlab.policies.base import Policy
from prefixlab.routers.base import Fleet, Loads, Router, make_router
from prefixlab.runner.engine.loop import EventLoop
from prefixlab.runner.engine.run import Run
from prefixlab.runner.engine.scheduler import Batch, Scheduler
from prefixlab.runner.engine.simulator import (
    EngineConfig,
    EngineResult,
    assemble,
    attach_tiers,
    make_scheduler,
    policy_and_layout,
    prepare_policy,
    reference_cache,
    structure_config,
    tier_metrics,
)
from prefixlab.runner.engine.tiers import TierStack, make_tier
from prefixlab.runner.fleet_routed import routed_applies, simulate_routed
from prefixlab.runner.fleet_split import replica_row, simulate_split, split_applies
from prefixlab.types import B1, I64, Row
from prefixlab.workload.trace import BlockLayout, Trace


@dataclass(slots=True, frozen=True)
class FleetConfig:
    """How many replicas and which router (a spec: ``power-of-two:seed=1``)."""

    replicas: int = 1
    router: str = "round-robin"

    def validate(self) -> None:
        n = self.replicas
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"replicas must be an integer >= 1, got {n!r}")
        make_router(self.router)


@dataclass(slots=True)
class FleetResult:
    """The fleet's results: the engine's figures over every request, the replica that
    served each, and a row per replica."""

    engine: EngineResult
    router: str
    replicas: int
    replica: I64 = field(repr=False)
    per_replica: list[Row] = field(default_factory=list)

    def as_dict(self) -> Row:
        out: Row = {"router": self.router, "replicas": self.replicas}
        out.update(self.engine.as_dict())
        counts = [int(row["num_requests"]) for row in self.per_replica]  # type: ignore[call-overload]
        out["max_replica_share"] = max(counts) / max(sum(counts), 1)
        out["per_replica"] = self.per_replica  # requests, hits, evictions, TTFT of each
        return out


class _Dispatch:
    """The router and the loads it keeps from the answers of the requests it routed."""

    def __init__(self, router: Router, loads: Loads, input_length: I64) -> None:
        self.router = router
        self.loads = loads
        self.input = input_length.tolist()
        self.answered: B1 = np.zeros(len(self.input), dtype=bool)

    def route(self, r: int, now: float) -> int:
        i = self.router.route(r, now)
        if not 0 <= i < self.loads.outstanding.shape[0]:
            raise AssertionError(f"router '{self.router.name}' chose replica {i}")
        self.loads.outstanding[i] += 1
        self.loads.prefill_tokens[i] += self.input[r]
        self.router.routed(r, i, now)
        return i

    def first_token(self, r: int, replica: int, now: float) -> None:
        if not self.answered[r]:
            self.answered[r] = True
            self.loads.prefill_tokens[replica] -= self.input[r]
            self.router.answered(r, replica, now)

    def finished(self, r: int, replica: int, now: float) -> None:
        self.first_token(r, replica, now)
        self.loads.outstanding[replica] -= 1
        self.router.finished(r, replica, now)


class _KvFeed:
    """A replica's cache events, as KV events to the router (stored and removed keys), at
    the fleet clock's time."""

    def __init__(self, router: Router, replica: int) -> None:
        self.router = router
        self.replica = replica
        self.loop: EventLoop[tuple[int, int | Batch | None]] | None = None

    def on_event(self, event: Event) -> None:
        if isinstance(event, Stored | Removed) and self.loop is not None:
            self.router.kv_event(self.replica, event.keys, isinstance(event, Stored), self.loop.now)


def simulate_fleet(
    trace: Trace,
    policy: Policy | str,
    config: EngineConfig,
    fleet: FleetConfig,
    timing: TimingModel,
    check_every: int = 0,
    fast: bool = True,
) -> FleetResult:
    """Serve ``trace`` with ``fleet.replicas`` engines of ``config`` behind ``fleet.router``.

    Args:
        trace: requests in arrival order.
        policy: a spec string or a policy object (each replica gets its own copy).
        config: one replica's engine: capacity, structure, scheduler limits.
        fleet: replicas and router.
        timing: one replica's timing model (the replicas are alike).
        check_every: check every replica's invariants every this many steps.
        fast: route ahead and run each replica compiled when that applies
            (:mod:`prefixlab.runner.fleet_split`: the same results as the reference).
    """
    config.validate()
    fleet.validate()
    n = fleet.replicas
    pols, layout = _policies(trace, policy, config, n)
    router = make_router(fleet.router)
    loads = Loads.empty(n)
    router.bind(Fleet(n, trace, layout, loads))
    if fast and not check_every:
        pol = pols[0]
        if split_applies(trace, pol, config, layout, router, timing):
            engine, replica, rows = simulate_split(trace, pols, config, layout, router, timing)
            return FleetResult(engine, router.spec(), n, replica, rows)
        if routed_applies(trace, pol, config, layout, router, timing, n):
            engine, replica, rows = simulate_routed(trace, pols, config, layout, router, timing)
            return FleetResult(engine, router.spec(), n, replica, rows)
    return _reference(trace, pols, config, layout, router, loads, timing, check_every)


def _reference(
    trace: Trace,
    pols: list[Policy],
    config: EngineConfig,
    layout: BlockLayout,
    router: Router,
    loads: Loads,
    timing: TimingModel,
    check_every: int,
) -> FleetResult:
    """The fleet on the engine's reference loop: one clock, routing as the run goes."""
    n = len(pols)
    metrics = [ReplayMetrics(len(trace)) for _ in range(n)]
    feeds = [_KvFeed(router, i) for i in range(n)] if router.reads_kv_events else []
    observers: list[list[Observer]] = [[m, *feeds[i : i + 1]] for i, m in enumerate(metrics)]
    scheds = [
        _replica(trace, pol, config, layout, obs) for pol, obs in zip(pols, observers, strict=True)
    ]
    stacks = _tiers(scheds, config, layout, timing)
    dispatch = _Dispatch(router, loads, trace.input_length)
    arrivals = (config.closed_loop, config.gated)
    run = Run(trace, scheds, timing, observers, arrivals, check_every, dispatch)
    for feed in feeds:
        feed.loop = run.loop
    start = time.perf_counter()
    run.go()
    engine = _assemble(trace, pols[0], config, timing, run, metrics)
    engine.metrics["elapsed_s"] = time.perf_counter() - start
    if stacks:
        engine.metrics.update(tier_metrics(stacks, engine.hit_tokens, trace.input_length))
    wait = run.first_token_s - run.arrival_s
    per = [
        replica_row(trace, run.replica == i, m.hit_tokens, wait, m.num_evictions, i)
        for i, m in enumerate(metrics)
    ]
    return FleetResult(engine, router.spec(), n, run.replica, per)


def _policies(
    trace: Trace, policy: Policy | str, config: EngineConfig, n: int
) -> tuple[list[Policy], BlockLayout]:
    """One policy per replica (fresh from a spec, or copies of an unbound object)."""
    pol, layout = policy_and_layout(trace, policy, config)
    if n > 1 and getattr(pol, "needs_future", False):
        raise ConfigError(
            f"policy '{pol.spec()}' knows the future of the whole trace; behind a router each "
            "replica sees only its share, which is decided as the run goes: run it with one "
            "replica"
        )
    pols = [pol] + [
        policy_and_layout(trace, policy, config)[0]
        if isinstance(policy, str)
        else copy.deepcopy(pol)
        for _ in range(n - 1)
    ]
    return pols, layout


def _replica(
    trace: Trace, pol: Policy, config: EngineConfig, layout: BlockLayout, obs: list[Observer]
) -> Scheduler:
    """One replica: its cache and its scheduler, as the engine runner builds them."""
    rc = structure_config(trace, pol, config, layout)
    cache = reference_cache(trace, pol, config, rc, layout, obs)
    prepare_policy(pol, trace, layout)
    return make_scheduler(trace, layout, cache, pol, config, obs)


def _tiers(
    scheds: list[Scheduler], config: EngineConfig, layout: BlockLayout, timing: TimingModel
) -> list[TierStack]:
    """Each replica's tiers: its own CPU pool, and the one store they share."""
    if not config.tiers:
        return []
    shared = {t.name: make_tier(t, layout) for t in config.tiers if t.name == "store"}
    stacks = []
    for sched in scheds:
        tiers = [shared[t.name] if t.name in shared else make_tier(t, layout) for t in config.tiers]
        stacks.append(attach_tiers(sched, config, tiers, timing))
    return stacks


def _assemble(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    timing: TimingModel,
    run: Run,
    metrics: list[ReplayMetrics],
) -> EngineResult:
    """The engine's result over the whole fleet: each request's hits and times are those
    of the one replica that served it."""
    if run.check_every:
        for s in run.scheds:
            s.check()
    hits = ReplayMetrics(len(trace))
    for m in metrics:
        hits.hit_tokens += m.hit_tokens
        hits.hit_blocks += m.hit_blocks
        hits.miss_blocks += m.miss_blocks
        hits.num_evictions += m.num_evictions
        hits.num_admitted_blocks += m.num_admitted_blocks
        hits.num_rejected_blocks += m.num_rejected_blocks
    preempt = np.sum([np.array(s.num_preemptions, np.int64) for s in run.scheds], axis=0)
    history = getattr(run.scheds[0].cache, "alpha_history", None)
    times = (run.arrival_s, run.scheduled_s, run.first_token_s, run.finish_s)
    tuned = history is not None and hasattr(pol, "current_alpha") and len(run.scheds) == 1
    return assemble(
        trace, pol, config, timing, hits, times, preempt, run.num_steps, history if tuned else None
    )
