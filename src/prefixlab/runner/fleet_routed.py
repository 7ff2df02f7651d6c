"""The fleet on the compiled engine, for routers that read the replicas' loads.

``least-loaded``, ``power-of-two`` and ``cache-aware`` choose by what the router learns
as the run goes (requests outstanding, prompts awaiting a first token, its own tree of the
prompts it sent), so they cannot route ahead as :mod:`prefixlab.runner.fleet_split`
does; nor can ``round-robin`` and ``random`` in a closed loop, where the order of the
arrivals waits on the answers. Here every replica is the compiled engine's state and one kernel
(:mod:`prefixlab.runner.engine._fleet`) moves them all on one clock, routing each arrival
with the router compiled (:mod:`prefixlab.routers._compiled`). Results equal the reference
fleet's request by request (tested).

``kv-aware`` runs here too when it sees the replicas' KV events at once and draws
nothing (``event_delay=0``, ``router_temperature=0``, its defaults) on the block
structure: it then reads what each replica holds from the replica's own key table.

It applies when each replica can be the compiled engine (:func:`replicas_compile`), the
router has a compiled form (:meth:`~prefixlab.routers.base.Router.compiled`) and the
replicas' caches fit in memory
together: an array-state policy keeps a row per distinct key of the trace in each
replica (on the block and radix structures), so such a fleet needs about ``replicas``
times one engine's memory; the other policies' replicas take memory by their capacity
(the block structure then maps the keys it holds through a table) (:func:`routed_applies`
says).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from prefixlab._jit import COMPILED
from prefixlab.model.timing import TimingModel
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import EvictionPolicy, Policy
from prefixlab.routers._compiled import KV_AWARE
from prefixlab.routers.base import Router
from prefixlab.runner.engine.simulator import (
    EngineConfig,
    EngineResult,
    KernelCache,
    KernelOut,
    check_status,
    engine_inputs,
    first_arrivals,
    kernel_cache,
    prepare_policy,
    structure_config,
    timing_codes,
)
from prefixlab.runner.fleet_split import fleet_engine, replica_rows, replicas_compile
from prefixlab.runner.replay import ReplayConfig
from prefixlab.types import F64, I64, Row
from prefixlab.workload.trace import BlockLayout, Trace

#: the most bytes the replicas' rows per key of the trace may take together (beyond: the
#: reference loop), for the policies that keep them
KEY_ROWS_BUDGET = 8 << 30


def routed_applies(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    layout: BlockLayout,
    router: Router,
    timing: TimingModel,
    replicas: int,
) -> bool:
    """Whether the fleet of ``pol`` behind ``router`` runs on the compiled fleet kernel."""
    compiled = router.compiled()
    if compiled is None or not replicas_compile(trace, pol, config, layout, timing):
        return False
    rc = structure_config(trace, pol, config, layout)
    if compiled[0] == KV_AWARE and (rc is None or rc.structure != "block"):
        return False  # (kv-aware reads the replicas' key tables: the block structure's)
    if rc is None or not _array_state(pol, rc):  # (memory by capacity)
        return True
    return replicas * 48 * max(layout.num_distinct_keys, 1) <= KEY_ROWS_BUDGET


def _array_state(pol: Policy, rc: ReplayConfig) -> bool:
    """Whether the policy keeps state by key on ``rc``'s structure (an array-state
    policy: a row per key of the trace in each replica, on the block and radix
    structures alike)."""
    from prefixlab.runner._fast import ARRAY, engine_code
    from prefixlab.runner._fast_radix import radix_code

    assert isinstance(pol, EvictionPolicy)  # (the hybrid structure has no rc)
    if rc.structure == "radix":
        return radix_code(pol, engine=True) == ARRAY
    return engine_code(pol) == ARRAY


def _raw_keys(trace: Trace, pol: Policy, config: EngineConfig, layout: BlockLayout) -> bool:
    """Whether the replicas' block structures map their keys through a table (memory by
    capacity): for a policy that keeps no state by key."""
    rc = structure_config(trace, pol, config, layout)
    return rc is not None and rc.structure == "block" and not _array_state(pol, rc)


def simulate_routed(
    trace: Trace,
    pols: list[Policy],
    config: EngineConfig,
    layout: BlockLayout,
    router: Router,
    timing: TimingModel,
) -> tuple[EngineResult, I64, list[Row]]:
    """The fleet's result, each request's replica and a row per replica (see the module)."""
    from prefixlab.runner import _fast
    from prefixlab.runner.engine import _fleet, _kernel

    codes = timing_codes(timing)
    assert codes is not None
    _fast.warm_up()
    start = time.perf_counter()
    n = len(trace)
    o = KernelOut.empty(n)
    histories: list[list[tuple[int, float]]] = [[] for _ in pols]
    caches = [_cache(trace, pol, config, layout, h) for pol, h in zip(pols, histories, strict=True)]
    s = caches[0]
    L, cfg, W = engine_inputs(trace, pols[0], config, layout, s)
    rss = np.zeros((len(pols), _kernel.RS_SIZE), np.int64)
    reps = _replicas(caches, L, cfg, layout.block_tokens, rss)
    radix, hybrid = s.tree is not None, s.hybrid is not None
    outs = (o.first_hits, o.hit_blocks, o.miss_blocks, o.preempt)
    R = _kernel.request_columns(n, radix, hybrid, *outs)
    sizes = np.array([layout.block_tokens, s.cap, s.max_free, s.rcode, config.spare_blocks])
    replica = np.full(n, -1, np.int64)
    loads = np.zeros((3, len(pols)), np.int64)
    try:
        _fleet.fleet_kernel(
            reps, L, R, o.times, sizes, cfg, W, _plan(trace, config), codes,
            _router_args(router, n, caches), replica, loads, rss, o.out, o.out_f,
        )  # fmt: skip
    finally:
        _forget_tuners(caches)
    evictions = _finish(pols, caches, reps, o, (L[4], L[5], layout.block_tokens))
    tuned = None  # tuned Marconi's alphas, kept by one replica alone
    if len(pols) == 1 and hybrid and hasattr(pols[0], "current_alpha"):
        tuned = histories[0]
    steps = int(loads[_fleet.LD_STEPS].sum())
    engine = fleet_engine(trace, pols[0], config, timing, o, steps, evictions, tuned, start)
    return engine, replica, replica_rows(trace, engine, replica, evictions)


def _plan(trace: Trace, config: EngineConfig) -> tuple[I64, F64, I64, F64, F64]:
    """The arrivals: first requests and their times, next turns, think and trace times."""
    think, arrival = trace.think_s.astype(np.float64), trace.arrival_s.astype(np.float64)
    return (*first_arrivals(trace, config), think, arrival)


def _cache(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    layout: BlockLayout,
    history: list[tuple[int, float]],
) -> KernelCache:
    """One replica's compiled cache (its policy made ready for the trace)."""
    prepare_policy(pol, trace, layout)
    rc = structure_config(trace, pol, config, layout)
    raw = _raw_keys(trace, pol, config, layout)
    return kernel_cache(trace, pol, config, rc, layout, history, raw)


