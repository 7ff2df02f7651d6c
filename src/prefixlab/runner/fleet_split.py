"""The fleet on the compiled engine, for routers that read nothing of the replicas.

A router whose choices depend only on the requests (``session``) or on them and the order
they arrive in (``round-robin``, ``random``), never on loads, answers or KV events
(:attr:`~prefixlab.routers.base.Router.depends_on`), routes the same whether or not the
replicas are simulated. The fleet is then N engines that never meet: the router runs
first, over the arrivals in the order the reference loop routes them, and each replica is
the compiled engine (:mod:`prefixlab.runner.engine._kernel`) given only its own arrivals,
writing its requests' times and hits into arrays the replicas share (each request is
written by one replica). The kernel releases the GIL, so the replicas run on threads, one
per core. Results equal the reference fleet's request by request (tested).

It applies when the compiled engine runs the structure, policy and timing; without tiers
(the store is shared, and tiers run on the reference loop) and without the sliding-window
rule; for an order-dependent router, with open-loop arrivals only (in a closed loop a
turn's arrival, and so the order, waits on the answers). :func:`split_applies` says.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np

from prefixlab.errors import CapacityError
from prefixlab.model.timing import TimingModel
from prefixlab.policies.base import Policy
from prefixlab.routers.base import Router
from prefixlab.runner.engine.simulator import (
    EngineConfig,
    EngineResult,
    KernelOut,
    assemble,
    compiled_path,
    first_arrivals,
    run_compiled,
    structure_config,
    timing_codes,
    windowed_model,
)
from prefixlab.types import B1, F64, I64, Row
from prefixlab.workload.trace import BlockLayout, Trace


def split_applies(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    layout: BlockLayout,
    router: Router,
    timing: TimingModel,
) -> bool:
    """Whether the fleet of ``pol`` behind ``router`` can run as compiled engines that
    never meet (see the module)."""
    if router.depends_on not in ("request", "order") or router.reads_kv_events:
        return False
    if router.depends_on == "order" and (config.closed_loop or config.gated):
        return False
    return replicas_compile(trace, pol, config, layout, timing)


def replicas_compile(
    trace: Trace, pol: Policy, config: EngineConfig, layout: BlockLayout, timing: TimingModel
) -> bool:
    """Whether each replica can be the compiled engine: its structure, policy and timing
    are ones it runs, with no tiers (the store is shared, and tiers run on the reference
    loop) and no sliding-window rule."""
    if config.tiers or windowed_model(config) is not None or timing_codes(timing) is None:
        return False
    return compiled_path(pol, structure_config(trace, pol, config, layout), (), 0)


def route_ahead(trace: Trace, config: EngineConfig, router: Router) -> tuple[I64, I64, F64, I64]:
    """Each first arrival's replica, in the order the reference loop routes them (time,
    then the order it scheduled them in), with the arrival plan: (replica of each request,
    -1 for one routed later in a closed loop, which follows its session; first requests,
    their times, next turns)."""
    first, times, next_turn = first_arrivals(trace, config)
    order = np.lexsort((np.arange(first.shape[0]), times))
    replica = np.full(len(trace), -1, np.int64)
    for k in order.tolist():
        r, t = int(first[k]), float(times[k])
        i = router.route(r, t)
        if not 0 <= i < router.fleet.replicas:
            raise AssertionError(f"router '{router.name}' chose replica {i}")
        replica[r] = i
        router.routed(r, i, t)
    for k in order.tolist():  # a closed loop's later turns: with their session
        r = int(first[k])
        while next_turn[r] >= 0:
            nxt = int(next_turn[r])
            replica[nxt] = router.route(nxt, float(trace.arrival_s[nxt]))
            if replica[nxt] != replica[r]:  # pragma: no cover - a router that is not sticky
                raise AssertionError(f"router '{router.name}' split a session")
            r = nxt
    return replica, first, times, next_turn


def simulate_split(
    trace: Trace,
    pols: list[Policy],
    config: EngineConfig,
    layout: BlockLayout,
    router: Router,
    timing: TimingModel,
) -> tuple[EngineResult, I64, list[Row]]:
    """The fleet's result, each request's replica and a row per replica (see the module)."""
    codes = timing_codes(timing)
    assert codes is not None
    start = time.perf_counter()
    replica, first, times, next_turn = route_ahead(trace, config, router)
    o = KernelOut.empty(len(trace))
    outs = [dataclasses.replace(o, out=np.zeros(5, np.int64), out_f=np.zeros(2)) for _ in pols]

    history: list[list[tuple[int, float]] | None] = [None] * len(pols)

    def serve(i: int) -> None:
        mine = replica[first] == i
        plan = (first[mine], times[mine], next_turn)
        rc = structure_config(trace, pols[i], config, layout)
        history[i] = run_compiled(trace, pols[i], config, rc, layout, codes, plan, outs[i])

    _run_all(serve, outs, trace)
    steps = sum(int(x.out[2]) for x in outs)
    tuned = history[0] if len(pols) == 1 else None  # tuned Marconi's alphas: one replica's
    evictions = [int(x.out[3]) for x in outs]
    engine = fleet_engine(trace, pols[0], config, timing, o, steps, evictions, tuned, start)
    return engine, replica, replica_rows(trace, engine, replica, evictions)


def fleet_engine(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    timing: TimingModel,
    o: KernelOut,
    steps: int,
    evictions: list[int],
    tuned: list[tuple[int, float]] | None,
    start: float,
) -> EngineResult:
    """The engine's result over the whole fleet, from the compiled replicas' outputs
    (``o``, which they share), their steps and evictions; ``start`` its clock."""
    hits = o.metrics(len(trace))
    hits.num_evictions = sum(evictions)
    engine = assemble(trace, pol, config, timing, hits, o.times, o.preempt, steps, tuned)
    engine.metrics["elapsed_s"] = time.perf_counter() - start
    return engine


def replica_rows(
    trace: Trace, engine: EngineResult, replica: I64, evictions: list[int]
) -> list[Row]:
    """A row per replica (:func:`replica_row`)."""
    wait = engine.first_token_s - engine.arrival_s
    return [
        replica_row(trace, replica == i, engine.hit_tokens, wait, e, i)
        for i, e in enumerate(evictions)
    ]


def _run_all(serve: Callable[[int], None], outs: list[KernelOut], trace: Trace) -> None:
    """``serve(i)`` for every replica, on threads. Of the replicas refused for a request
    too big for the pool, the error of the earliest arrival (ties: the lower request
    index, the reference's order for open-loop arrivals at one instant): the one the
    reference loop, which serves them all on one clock, raises."""
    workers = max(1, min(len(outs), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(serve, i) for i in range(len(outs))]
    errors: list[tuple[float, int, CapacityError]] = []  # (arrival, request, error)
    for i, f in enumerate(futures):
        exc = f.exception()
        if isinstance(exc, CapacityError):  # the kernel left the request in out[1] and
            r = int(outs[i].out[1])  # its arrival (a closed loop's, not the trace's) in times
            errors.append((float(outs[i].times[0][r]), r, exc))
        elif exc is not None:
            raise exc
    if errors:
        raise min(errors, key=lambda e: (e[0], e[1]))[2]


def replica_row(trace: Trace, mine: B1, hit_tokens: I64, wait: F64, evictions: int, i: int) -> Row:
    """Replica ``i``'s row: the requests it served (``mine``), their token hit ratio and
    mean arrival-to-first-token time (``wait``, per request), its evictions."""
    inp = int(trace.input_length[mine].sum())
    wait = wait[mine]
    return {
        "replica": i,
        "num_requests": int(mine.sum()),
        "token_hit_ratio": float(hit_tokens[mine].sum()) / inp if inp else 0.0,
        "mean_ttft_s": float(wait.mean()) if wait.shape[0] else float("nan"),
        "num_evictions": evictions,
    }
