"""The engine runner compiled: event loop, scheduler and cache in one kernel.

:mod:`prefixlab.runner.engine.simulator` (the event loop), ``scheduler.py`` (continuous
batching) and ``cache/block.py`` or ``cache/radix.py`` (the cache) are the reference; this
kernel runs the same simulation over arrays, step for step, for the block structure and
every policy the block kernel runs (:mod:`prefixlab.runner._fast`, whose per-operation
functions it calls: match, pin, take, commit, release), for the radix structure and every
policy the radix kernel runs (:mod:`prefixlab.runner._fast_radix`'s ``rx_*`` functions),
for the hybrid structure and every built-in hybrid policy (``runner/engine/hybrid.py``'s
byte budget over :mod:`prefixlab.runner._fast_hybrid`'s tree: its ``hy_*`` functions;
tuned Marconi's tuner is called back in Python, the one step that leaves the kernel),
and the power, table, tpot and roofline timing models. Tests
check it gives the reference's times, hits and preemptions to the last bit. It applies
when nothing else must see the simulation (no observers, no invariant checks). The
policies that read the waiting queue (``opt-online``, ``unicache-opt``) run here too:
before each step's admissions, when the queue changed, the kernel hands them the waiting
requests' lookup keys in queue order, as the scheduler's ``on_waiting`` does.

State, per request: its phase, tokens computed and generated, blocks held (a row of
``held`` while it runs), keys committed, hits at admission. The waiting queue is a ring
(a preempted request goes back to its front), the running list an array kept in admission
order. Events: at most one step is in flight (its end is a number), arrivals sit in a
binary heap ordered by (time, order scheduled), so a step's end comes before arrivals at
the same instant and arrivals keep the reference's order::

    arrivals heap --> add --> waiting ring --> admit --> running list --> step end
                                   ^                          |
                                   +------- preempt ----------+

The fleet's kernel (:mod:`prefixlab.runner.engine._fleet`) runs this loop's body for each
of its replicas through :func:`end_step`, :func:`arrive` and :func:`start_step`, which
repeat it over one replica's state (both copies are tested against the reference loop).
``engine_kernel`` keeps its own: calling those functions made it about nine times slower
(130,000 against 14,000 requests/s on 20,000 Mooncake requests in a one-off A/B of the
two builds, not a ``benchmarks/`` run), each call increfing and
decrefing every array of its ~80 arguments, and numba's calls without reference counts
refuse functions that allocate, as the hybrid and LPC paths do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixlab._jit import jit
from prefixlab.model.timing import power_batch_s, power_fresh_tokens, table_s
from prefixlab.policies._arrays import FS, NOW, REQ, SC
from prefixlab.policies._dispatch import (
    OPT_ONLINE,
    UNICACHE,
    reserve,
    waiting_add,
    waiting_begin,
    waiting_end,
)
from prefixlab.policies.hooks.unicache import UCOPT
from prefixlab.runner._fast import (
    ARRAY,
    BlockState,
    PolicyArgs,
    announce_misses,
    commit_blocks,
    match_blocks,
    num_hit_free,
    pin_hits,
    release_blocks,
    take_blocks,
)
from prefixlab.runner._fast_hybrid import (
    C_KV,
    C_TUNES,
    E_LOOKED,
    E_NEED,
    E_RESERVED,
    hy_acquire,
    hy_admit,
    hy_close,
    hy_drop_hit,
    hy_grown,
    hy_make_room,
    hy_reuse,
    hy_slots_for,
    hy_tune,
    widened,
)
from prefixlab.runner._fast_radix import (
    EVICTED,
    Tree,
    rx_acquire,
    rx_commit,
    rx_grow_room,
    rx_keep_free,
    rx_release,
    rx_reserve,
    rx_room,
    rx_walk,
)
from prefixlab.types import F64, I64

WAITING, PREFILL, DECODE, DONE = 1, 2, 3, 4
#: timing codes: prefill none / power law / table / roofline; decode none / constant TPOT /
#: roofline; tcode[2] = 1 when one roofline prices the whole mixed step
T_NONE, T_POWER, T_TABLE, T_TPOT = 0, 1, 2, 1
T_ROOF_PREFILL, T_ROOF_DECODE = 3, 2
#: a roofline's integers in tcode (from TC_E on) and floats in tpar (from TP_MODEL on):
#: see simulator.timing_codes, which writes them from the ModelSpec and GPU
TC_E, TC_K, TC_MOE_LAYERS, TC_KV, TC_STATE, TC_SWA_KV, TC_WINDOW = range(3, 10)
TP_MODEL = 4  # d, d_kv, d_q, intermediate, mlp matrices, moe intermediate, k, E, d_inner,
# d_state, then the four layer counts (attention, mlp, moe, ssm), peak, mfu, bandwidth, mbu,
# then the weights (ModelSpec.weight_units: total, per expert, scale, divisor), the shared
# experts' intermediate size, the SSM input projection, sliding layers and their window,
# decode's D_q and D_kv, and MLA's FLOPs per cached token in prefill
TP_WEIGHTS = TP_MODEL + 18
TP_EXTRA = TP_MODEL + 22
TP_SIZE = TP_MODEL + 29
#: statuses in out[0]: finished; a request larger than the pool (out[1]); an event before
#: the clock (out_f[0]); requests left unfinished; a policy that found no victim although
#: pages were evictable (radix)
OK, TOO_BIG, IN_PAST, UNFINISHED, NO_VICTIM = 0, 1, 2, 3, 4


@jit(inline=True)
def heap_push(ht: F64, hs: I64, hr: I64, hn: I64, t: float, seq: int, r: int) -> None:
    i = hn[0]
    hn[0] = i + 1
    while i > 0:
        p = (i - 1) // 2
        if ht[p] < t or (ht[p] == t and hs[p] < seq):
            break
        ht[i], hs[i], hr[i] = ht[p], hs[p], hr[p]
        i = p
    ht[i], hs[i], hr[i] = t, seq, r


@jit(inline=True)
def heap_pop(ht: F64, hs: I64, hr: I64, hn: I64) -> int:
    r = hr[0]
    n = hn[0] - 1
    hn[0] = n
    t, seq, last = ht[n], hs[n], hr[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hs[c + 1] < hs[c])):
            c += 1
        if t < ht[c] or (t == ht[c] and seq < hs[c]):
            break
        ht[i], hs[i], hr[i] = ht[c], hs[c], hr[c]
        i = c
    if n > 0:
        ht[i], hs[i], hr[i] = t, seq, last
    return int(r)


@jit()
def _compact_locks(
    lk: I64, lkid: I64, lkat: I64, lkn: I64, running: I64, nrun: int, extra: int
) -> tuple[I64, I64, int]:
    """The running requests' locked nodes moved to the front of new arrays with room for
    ``extra`` more; the new arrays and the first free place."""
    live = 0
    for i in range(nrun):
        live += lkn[running[i]]
    size = max(2 * (live + extra), 64)
    nlk, nid = np.empty(size, np.int64), np.empty(size, np.int64)
    top = 0
    for i in range(nrun):
        r = running[i]
        for j in range(lkn[r]):
            nlk[top + j], nid[top + j] = lk[lkat[r] + j], lkid[lkat[r] + j]
        lkat[r] = top
        top += lkn[r]
    return nlk, nid, top


@jit(nrt=False)
def roof_prefill_flops(tp: F64, new: int, cached: int, decode: bool = False) -> float:
    """``ModelSpec.total_prefill_flops(new, cached, causal=True)`` (``decode``: its
    ``decode_flops(cached, True)``): the same formula, the same operations in the same
    order (so the same bits)."""
    if new <= 0:
        return 0.0
    n, p = float(new), float(cached)
    b = TP_MODEL
    d, d_kv, d_q = tp[b], tp[b + 1], tp[b + 2]
    if decode:  # MLA's absorbed attention has its own D_q and D_kv
        d_q, d_kv = tp[TP_EXTRA + 4], tp[TP_EXTRA + 5]
    square = 2 * n * n * d_q
    proj = 2 * n * d * (2 * d_q + 2 * d_kv)
    attn = proj + 4 * n * p * d_q + square
    if not decode and tp[TP_EXTRA + 6] > 0:  # MLA prefill up-projects the cached latents
        attn = attn + tp[TP_EXTRA + 6] * p
    mlp = 2 * n * d * tp[b + 3] * tp[b + 4]
    x = TP_EXTRA
    attention = (tp[b + 10] - tp[x + 2]) * attn
    if tp[x + 2] > 0:  # sliding-window layers (ModelSpec._flops, _window_pairs causal)
        w, after = tp[x + 3], p + n
        g_after = after * after / 2 if after <= w else w * after - w * w / 2
        g_before = p * p / 2 if p <= w else w * p - w * w / 2
        attention = attention + tp[x + 2] * (proj + 4 * d_q * (g_after - g_before))
    moe = 2 * n * d * tp[b + 5] * tp[b + 4] * tp[b + 6]
    moe += 2 * n * d * tp[b + 7]
    if tp[x] > 0:
        moe += 2 * n * d * tp[x] * tp[b + 4]
    di, ns = tp[b + 8], tp[b + 9]
    if tp[x + 1] > 0:
        ssm = 2 * n * d * tp[x + 1] + 2 * n * di * d + 8 * n * di * ns + 5 * n * di
    else:
        ssm = 2 * n * d * 2 * di + 2 * n * di * d + 8 * n * di * ns + 5 * n * di
    total: float = 0.0
    total += attention
    total += tp[b + 11] * mlp
    total += tp[b + 12] * moe
    total += tp[b + 13] * ssm
    return total


@jit()
def roof_weights(tc: I64, tp: F64, num_tokens: int) -> float:
    """``Roofline._weights``: bytes of the weights a step over num_tokens tokens reads
    (``ModelSpec.weight_bytes_read``: MoE experts touched in expectation)."""
    w = TP_WEIGHTS
    e, k = tc[TC_E], tc[TC_K]
    total: float = tp[w] * tp[w + 2]
    if e:
        touched = e * (1.0 - (1.0 - k / e) ** float(max(num_tokens, 1)))
        idle = (e - touched) * tp[w + 1] * tc[TC_MOE_LAYERS]
        total = round(tp[w] - idle) * tp[w + 2]
    out: float = total / tp[w + 3]
    return out


@jit(inline=True)
def _kv_read(tc: I64, context: int) -> int:
    """``ModelSpec.kv_bytes_read``: sliding-window layers read only their window."""
    return int(context * tc[TC_KV] + min(context, tc[TC_WINDOW]) * tc[TC_SWA_KV])


@jit()
def roofline_s(tc: I64, tp: F64, cn: I64, cc: I64, nch: int, dctx: I64, ndec: int) -> float:
    """``Roofline.step_s`` of chunks (new cn, cached cc)[:nch] and decode contexts
    dctx[:ndec] (with one of them empty: ``prefill_s`` or ``decode_s``)."""
    flops, kv, tokens = 0.0, 0, 0
    for i in range(nch):
        flops += roof_prefill_flops(tp, cn[i], cc[i])
        kv += _kv_read(tc, cn[i] + cc[i])
        tokens += cn[i]
    dflops, dkv = 0.0, 0
    for i in range(ndec):
        dflops += roof_prefill_flops(tp, 1, dctx[i], True)
        dkv += _kv_read(tc, dctx[i])
    if not nch and not ndec:
        return 0.0
    if not nch:  # decode_s
        return _roof_time(tp, dflops, roof_weights(tc, tp, ndec) + dkv + ndec * tc[TC_STATE])
    if ndec:  # step_s: one sum of each, then together
        flops += dflops
        kv += dkv
        kv += ndec * tc[TC_STATE]
        tokens += ndec
    return _roof_time(tp, flops, roof_weights(tc, tp, tokens) + kv)


@jit(nrt=False)
def _roof_time(tp: F64, flops: float, num_bytes: float) -> float:
    b = TP_MODEL + 14
    compute: float = flops / (tp[b] * tp[b + 1])
    memory: float = num_bytes / (tp[b + 2] * tp[b + 3])
    return max(compute, memory)


@jit()
def step_seconds(
    tcode: I64,
    tpar: F64,
    tt: F64,
    ts: F64,
    cn: I64,
    cc: I64,
    cd: I64,
    nch: int,
    ndec: int,
    dctx: I64,
) -> float:
    """One step's seconds (``Composite.step_s``): chunks (new, cached, done) in cn, cc,
    cd[:nch], decode contexts dctx[:ndec]; a power, table or roofline prefill and a tpot or
    roofline decode, or one roofline for the whole step (tcode[2])."""
    if tcode[2]:
        return roofline_s(tcode, tpar, cn, cc, nch, dctx, ndec)
    pre = 0.0
    if nch and tcode[0] == T_ROOF_PREFILL:
        pre = roofline_s(tcode, tpar, cn, cc, nch, dctx, 0)
    elif nch and tcode[0] == T_POWER:
        total = 0.0
        for i in range(nch):
            total += power_fresh_tokens(float(cn[i]), float(cd[i]), tpar[2])
        pre = power_batch_s(tpar[0], tpar[1], tpar[2], nch, total)
    elif nch and tcode[0] == T_TABLE:
        for i in range(nch):
            if cn[i] <= 0:
                continue
            d = cd[i]
            if d:
                pre += table_s(tt, ts, float(d + cn[i])) - table_s(tt, ts, float(d))
            else:
                pre += table_s(tt, ts, float(cn[i]))
    dec = 0.0
    if ndec and tcode[1] == T_TPOT:
        dec = tpar[3]
    elif ndec and tcode[1] == T_ROOF_DECODE:
        dec = roofline_s(tcode, tpar, cn, cc, 0, dctx, ndec)
    return pre + dec


#: a replica's scalars (``rs``, the last array of its queues ``Q``): the waiting ring's
#: head and length, its changes and the change last fed to a policy that reads the queue,
#: running requests, free slots, the top of the hybrid lock stack, the cache view's
#: request, the chunks and decodes of the batch in flight, and the requests its last step
#: finished and answered (their first token) in ``Q``'s done and first lists
RS_WHEAD, RS_WLEN, RS_WMOD, RS_WFED, RS_NRUN, RS_NFREE, RS_LKTOP, RS_CUR = range(8)
RS_NCH, RS_NDEC, RS_NDONE, RS_NFIRST, RS_SIZE = 8, 9, 10, 11, 12


@jit()
def engine_sizes(inp: I64, outp: I64, bt: int, capacity: int, max_seqs: int) -> tuple[int, int]:
    """The most blocks a running request can hold (more: refused on arrival) and the
    running requests' slots."""
    n = inp.shape[0]
    max_need = 1
    for r in range(n):
        need = -(-(inp[r] + outp[r]) // bt)
        max_need = max(max_need, min(need, capacity))
    return max_need, max(min(max_seqs, n), 1)


@jit()
def request_columns(
    n: int, radix: bool, hybrid: bool, first_hits: I64, hit_blocks: I64, miss_blocks: I64,
    preempt: I64,
) -> tuple[I64, ...]:  # fmt: skip
    """Per request (``R``): phase, tokens computed, prompt length, tokens generated, blocks
    held, keys committed, hits at admission, slot; the radix handle (path end, reserved
    pages); the hybrid reservation and locks (bytes, first lock, locks); then the outputs
    (hits, hit and missed blocks, preemptions)."""
    nr = n if radix else 0
    nh = n if hybrid else 0
    return (
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.full(n, -1, np.int64),
        np.zeros(nr, np.int64),
        np.zeros(nr, np.int64),
        np.zeros(nh, np.int64),
        np.zeros(nh, np.int64),
        np.zeros(nh, np.int64),
        first_hits,
        hit_blocks,
        miss_blocks,
        preempt,
    )


@jit()
def replica_queues(
    n: int, slots: int, max_need: int, capacity: int, block: bool
) -> tuple[Any, ...]:  # Any: a 2-D array then 1-D ones
    """One replica's queues (``Q``): block ids per running request's slot (the block
    structure's; the radix tree keeps its own), free slots, scratch for victims, released
    and matched blocks, the waiting ring, the running list (in admission order), the batch
    in flight (chunks: request, new tokens, cached, done; decodes: request, context), the
    requests its last step finished and answered, and its scalars (``RS_*``)."""
    m = max(capacity, max_need) if block else 0
    rs = np.zeros(RS_SIZE, np.int64)
    rs[RS_NFREE] = slots
    rs[RS_WFED] = -1
    return (
        np.empty((slots, max_need if block else 0), np.int64),
        np.arange(slots - 1, -1, -1).astype(np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(max_need, np.int64),
        np.empty(n + 1, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        np.empty(slots, np.int64),
        rs,
    )


@jit()
def arrive(r: int, inp: I64, outp: I64, bt: int, capacity: int, phase: I64, Q: Any) -> bool:
    """Request ``r`` joins the waiting ring's tail; False when it can never fit."""
    if -(-(inp[r] + outp[r]) // bt) > capacity:
        return False
    wq, rs = Q[5], Q[15]
    phase[r] = WAITING
    wq[(rs[RS_WHEAD] + rs[RS_WLEN]) % wq.shape[0]] = r
    rs[RS_WLEN] += 1
    rs[RS_WMOD] += 1
    return True


@jit(inline=True)
def _array_policy(pp: PolicyArgs, T: Tree | None, P: Any, rcode: int, H: Any) -> tuple[bool, int]:
    """Whether the structure's policy is an array-state one (never on the hybrid
    structure), and its code."""
    if H is not None:
        return False, -1
    if T is not None:
        return rcode == ARRAY, int(P[26])
    return pp[0] == ARRAY, int(pp[5])


@jit()
def end_step(
    now: float,
    state: BlockState,
    pp: PolicyArgs,
    ist: I64,
    fst: F64,
    nu_pos: F64,
    T: Tree | None,
    P: Any,
    rcode: int,
    H: Any,
    W: F64 | None,
    lk: I64,
    lkid: I64,
    looked: I64,
    L: tuple[I64, ...],
    R: tuple[I64, ...],
    Q: Any,
    bt: int,
    max_free: int,
    cwr: bool,
    first_token_s: F64,
) -> tuple[I64, F64, Any]:
    """Complete the batch in flight at ``now``: chunks computed (their full prompt blocks
    cached while running, with ``cwr``), first tokens, decodes; then the finished requests
    cache every key, release their blocks and leave. Returns the array policy's state
    and the hybrid cache (either may have grown); the requests answered and finished are
    in ``Q``'s first and done lists. See :func:`engine_kernel` for the arguments."""
    keys, key_offsets, _, _, inp, outp, input_keys = L
    phase, computed, prompt_len, generated, nblocks, committed = R[:6]
    slot, rlast, rres, hres, lkat, lkn = R[7:13]
    held, free_slots, victims, released = Q[:4]
    running, cr, cn = Q[6], Q[7], Q[8]
    dr, done_list, first_list, rs = Q[11], Q[13], Q[14], Q[15]
    array, acode = _array_policy(pp, T, P, rcode, H)
    hx = H  # the hybrid cache, which grows (H itself is never reassigned: see the kernel)
    nrun, nfree_slots, cur_req = rs[RS_NRUN], rs[RS_NFREE], rs[RS_CUR]
    ndone, nfirst = 0, 0
    for i in range(rs[RS_NCH]):
        r = cr[i]
        if phase[r] != PREFILL:
            continue
        computed[r] += cn[i]
        if cwr:  # cache the prompt's full blocks now
            upto = min(min(computed[r], inp[r]) // bt, input_keys[r])
            if upto > committed[r]:
                cur_req = r
                if array:
                    if W is not None:  # only LPC's records widen the state
                        ist, fst = reserve(acode, ist, fst, upto - committed[r] + 2)
                    ist[SC, REQ] = r
                    fst[FS, NOW] = now
                if T is None:
                    commit_blocks(
                        state,
                        held[slot[r]],
                        keys,
                        key_offsets[r],
                        committed[r],
                        upto,
                        now,
                        pp,
                        ist,
                        fst,
                    )
                else:
                    P[19][0] = r
                    rlast[r], rres[r] = rx_commit(
                        keys, key_offsets[r], upto, rlast[r], rres[r], T, rcode, P, ist, fst, 0, 0
                    )
                committed[r] = upto
        if computed[r] < prompt_len[r]:
            continue
        if generated[r] == 0:
            first_token_s[r] = now
            first_list[nfirst] = r
            nfirst += 1
        if outp[r] > 0:
            generated[r] += 1
        phase[r] = DECODE
        if generated[r] >= outp[r]:
            done_list[ndone] = r
            ndone += 1
    for i in range(rs[RS_NDEC]):
        r = dr[i]
        if phase[r] != DECODE:
            continue
        generated[r] += 1
        if generated[r] >= outp[r]:
            done_list[ndone] = r
            ndone += 1
    for i in range(ndone):  # finish: cache every key, release, leave
        r = done_list[i]
        cur_req = r
        k0 = key_offsets[r]
        nk = key_offsets[r + 1] - k0
        s = slot[r]
        if array:
            if W is not None:  # only LPC's records widen the state
                ist, fst = reserve(acode, ist, fst, nk + nblocks[r] + 2)
            ist[SC, REQ] = r
            fst[FS, NOW] = now
        if H is not None:  # return its bytes, then admit its sequence
            hy_close(hx, lk, lkid, lkat[r], lkn[r], hres[r])
            hres[r] = 0
            lkn[r] = 0
            if looked.shape[0]:
                hy_tune(hx, looked)
            more = hy_slots_for(hx, r)
            if more:
                hx = hy_grown(hx, more)
            hy_admit(hx, r)
        elif T is None:
            commit_blocks(state, held[s], keys, k0, committed[r], nk, now, pp, ist, fst)
            release_blocks(
                state,
                held[s],
                nblocks[r],
                r,
                nu_pos,
                k0,
                max_free,
                pp,
                ist,
                fst,
                released,
                victims,
            )
        else:
            P[19][0] = r
            last, res = rx_commit(keys, k0, nk, rlast[r], rres[r], T, rcode, P, ist, fst, 0, 0)
            rx_release(last, res, T, rcode, P, ist, fst)
            rres[r] = 0
        free_slots[nfree_slots] = s
        nfree_slots += 1
        slot[r] = -1
        nblocks[r] = 0
        phase[r] = DONE
        j = 0
        while running[j] != r:
            j += 1
        for m in range(j, nrun - 1):
            running[m] = running[m + 1]
        nrun -= 1
    rs[RS_NRUN], rs[RS_NFREE], rs[RS_CUR] = nrun, nfree_slots, cur_req
    rs[RS_NDONE], rs[RS_NFIRST] = ndone, nfirst
    return ist, fst, hx


@jit()
def start_step(
    now: float,
    state: BlockState,
    pp: PolicyArgs,
    ist: I64,
    fst: F64,
    nu_pos: F64,
    T: Tree | None,
    P: Any,
    rcode: int,
    spare: int,
    H: Any,
    W: F64 | None,
    lk: I64,
    lkid: I64,
    looked: I64,
    L: tuple[I64, ...],
    R: tuple[I64, ...],
    Q: Any,
    bt: int,
    max_free: int,
    cfg: I64,
    scheduled_s: F64,
    timing: tuple[I64, F64, F64, F64],
) -> tuple[int, float, I64, F64, Any, I64, I64, I64]:
    """Start a step at ``now``: running requests first (a decode that needs a block it
    cannot get preempts the most recently admitted), then admissions from the waiting
    ring. Returns the status (``OK``, ``NO_VICTIM``), the step's seconds (-1: nothing to
    run) and what may have grown: the array policy's state, the hybrid cache, its locks
    and tuned Marconi's window. See :func:`engine_kernel` for the arguments."""
    keys, key_offsets, num_lookup, lookup_end, inp, outp, _ = L
    phase, computed, prompt_len, generated, nblocks, committed, admit_hits, slot = R[:8]
    rlast, rres, hres, lkat, lkn = R[8:13]
    first_hits, hit_blocks, miss_blocks, num_preemptions = R[13:]
    held, free_slots, victims, released, mblocks, wq, running = Q[:7]
    cr, cn, cc, cd, dr, dctx, _, _, rs = Q[7:]
    max_seqs, budget, chunked = cfg[0], cfg[1], cfg[2] != 0
    array, acode = _array_policy(pp, T, P, rcode, H)
    hx = H  # the hybrid cache, which grows (H itself is never reassigned: see the kernel)
    sc = state[23]
    no_nu = nu_pos[:0]  # a preemption releases at another request's index: look next uses up
    m = wq.shape[0]
    whead, wlen, wmod, wfed = rs[RS_WHEAD], rs[RS_WLEN], rs[RS_WMOD], rs[RS_WFED]
    nrun, nfree_slots, lktop, cur_req = rs[RS_NRUN], rs[RS_NFREE], rs[RS_LKTOP], rs[RS_CUR]
    # a policy that reads the waiting queue
    waits = array and (acode == OPT_ONLINE or (acode == UNICACHE and ist[SC, UCOPT] == 1))
    nch, ndec = 0, 0
    preempted = False
    if T is not None and spare:  # SGLang: a free page per decoding request
        ndecoding = 0
        for i in range(nrun):
            if phase[running[i]] == DECODE:
                ndecoding += 1
        if ndecoding:
            if array:
                if W is not None:  # only LPC's records widen the state
                    ist, fst = reserve(acode, ist, fst, 2)
                ist[SC, REQ] = cur_req
                fst[FS, NOW] = now
            P[19][0] = cur_req
            rx_keep_free(spare * ndecoding, T, rcode, P, ist, fst)
    i = 0
    while i < nrun and budget > 0:
        r = running[i]
        if phase[r] == PREFILL:
            c = min(prompt_len[r] - computed[r], budget)
            if not chunked and c < prompt_len[r] - computed[r]:
                i += 1
                continue
            cr[nch], cn[nch], cc[nch] = r, c, computed[r]
            nch += 1
            budget -= c
        else:
            # Only a decode that crosses into a new block needs memory.
            g = min(generated[r] + 1, outp[r])
            if inp[r] + g > nblocks[r] * bt:
                more = -(-(inp[r] + min(generated[r] + 1, outp[r])) // bt) - nblocks[r]
                gone = False
                while more > 0:
                    if H is not None:
                        grown = hy_make_room(hx, more * bt * hx[3][C_KV])
                    else:
                        grown = more <= (sc[1] + sc[2] if T is None else rx_grow_room(T))
                    if grown:
                        if array:
                            if W is not None:  # only LPC's records widen the state
                                ist, fst = reserve(acode, ist, fst, more)
                            ist[SC, REQ] = cur_req
                            fst[FS, NOW] = now
                        if H is not None:
                            hx[7][E_RESERVED] += more * bt * hx[3][C_KV]
                            hres[r] += more * bt * hx[3][C_KV]
                        elif T is None:
                            take_blocks(
                                state,
                                more,
                                held[slot[r]],
                                nblocks[r],
                                cur_req,
                                pp,
                                ist,
                                fst,
                                victims,
                            )
                        else:
                            P[19][0] = cur_req
                            if not rx_reserve(more, spare, T, rcode, P, ist, fst):
                                return NO_VICTIM, -1.0, ist, fst, hx, lk, lkid, looked
                            rres[r] += more
                        nblocks[r] += more
                        break
                    # preempt the most recently admitted request
                    v = running[nrun - 1]
                    if array:
                        if W is not None:  # only LPC's records widen the state
                            ist, fst = reserve(acode, ist, fst, nblocks[v])
                        ist[SC, REQ] = cur_req
                        fst[FS, NOW] = now
                    if H is not None:
                        hy_close(hx, lk, lkid, lkat[v], lkn[v], hres[v])
                        hres[v] = 0
                        lkn[v] = 0
                    elif T is None:
                        release_blocks(
                            state,
                            held[slot[v]],
                            nblocks[v],
                            cur_req,
                            no_nu,
                            key_offsets[v],
                            max_free,
                            pp,
                            ist,
                            fst,
                            released,
                            victims,
                        )
                    else:
                        P[19][0] = cur_req
                        rx_release(rlast[v], rres[v], T, rcode, P, ist, fst)
                        rres[v] = 0
                    free_slots[nfree_slots] = slot[v]
                    nfree_slots += 1
                    slot[v] = -1
                    nblocks[v] = 0
                    computed[v] = 0
                    phase[v] = WAITING
                    nrun -= 1
                    whead = (whead - 1) % m
                    wq[whead] = v
                    wlen += 1
                    wmod += 1
                    num_preemptions[v] += 1
                    preempted = True
                    if v == r:
                        gone = True
                        break
                if gone:
                    continue  # r itself was preempted: the list shifted
            dr[ndec], dctx[ndec] = r, inp[r] + generated[r]
            ndec += 1
            budget -= 1
        i += 1
    if not preempted:
        if waits and wmod != wfed:
            # the waiting queue, as on_waiting gives it (only when it changed: the same
            # queue again changes nothing)
            wfed = wmod
            if T is None:
                ekey, edepth = state[4], state[13]  # the entries' keys and depths
            else:
                ekey, edepth = P[16], P[13]
            waiting_begin(acode, ist)
            for w in range(wlen):
                rw = wq[(whead + w) % m]
                for j in range(key_offsets[rw], key_offsets[rw] + num_lookup[rw]):
                    waiting_add(acode, ist, fst, keys[j], w, ekey, edepth)
            waiting_end(acode, ist, fst, ekey, edepth)
        while wlen > 0 and budget > 0 and nrun < max_seqs:
            r = wq[whead]
            cur_req = r
            k0 = key_offsets[r]
            nk = key_offsets[r + 1] - k0
            nl = num_lookup[r]
            npath = 0
            if H is not None:  # the tokens the input can reuse (nothing stamped yet)
                hit_tokens = hy_reuse(hx, r)
                h = hit_tokens // bt
            else:
                if T is None:
                    h = match_blocks(state, keys, k0, nl, mblocks)
                else:  # the walk stamps and may split: the policy hears of it
                    if array:
                        if W is not None:  # only LPC's records widen the state
                            ist, fst = reserve(acode, ist, fst, 2 * nk + 2)
                        ist[SC, REQ] = r
                        fst[FS, NOW] = now
                    P[19][0] = r
                    h, npath = rx_walk(keys, k0, nl, T, rcode, P, ist, fst, 0, 0)
                hit_tokens = lookup_end[r] if h == nl else h * bt
            prompt = inp[r] + generated[r]
            rem = prompt - hit_tokens
            if not chunked and rem > budget and (nch or ndec):
                break
            want = -(-(inp[r] + min(generated[r] + 1, outp[r])) // bt)
            need = want - h
            if H is not None:  # lock the hit's path, make room for the rest
                if lktop + hx[6][6][0] + 1 > lk.shape[0]:
                    lk, lkid, lktop = _compact_locks(
                        lk, lkid, lkat, lkn, running, nrun, hx[6][6][0] + 1
                    )
                k = hy_acquire(hx, hit_tokens, want, bt, lk, lkid, lktop)
                if k < 0 and hit_tokens and hx[7][E_RESERVED] == 0:
                    # nothing else runs, yet the hit's locked path leaves too little
                    # room: take the request as a miss, so it can always run
                    hy_drop_hit(hx)
                    hit_tokens, h = 0, 0
                    k = hy_acquire(hx, 0, want, bt, lk, lkid, lktop)
                if k < 0:
                    break
                lkat[r], lkn[r] = lktop, k
                lktop += k
                hres[r] = hx[7][E_NEED]
                if looked.shape[0]:
                    if hx[7][E_LOOKED] > looked.shape[0]:
                        looked = widened(looked, 2 * looked.shape[0])
                    looked[hx[7][E_LOOKED] - 1] = r
                rem = prompt - hit_tokens
            elif T is None:
                if need > sc[1] + sc[2] - num_hit_free(state, mblocks, h):
                    break
            elif need > rx_room(T, npath):
                break
            if array:
                if W is not None:  # only LPC's records widen the state
                    ist, fst = reserve(acode, ist, fst, nk + want)
                ist[SC, REQ] = r
                fst[FS, NOW] = now
            nfree_slots -= 1
            s = free_slots[nfree_slots]
            slot[r] = s
            if H is not None:
                pass
            elif T is None:
                row = held[s]
                for j in range(h):
                    row[j] = mblocks[j]
                pin_hits(state, row, h, now, pp, ist, fst)
                announce_misses(state, keys, k0, h, nk, pp, ist, fst)
                take_blocks(state, need, row, h, r, pp, ist, fst, victims)
            else:
                P[19][0] = r
                last = rx_acquire(keys, k0, h, nk, npath, need, spare, T, rcode, P, ist, fst)
                if last < 0:
                    return NO_VICTIM, -1.0, ist, fst, hx, lk, lkid, looked
                rlast[r], rres[r] = last, need
            whead = (whead + 1) % m
            wlen -= 1
            wmod += 1
            if first_hits[r] < 0:
                first_hits[r] = hit_tokens
                hit_blocks[r] = h
                miss_blocks[r] = max(0, nl - h)
            nblocks[r] = want
            committed[r] = h
            admit_hits[r] = hit_tokens
            computed[r] = hit_tokens
            prompt_len[r] = prompt
            phase[r] = PREFILL
            running[nrun] = r
            nrun += 1
            c = rem if not chunked else min(rem, budget)
            cr[nch], cn[nch], cc[nch] = r, c, hit_tokens
            nch += 1
            budget -= c
    if not waits:  # nothing to feed: the queue as it is now counts as fed
        wfed = wmod
    rs[RS_WHEAD], rs[RS_WLEN], rs[RS_WMOD], rs[RS_WFED] = whead, wlen, wmod, wfed
    rs[RS_NRUN], rs[RS_NFREE], rs[RS_LKTOP], rs[RS_CUR] = nrun, nfree_slots, lktop, cur_req
    rs[RS_NCH], rs[RS_NDEC] = nch, ndec
    if nch == 0 and ndec == 0:
        return OK, -1.0, ist, fst, hx, lk, lkid, looked
    for j in range(nch):
        r = cr[j]
        if scheduled_s[r] != scheduled_s[r]:
            scheduled_s[r] = now
        cd[j] = cc[j] - admit_hits[r]
    tcode, tpar, tt, ts = timing
    duration = step_seconds(tcode, tpar, tt, ts, cn, cc, cd, nch, ndec, dctx)
    return OK, duration, ist, fst, hx, lk, lkid, looked


@jit()
def next_arrival(
    nxt: int, r: int, now: float, gated: bool, think_s: F64, trace_arrival: F64
) -> float:
    """When request ``nxt`` arrives, its session's previous turn ``r`` having finished at
    ``now``: gated, at its trace time but not before; else a think time after (the
    trace's gap when the think time is not known)."""
    if gated:
        return now + max(float(trace_arrival[nxt]) - now, 0.0)
    think = float(think_s[nxt])
    if think != think:
        think = max(float(trace_arrival[nxt] - trace_arrival[r]), 0.0)
    return now + think


@jit()
def hybrid_locks(H: Any) -> tuple[I64, I64, I64]:
    """The hybrid cache's lock stack (nodes, their ids) and tuned Marconi's window of
    requests in lookup order (doubled as needed); empty for the other structures."""
    lk = np.empty(64 if H is not None else 0, np.int64)
    lkid = np.empty(64 if H is not None else 0, np.int64)
    looked = np.empty(0, np.int64)
    if H is not None:  # noqa: SIM102 - numba folds `H is None` away only as a test of its own
        if H[3][C_TUNES]:
            looked = np.empty(64, np.int64)
    return lk, lkid, looked


@jit(nogil=True)
def engine_kernel(
    state: BlockState,
    pp: PolicyArgs,
    ist: I64,
    fst: F64,
    nu_pos: F64,
    keys: I64,
    key_offsets: I64,
    num_lookup: I64,
    lookup_end: I64,
    inp: I64,
    outp: I64,
    input_keys: I64,
    block_tokens: int,
    capacity: int,
    max_free: int,
    cfg: I64,
    init_req: I64,
    init_t: F64,
    next_turn: I64,
    think_s: F64,
    trace_arrival: F64,
    tcode: I64,
    tpar: F64,
    tt: F64,
    ts: F64,
    arrival_s: F64,
    scheduled_s: F64,
    first_token_s: F64,
    finish_s: F64,
    first_hits: I64,
    hit_blocks: I64,
    miss_blocks: I64,
    num_preemptions: I64,
    out: I64,
    out_f: F64,
    T: Tree | None,
    P: Any,  # Any: RadixArgs | None, None when T is; the body tests T, which narrows no P
    rcode: int,
    spare: int,
    H: Any,  # Any: HybridArrays | None; the body works on a copy (hx) no test of H narrows
    W: F64 | None,
) -> tuple[I64, F64]:
    """Simulate every request; returns the array policy's state (it may have widened).

    ``cfg``: max_num_seqs, max_num_batched_tokens, chunked prefill, cache while running,
    gated. ``init_req`` / ``init_t``: the arrivals known at the start, in the order the
    reference schedules them; ``next_turn[r]``: the request that arrives after r finishes
    (closed loop or gated; -1: none). out = (status, request, steps, evictions, finished
    requests, updated as they finish); out_f =
    (the time of an event scheduled before the clock, the clock).

    The radix structure: ``T`` the tree (``_fast_radix.new_tree``), ``P`` its policy's
    arguments, ``rcode`` the policy's code there, ``spare`` SGLang's spare pages; ``state``
    and ``pp`` are then a placeholder's. For the block structure T and P are None (numba
    compiles each structure's own kernel: the ``T is None`` branches fold away).

    The hybrid structure: ``H`` the tree and the byte budget (``_fast_hybrid``'s engine
    functions), T and P None, ``capacity`` the blocks a lone request may hold.

    ``W``: None unless the array policy may widen its state (LPC: its records), so that
    for every other policy the widening calls fold away and ``ist, fst`` are never
    reassigned (numba then carries no copy of them around the loops)."""
    n = inp.shape[0]
    bt = block_tokens
    max_seqs, budget0, chunked, cwr, gated = cfg[0], cfg[1], cfg[2] != 0, cfg[3] != 0, cfg[4]
    array = pp[0] == ARRAY
    acode = pp[5]
    after = np.zeros(1, np.int64)  # radix: the request keyed policies look next uses after
    if T is not None:
        array = rcode == ARRAY
        acode = P[26]
        after = P[19]
    # the hybrid cache: hx, which grows (H itself is never reassigned, or numba would not
    # fold the `H is None` branches away for the other structures)
    hx = H
    if H is not None:
        array = False
    sc = state[23]
    # radix: per request, its locked path's end and its reserved pages (its handle)
    rlast = np.zeros(n if T is not None else 0, np.int64)
    rres = np.zeros(n if T is not None else 0, np.int64)
    # hybrid: per request, its reserved bytes and its locked nodes (lk[lkat:lkat + lkn],
    # their ids in lkid); the requests in lookup order (tuned Marconi's window)
    nh = n if H is not None else 0
    hres = np.zeros(nh, np.int64)
    lkat = np.zeros(nh, np.int64)
    lkn = np.zeros(nh, np.int64)
    lk = np.empty(64 if H is not None else 0, np.int64)
    lkid = np.empty(64 if H is not None else 0, np.int64)
    lktop = 0
    looked = np.empty(0, np.int64)
    if H is not None:  # noqa: SIM102 - numba folds `H is None` away only as a test of its own
        if H[3][C_TUNES]:
            looked = np.empty(64, np.int64)  # doubled as needed
    no_nu = nu_pos[:0]  # a preemption releases at another request's index: look next uses up
    # blocks a request may hold: its whole sequence
    max_need = 1  # the most blocks a running request can hold (more: refused on arrival)
    for r in range(n):
        need = -(-(inp[r] + outp[r]) // bt)
        max_need = max(max_need, min(need, capacity))
    slots = max(min(max_seqs, n), 1)
    # block ids per running request (the radix tree keeps its own: a path end, a count)
    block = T is None and H is None
    held = np.empty((slots, max_need if block else 0), np.int64)
    free_slots = np.arange(slots - 1, -1, -1).astype(np.int64)
    nfree_slots = slots
    slot = np.full(n, -1, np.int64)
    victims = np.empty(max(capacity, max_need) if block else 0, np.int64)
    released = np.empty(max(capacity, max_need) if block else 0, np.int64)
    mblocks = np.empty(max_need, np.int64)
    # per request
    phase = np.zeros(n, np.int64)
    computed = np.zeros(n, np.int64)
    prompt_len = np.zeros(n, np.int64)
    generated = np.zeros(n, np.int64)
    nblocks = np.zeros(n, np.int64)
    committed = np.zeros(n, np.int64)
    admit_hits = np.zeros(n, np.int64)
    # queues
    wq = np.empty(n + 1, np.int64)  # waiting: a ring, head .. tail
    whead, wlen = 0, 0
    # a policy that reads the waiting queue; changes of the ring, the change last fed
    waits = array and (acode == OPT_ONLINE or (acode == UNICACHE and ist[SC, UCOPT] == 1))
    wmod, wfed = 0, -1
    running = np.empty(n, np.int64)
    nrun = 0
    # the batch in flight
    cr = np.empty(n, np.int64)
    cn = np.empty(n, np.int64)
    cc = np.empty(n, np.int64)
    cd = np.empty(n, np.int64)
    dr = np.empty(n, np.int64)
    dctx = np.empty(n, np.int64)
    nch, ndec = 0, 0
    done_list = np.empty(n, np.int64)
    # events
    ht = np.empty(n, np.float64)
    hs = np.empty(n, np.int64)
    hr = np.empty(n, np.int64)
    hn = np.zeros(1, np.int64)
    seq = 0
    for i in range(init_req.shape[0]):
        heap_push(ht, hs, hr, hn, init_t[i], seq, init_req[i])
        seq += 1
    clock = 0.0
    busy = False
    step_end = 0.0
    num_steps = 0
    cur_req = 0  # the cache view's request index: the last request an operation named
    out[0] = OK
    while busy or hn[0] > 0:
        now = step_end if busy else ht[0]
        if hn[0] > 0 and ht[0] < now:
            now = ht[0]
        # ---- every event at this instant: the step's end first, then arrivals in order
        while True:
            if busy and step_end == now:
                clock = now
                busy = False
                # complete the batch
                ndone = 0
                for i in range(nch):
                    r = cr[i]
                    if phase[r] != PREFILL:
                        continue
                    computed[r] += cn[i]
                    if cwr:  # cache the prompt's full blocks now
                        upto = min(min(computed[r], inp[r]) // bt, input_keys[r])
                        if upto > committed[r]:
                            cur_req = r
                            if array:
                                if W is not None:  # only LPC's records widen the state
                                    ist, fst = reserve(acode, ist, fst, upto - committed[r] + 2)
                                ist[SC, REQ] = r
                                fst[FS, NOW] = now
                            if T is None:
                                commit_blocks(
                                    state,
                                    held[slot[r]],
                                    keys,
                                    key_offsets[r],
                                    committed[r],
                                    upto,
                                    now,
                                    pp,
                                    ist,
                                    fst,
                                )
                            else:
                                after[0] = r
                                rlast[r], rres[r] = rx_commit(
                                    keys,
                                    key_offsets[r],
                                    upto,
                                    rlast[r],
                                    rres[r],
                                    T,
                                    rcode,
                                    P,
                                    ist,
                                    fst,
                                    0,
                                    0,
                                )
                            committed[r] = upto
                    if computed[r] < prompt_len[r]:
                        continue
                    if generated[r] == 0:
                        first_token_s[r] = now
                    if outp[r] > 0:
                        generated[r] += 1
                    phase[r] = DECODE
                    if generated[r] >= outp[r]:
                        done_list[ndone] = r
                        ndone += 1
                for i in range(ndec):
                    r = dr[i]
                    if phase[r] != DECODE:
                        continue
                    generated[r] += 1
                    if generated[r] >= outp[r]:
                        done_list[ndone] = r
                        ndone += 1
                for i in range(ndone):  # finish: cache every key, release, leave
                    r = done_list[i]
                    cur_req = r
                    k0 = key_offsets[r]
                    nk = key_offsets[r + 1] - k0
                    s = slot[r]
                    if array:
                        if W is not None:  # only LPC's records widen the state
                            ist, fst = reserve(acode, ist, fst, nk + nblocks[r] + 2)
                        ist[SC, REQ] = r
                        fst[FS, NOW] = now
                    if H is not None:  # return its bytes, then admit its sequence
                        hy_close(hx, lk, lkid, lkat[r], lkn[r], hres[r])
                        hres[r] = 0
                        lkn[r] = 0
                        if looked.shape[0]:
                            hy_tune(hx, looked)
                        more = hy_slots_for(hx, r)
                        if more:
                            hx = hy_grown(hx, more)
                        hy_admit(hx, r)
                    elif T is None:
                        commit_blocks(state, held[s], keys, k0, committed[r], nk, now, pp, ist, fst)
                        release_blocks(
                            state,
                            held[s],
                            nblocks[r],
                            r,
                            nu_pos,
                            k0,
                            max_free,
                            pp,
                            ist,
                            fst,
                            released,
                            victims,
                        )
                    else:
                        after[0] = r
                        last, res = rx_commit(
                            keys, k0, nk, rlast[r], rres[r], T, rcode, P, ist, fst, 0, 0
                        )
                        rx_release(last, res, T, rcode, P, ist, fst)
                        rres[r] = 0
                    free_slots[nfree_slots] = s
                    nfree_slots += 1
                    slot[r] = -1
                    nblocks[r] = 0
                    phase[r] = DONE
                    j = 0
                    while running[j] != r:
                        j += 1
                    for m in range(j, nrun - 1):
                        running[m] = running[m + 1]
                    nrun -= 1
                out[4] += ndone  # finished so far (a progress bar reads it)
                for i in range(ndone):
                    r = done_list[i]
                    finish_s[r] = now
                    nxt = next_turn[r]
                    if nxt >= 0:
                        if gated:
                            think = max(trace_arrival[nxt] - now, 0.0)
                        else:
                            think = think_s[nxt]
                            if think != think:
                                think = max(trace_arrival[nxt] - trace_arrival[r], 0.0)
                        at = now + think
                        if at < clock:
                            out[0] = IN_PAST
                            out_f[0], out_f[1] = at, clock
                            return ist, fst
                        heap_push(ht, hs, hr, hn, at, seq, nxt)
                        seq += 1
            elif hn[0] > 0 and ht[0] == now:
                clock = now
                r = heap_pop(ht, hs, hr, hn)
                arrival_s[r] = now
                if -(-(inp[r] + outp[r]) // bt) > capacity:
                    out[0] = TOO_BIG
                    out[1] = r
                    return ist, fst
                phase[r] = WAITING
                wq[(whead + wlen) % (n + 1)] = r
                wlen += 1
                wmod += 1
            else:
                break
        if busy:
            continue
        # ---- start a step: running requests first, then admissions
        nch, ndec = 0, 0
        budget = budget0
        preempted = False
        if T is not None and spare:  # SGLang: a free page per decoding request
            ndecoding = 0
            for i in range(nrun):
                if phase[running[i]] == DECODE:
                    ndecoding += 1
            if ndecoding:
                if array:
                    if W is not None:  # only LPC's records widen the state
                        ist, fst = reserve(acode, ist, fst, 2)
                    ist[SC, REQ] = cur_req
                    fst[FS, NOW] = now
                after[0] = cur_req
                rx_keep_free(spare * ndecoding, T, rcode, P, ist, fst)
        i = 0
        while i < nrun and budget > 0:
            r = running[i]
            if phase[r] == PREFILL:
                m = min(prompt_len[r] - computed[r], budget)
                if not chunked and m < prompt_len[r] - computed[r]:
                    i += 1
                    continue
                cr[nch], cn[nch], cc[nch] = r, m, computed[r]
                nch += 1
                budget -= m
            else:
                # Only a decode that crosses into a new block needs memory.
                g = min(generated[r] + 1, outp[r])
                if inp[r] + g > nblocks[r] * bt:
                    more = -(-(inp[r] + min(generated[r] + 1, outp[r])) // bt) - nblocks[r]
                    gone = False
                    while more > 0:
                        if H is not None:
                            grown = hy_make_room(hx, more * bt * hx[3][C_KV])
                        else:
                            grown = more <= (sc[1] + sc[2] if T is None else rx_grow_room(T))
                        if grown:
                            if array:
                                if W is not None:  # only LPC's records widen the state
                                    ist, fst = reserve(acode, ist, fst, more)
                                ist[SC, REQ] = cur_req
                                fst[FS, NOW] = now
                            if H is not None:
                                hx[7][E_RESERVED] += more * bt * hx[3][C_KV]
                                hres[r] += more * bt * hx[3][C_KV]
                            elif T is None:
                                take_blocks(
                                    state,
                                    more,
                                    held[slot[r]],
                                    nblocks[r],
                                    cur_req,
                                    pp,
                                    ist,
                                    fst,
                                    victims,
                                )
                            else:
                                after[0] = cur_req
                                if not rx_reserve(more, spare, T, rcode, P, ist, fst):
                                    out[0] = NO_VICTIM
                                    return ist, fst
                                rres[r] += more
                            nblocks[r] += more
                            break
                        # preempt the most recently admitted request
                        v = running[nrun - 1]
                        if array:
                            if W is not None:  # only LPC's records widen the state
                                ist, fst = reserve(acode, ist, fst, nblocks[v])
                            ist[SC, REQ] = cur_req
                            fst[FS, NOW] = now
                        if H is not None:
                            hy_close(hx, lk, lkid, lkat[v], lkn[v], hres[v])
                            hres[v] = 0
                            lkn[v] = 0
                        elif T is None:
                            release_blocks(
                                state,
                                held[slot[v]],
                                nblocks[v],
                                cur_req,
                                no_nu,
                                key_offsets[v],
                                max_free,
                                pp,
                                ist,
                                fst,
                                released,
                                victims,
                            )
                        else:
                            after[0] = cur_req
                            rx_release(rlast[v], rres[v], T, rcode, P, ist, fst)
                            rres[v] = 0
                        free_slots[nfree_slots] = slot[v]
                        nfree_slots += 1
                        slot[v] = -1
                        nblocks[v] = 0
                        computed[v] = 0
                        phase[v] = WAITING
                        nrun -= 1
                        whead = (whead - 1) % (n + 1)
                        wq[whead] = v
                        wlen += 1
                        wmod += 1
                        num_preemptions[v] += 1
                        preempted = True
                        if v == r:
                            gone = True
                            break
                    if gone:
                        continue  # r itself was preempted: the list shifted
                dr[ndec], dctx[ndec] = r, inp[r] + generated[r]
                ndec += 1
                budget -= 1
            i += 1
        if not preempted:
            if waits and wmod != wfed:
                # the waiting queue, as on_waiting gives it (only when it changed: the
                # same queue again changes nothing)
                wfed = wmod
                if T is None:
                    ekey, edepth = state[4], state[13]  # the entries' keys and depths
                else:
                    ekey, edepth = P[16], P[13]
                waiting_begin(acode, ist)
                for w in range(wlen):
                    rw = wq[(whead + w) % (n + 1)]
                    for j in range(key_offsets[rw], key_offsets[rw] + num_lookup[rw]):
                        waiting_add(acode, ist, fst, keys[j], w, ekey, edepth)
                waiting_end(acode, ist, fst, ekey, edepth)
            while wlen > 0 and budget > 0 and nrun < max_seqs:
                r = wq[whead]
                cur_req = r
                k0 = key_offsets[r]
                nk = key_offsets[r + 1] - k0
                nl = num_lookup[r]
                npath = 0
                if H is not None:  # the tokens the input can reuse (nothing stamped yet)
                    hit_tokens = hy_reuse(hx, r)
                    h = hit_tokens // bt
                else:
                    if T is None:
                        h = match_blocks(state, keys, k0, nl, mblocks)
                    else:  # the walk stamps and may split: the policy hears of it
                        if array:
                            if W is not None:  # only LPC's records widen the state
                                ist, fst = reserve(acode, ist, fst, 2 * nk + 2)
                            ist[SC, REQ] = r
                            fst[FS, NOW] = now
                        after[0] = r
                        h, npath = rx_walk(keys, k0, nl, T, rcode, P, ist, fst, 0, 0)
                    hit_tokens = lookup_end[r] if h == nl else h * bt
                prompt = inp[r] + generated[r]
                rem = prompt - hit_tokens
                if not chunked and rem > budget and (nch or ndec):
                    break
                want = -(-(inp[r] + min(generated[r] + 1, outp[r])) // bt)
                need = want - h
                if H is not None:  # lock the hit's path, make room for the rest
                    if lktop + hx[6][6][0] + 1 > lk.shape[0]:
                        lk, lkid, lktop = _compact_locks(
                            lk, lkid, lkat, lkn, running, nrun, hx[6][6][0] + 1
                        )
                    k = hy_acquire(hx, hit_tokens, want, bt, lk, lkid, lktop)
                    if k < 0 and hit_tokens and hx[7][E_RESERVED] == 0:
                        # nothing else runs, yet the hit's locked path leaves too little
                        # room: take the request as a miss, so it can always run
                        hy_drop_hit(hx)
                        hit_tokens, h = 0, 0
                        k = hy_acquire(hx, 0, want, bt, lk, lkid, lktop)
                    if k < 0:
                        break
                    lkat[r], lkn[r] = lktop, k
                    lktop += k
                    hres[r] = hx[7][E_NEED]
                    if looked.shape[0]:
                        if hx[7][E_LOOKED] > looked.shape[0]:
                            looked = widened(looked, 2 * looked.shape[0])
                        looked[hx[7][E_LOOKED] - 1] = r
                    rem = prompt - hit_tokens
                elif T is None:
                    if need > sc[1] + sc[2] - num_hit_free(state, mblocks, h):
                        break
                elif need > rx_room(T, npath):
                    break
                if array:
                    if W is not None:  # only LPC's records widen the state
                        ist, fst = reserve(acode, ist, fst, nk + want)
                    ist[SC, REQ] = r
                    fst[FS, NOW] = now
                nfree_slots -= 1
                s = free_slots[nfree_slots]
                slot[r] = s
                if H is not None:
                    pass
                elif T is None:
                    row = held[s]
                    for j in range(h):
                        row[j] = mblocks[j]
                    pin_hits(state, row, h, now, pp, ist, fst)
                    announce_misses(state, keys, k0, h, nk, pp, ist, fst)
                    take_blocks(state, need, row, h, r, pp, ist, fst, victims)
                else:
                    after[0] = r
                    last = rx_acquire(keys, k0, h, nk, npath, need, spare, T, rcode, P, ist, fst)
                    if last < 0:
                        out[0] = NO_VICTIM
                        return ist, fst
                    rlast[r], rres[r] = last, need
                whead = (whead + 1) % (n + 1)
                wlen -= 1
                wmod += 1
                if first_hits[r] < 0:
                    first_hits[r] = hit_tokens
                    hit_blocks[r] = h
                    miss_blocks[r] = max(0, nl - h)
                nblocks[r] = want
                committed[r] = h
                admit_hits[r] = hit_tokens
                computed[r] = hit_tokens
                prompt_len[r] = prompt
                phase[r] = PREFILL
                running[nrun] = r
                nrun += 1
                m = rem if not chunked else min(rem, budget)
                cr[nch], cn[nch], cc[nch] = r, m, hit_tokens
                nch += 1
                budget -= m
        if nch == 0 and ndec == 0:
            continue
        for j in range(nch):
            r = cr[j]
            if scheduled_s[r] != scheduled_s[r]:
                scheduled_s[r] = now
            cd[j] = cc[j] - admit_hits[r]
        duration = step_seconds(tcode, tpar, tt, ts, cn, cc, cd, nch, ndec, dctx)
        busy = True
        num_steps += 1
        step_end = now + duration
        if step_end < clock:
            out[0] = IN_PAST
            out_f[0], out_f[1] = step_end, clock
            return ist, fst
    if wlen or nrun:
        out[0] = UNFINISHED
    out[2] = num_steps
    if H is not None:
        out[3] = 0  # the hybrid cache reports no evictions as events
    elif T is None:
        out[3] = sc[3]
    else:
        out[3] = T[13][EVICTED]
    return ist, fst