def _replicas(caches: list[KernelCache], L: tuple[I64, ...], cfg: I64, bt: int, rss: I64) -> Any:
    """The kernel's list of replicas: each one's cache, policy state and queues, whose
    scalars are row i of ``rss`` (a numba typed list when compiled, so that the kernel
    reads and replaces them in place)."""
    from prefixlab.runner.engine import _kernel

    inp, outp = L[4], L[5]
    reps: Any = _typed_list() if COMPILED else []
    for i, s in enumerate(caches):
        max_need, slots = _kernel.engine_sizes(inp, outp, bt, s.cap, int(cfg[0]))
        block = s.tree is None and s.hybrid is None
        Q = _kernel.replica_queues(inp.shape[0], slots, max_need, s.cap, block)
        rss[i] = Q[15]
        Q = (*Q[:15], rss[i])
        lk, lkid, looked = _kernel.hybrid_locks(s.hybrid)
        p = s.prep
        reps.append(
            (p.state, p.policy_args(), p.ist, p.fst, p.nu_pos, s.tree, s.radix_args, s.hybrid,
             lk, lkid, looked, Q)
        )  # fmt: skip
    return reps


def _router_args(
    router: Router, n: int, caches: list[KernelCache]
) -> tuple[int, F64, I64, Any, F64, Any]:
    """The router as the kernel takes it: code, parameters, its draws (made ahead, one
    row per arrival), cache-aware's trees (one per replica) and next eviction, kv-aware's
    state (active blocks, the replicas' key tables, prefill loads, uncached tokens per
    request, overlaps)."""
    compiled = router.compiled()
    assert compiled is not None
    code, par = compiled
    replicas = router.fleet.replicas
    holds: Any = _typed_list() if COMPILED else []
    for s in caches:
        holds.append((s.prep.state[5], s.prep.state[24]))
    if COMPILED:
        from numba import types
        from numba.typed import Dict, List

        value = types.Tuple((types.float64, types.int64))  # type: ignore[no-untyped-call]
        trees: Any = List([Dict.empty(types.int64, value) for _ in range(replicas)])
        active: Any = List([Dict.empty(types.int64, types.int64) for _ in range(replicas)])
    else:
        trees, active = [{} for _ in range(replicas)], [{} for _ in range(replicas)]
    first = par[3] if par.shape[0] > 3 else 0.0  # cache-aware's first cycle: one interval in
    kv = (active, holds, np.zeros(replicas), np.zeros(n, np.int64), np.zeros(replicas, np.int64))
    return code, par, router.draws(n), trees, np.array([first], np.float64), kv


def _typed_list() -> Any:
    from numba.typed import List

    return List()


def _forget_tuners(caches: list[KernelCache]) -> None:
    """Drop the tuners the replicas' hybrid caches registered (tuned Marconi)."""
    from prefixlab.runner._fast_hybrid import TUNERS

    for s in caches:
        TUNERS.pop(s.tid, None)


def _finish(
    pols: list[Policy],
    caches: list[KernelCache],
    reps: Any,
    o: KernelOut,
    sizes: tuple[I64, I64, int],
) -> list[int]:
    """Raise what the reference would had the kernel stopped short; give each array
    policy its end state; each replica's evictions."""
    from prefixlab.runner._fast_radix import EVICTED

    evictions = []
    for pol, s, rep in zip(pols, caches, reps, strict=True):
        check_status(pol, dataclasses.replace(s, hybrid=rep[7]), o, *sizes)
        if isinstance(pol, ArrayPolicy):
            pol.state = (rep[2], rep[3])
        if s.hybrid is not None:
            evictions.append(0)
        elif s.tree is not None:
            evictions.append(int(rep[5][13][EVICTED]))
        else:
            evictions.append(int(rep[0][23][3]))
    return evictions
