"""The fleet compiled: N replicas of the compiled engine on one clock, behind a router
that reads their loads (``least-loaded``, ``power-of-two``, ``cache-aware``).

The reference is the fleet runner's loop (:mod:`prefixlab.runner.fleet` over
:class:`~prefixlab.runner.engine.run.Run`); this kernel runs the same events in the same
order. Each replica's state is the compiled engine's (:mod:`prefixlab.runner.engine._kernel`:
its cache, its queues and scalars, ``Q``), moved on by the engine's own step functions;
per-request columns are shared (each request is served by one replica). At each instant:

1. the steps ending now complete, in the order they started (their answers, first tokens
   and ends, update the loads the router keeps; a closed loop's next turn is scheduled);
2. the arrivals due now are routed in the order they were scheduled
   (:mod:`prefixlab.routers._compiled`) and join their replica's waiting queue;
3. every idle replica, in index order, starts its next step.

Arrivals sit in one heap ordered by (time, order scheduled); steps and arrivals draw
their order from one counter, as the reference's event loop does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixlab._jit import jit
from prefixlab.routers._compiled import (
    KV_AWARE,
    evict_due,
    kv_finished,
    kv_route,
    kv_routed,
    route_one,
    routed_one,
)
from prefixlab.runner.engine._kernel import (
    IN_PAST,
    OK,
    RS_NDONE,
    RS_NFIRST,
    RS_NRUN,
    RS_WFED,
    RS_WLEN,
    RS_WMOD,
    TOO_BIG,
    UNFINISHED,
    arrive,
    end_step,
    heap_pop,
    heap_push,
    next_arrival,
    start_step,
)
from prefixlab.types import F64, I64

#: the fleet's arrays of loads (``loads``): outstanding requests, prefill tokens awaiting a
#: first token, steps run, per replica
LD_OUTSTANDING, LD_PREFILL, LD_STEPS = range(3)


@jit()
def _answer(
    i: int,
    now: float,
    Q: Any,
    L: tuple[I64, ...],
    answered: Any,
    loads: I64,
    finish_s: F64,
    code: int,
    kv: Any,
) -> None:
    """The answers of replica ``i``'s step that ended ``now``: first tokens, then ends, as
    the router learns them (a request's prompt leaves the prefill load once; ``kv-aware``
    keeps loads of its own, ``kv``)."""
    keys, key_offsets, inp, input_keys = L[0], L[1], L[4], L[6]
    active, _, prefill, uncached, _ = kv
    first_list, done_list, rs = Q[14], Q[13], Q[15]
    nf = rs[RS_NFIRST]
    for j in range(nf + rs[RS_NDONE]):
        r = first_list[j] if j < nf else done_list[j - nf]
        if not answered[r]:
            answered[r] = True
            loads[LD_PREFILL, i] -= inp[r]
            if code == KV_AWARE:
                prefill[i] -= uncached[r]
        if j >= nf:
            finish_s[r] = now
            loads[LD_OUTSTANDING, i] -= 1
            if code == KV_AWARE:
                kv_finished(active, i, keys, key_offsets[r], input_keys[r])


@jit()
def _route(
    r: int,
    now: float,
    k: int,
    code: int,
    par: F64,
    pairs: I64,
    trees: Any,
    next_evict: F64,
    kv: Any,
    loads: I64,
    L: tuple[I64, ...],
    bt: int,
) -> int:
    """The replica for request ``r``, the ``k``-th arrival routed, at ``now``."""
    k0, nk = L[1][r], L[6][r]
    if code == KV_AWARE:
        active, holds, prefill, _, overlap = kv
        return kv_route(par[0], prefill, active, holds, L[0], k0, nk, L[4][r], bt, overlap)
    evict_due(code, par, trees, next_evict, now)
    out, pre = loads[LD_OUTSTANDING], loads[LD_PREFILL]
    return route_one(code, par, k, now, out, pre, pairs, trees, L[0], k0, nk)


@jit()
def _ending(busy: Any, step_end: F64, step_seq: I64, now: float, order: I64) -> int:
    """The replicas whose step ends ``now`` into ``order``, in the order the steps started;
    their count."""
    m = 0
    for i in range(busy.shape[0]):
        if busy[i] and step_end[i] == now:
            j = m
            while j > 0 and step_seq[order[j - 1]] > step_seq[i]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = i
            m += 1
    return m


@jit()
def _start(
    reps: Any,
    i: int,
    now: float,
    rcode: int,
    spare: int,
    W: F64 | None,
    L: tuple[I64, ...],
    R: tuple[I64, ...],
    bt: int,
    max_free: int,
    cfg: I64,
    scheduled_s: F64,
    timing: tuple[I64, F64, F64, F64],
) -> tuple[int, float]:
    """Replica ``i`` starts its next step at ``now``: the status and the step's seconds
    (-1: nothing to run) (:func:`~prefixlab.runner.engine._kernel.start_step`)."""
    state, pp, ist, fst, nu, T, P, hx, lk, lkid, looked, Q = reps[i]
    status, duration, ist, fst, hx, lk, lkid, looked = start_step(
        now, state, pp, ist, fst, nu, T, P, rcode, spare, hx, W, lk, lkid, looked,
        L, R, Q, bt, max_free, cfg, scheduled_s, timing,
    )  # fmt: skip
    if W is not None or hx is not None:  # their state may have grown
        reps[i] = (state, pp, ist, fst, nu, T, P, hx, lk, lkid, looked, Q)
    return status, duration


@jit(nogil=True)
def fleet_kernel(
    reps: Any,
    L: tuple[I64, ...],
    R: tuple[I64, ...],
    times: tuple[F64, F64, F64, F64],
    sizes: I64,
    cfg: I64,
    W: F64 | None,
    plan: tuple[I64, F64, I64, F64, F64],
    timing: tuple[I64, F64, F64, F64],
    router: tuple[int, F64, I64, Any, F64, Any],
    replica: I64,
    loads: I64,
    rss: I64,
    out: I64,
    out_f: F64,
) -> None:
    """Serve every request on the replicas of ``reps`` (a list of one tuple per replica:
    block state, policy arguments, array policy state (ist, fst), next uses, radix tree
    and its policy's arguments, hybrid cache, its locks and window, queues ``Q``), routing
    each arrival as the router would (``router``: code, parameters, its draws made ahead,
    cache-aware's trees and next eviction, kv-aware's state: active blocks, the replicas'
    key tables, prefill loads, each request's uncached tokens, overlaps); each request's
    replica into ``replica``.
    ``rss``: the replicas' scalars, row i replica i's (its queues' last array is that row).

    ``sizes``: block tokens, capacity, most free blocks, radix policy code, spare pages.
    ``plan``: first arrivals (requests, times), next turns, think times, trace times.
    ``out`` and ``out_f`` as :func:`~prefixlab.runner.engine._kernel.engine_kernel`'s
    (evictions are not counted here: each replica's state holds its own)."""
    arrival_s, scheduled_s, first_token_s, finish_s = times
    init_req, init_t, next_turn, think_s, trace_arrival = plan
    code, par, pairs, trees, next_evict, kv = router
    bt, capacity, max_free, rcode, spare = sizes[0], sizes[1], sizes[2], sizes[3], sizes[4]
    keys, key_offsets, inp, input_keys = L[0], L[1], L[4], L[6]
    cwr, gated = cfg[3] != 0, cfg[4] != 0
    n, N = inp.shape[0], len(reps)
    answered = np.zeros(n, np.bool_)
    busy = np.zeros(N, np.bool_)
    step_end = np.zeros(N, np.float64)
    step_seq = np.zeros(N, np.int64)
    order = np.empty(N, np.int64)
    ht, hs, hr = np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    hn = np.zeros(1, np.int64)
    seq, routes = 0, 0
    for j in range(init_req.shape[0]):
        heap_push(ht, hs, hr, hn, init_t[j], seq, init_req[j])
        seq += 1
    out[0] = OK
    # open loop: no arrival is scheduled during the run, so at an instant with none due a
    # replica can start its next step right after its last ends (one fetch of its state)
    at_once = not (next_turn >= 0).any()
    tried = np.zeros(N, np.int64)  # at this instant: 1 started nothing, 2 a step
    while True:
        now = ht[0] if hn[0] > 0 else np.inf
        for i in range(N):
            if busy[i] and step_end[i] < now:
                now = step_end[i]
        if now == np.inf:
            break
        clock = now
        merge = at_once and not (hn[0] > 0 and ht[0] == now)
        for j in range(_ending(busy, step_end, step_seq, now, order)):
            i = order[j]
            busy[i] = False
            state, pp, ist, fst, nu, T, P, hx, lk, lkid, looked, Q = reps[i]
            ist, fst, hx = end_step(
                now, state, pp, ist, fst, nu, T, P, rcode, hx, W, lk, lkid, looked, L, R, Q,
                bt, max_free, cwr, first_token_s,
            )  # fmt: skip
            _answer(i, now, Q, L, answered, loads, finish_s, code, kv)
            out[4] += Q[15][RS_NDONE]
            for d in range(Q[15][RS_NDONE]):
                r = Q[13][d]
                if next_turn[r] >= 0:
                    at = next_arrival(next_turn[r], r, now, gated, think_s, trace_arrival)
                    if at < clock:
                        out[0] = IN_PAST
                        out_f[0], out_f[1] = at, clock
                        return
                    heap_push(ht, hs, hr, hn, at, seq, next_turn[r])
                    seq += 1
            if W is not None or hx is not None:  # their state may have grown
                reps[i] = (state, pp, ist, fst, nu, T, P, hx, lk, lkid, looked, Q)
            if merge:  # its step's order is drawn below, with the other replicas'
                status, duration = _start(
                    reps, i, now, rcode, spare, W, L, R, bt, max_free, cfg, scheduled_s, timing
                )
                if status != OK:
                    out[0] = status
                    return
                tried[i] = 1
                if duration >= 0:
                    tried[i], busy[i], step_end[i] = 2, True, now + duration
        while hn[0] > 0 and ht[0] == now:
            r = heap_pop(ht, hs, hr, hn)
            k0, nk = key_offsets[r], input_keys[r]
            i = _route(r, now, routes, code, par, pairs, trees, next_evict, kv, loads, L, bt)
            routes += 1
            replica[r] = i
            loads[LD_OUTSTANDING, i] += 1
            loads[LD_PREFILL, i] += inp[r]
            routed_one(code, trees, i, keys, k0, nk, now)
            if code == KV_AWARE:
                kv_routed(kv[2], kv[0], kv[3], r, i, keys, k0, nk, inp[r], bt, kv[4])
            arrival_s[r] = now
            if not arrive(r, inp, L[5], bt, capacity, R[0], reps[i][11]):
                out[0] = TOO_BIG
                out[1] = r
                return
        for i in range(N):  # every idle replica, in index order, starts its next step
            rs = rss[i]  # (one with nothing to run or feed starts nothing)
            if tried[i] == 2:  # started above: its step's order is drawn now
                tried[i] = 0
            elif tried[i] == 1:  # tried above: once an instant, as the reference
                tried[i] = 0
                continue
            elif busy[i] or not (rs[RS_WLEN] or rs[RS_NRUN] or rs[RS_WMOD] != rs[RS_WFED]):
                continue
            else:
                status, duration = _start(
                    reps, i, now, rcode, spare, W, L, R, bt, max_free, cfg, scheduled_s, timing
                )
                if status != OK:
                    out[0] = status
                    return
                if duration < 0:
                    continue
                busy[i], step_end[i] = True, now + duration
            step_seq[i] = seq
            seq += 1
            loads[LD_STEPS, i] += 1
    for i in range(N):
        if rss[i, RS_WLEN] or rss[i, RS_NRUN]:
            out[0] = UNFINISHED
