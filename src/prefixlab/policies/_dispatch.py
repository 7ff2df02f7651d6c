"""Hook dispatch for the array-state policies (ARC, S3-FIFO, LeCaR, LPC, WA, UniCache,
opt-online) by their code.

Their classes (batches) and the replay kernels (one entry at a time) both come through
:func:`hook`, so each policy's behaviour lives in its own module's functions only. Hook
numbers (named in :mod:`prefixlab.policies._arrays`): insert, access, evictable, pinned,
remove, miss (x is a key), evict (returns the victim, -1 when none), update (re-rank),
split (x the new upper entry, y the lower one it was cut from), hit-free (access, then
pinned: LPC, WA and UniCache do it in one step); :func:`miss_begin` opens a
request's misses and :func:`reserve` makes room for a request's allocations before its
hooks run.
"""

from __future__ import annotations

import numpy as np

from prefixlab._jit import jit
from prefixlab.policies._arrays import (
    ACCESS,
    EVICT,
    EVICTABLE,
    HIT_FREE,
    INSERT,
    MISS,
    PINNED,
    REMOVE,
    SPLIT,
    set_free,
)
from prefixlab.policies.hooks import arc, lecar, lpc, opt_online, s3fifo, unicache, workload_aware
from prefixlab.types import F64, I64

ARC, S3FIFO, LECAR, LPC, WA = arc.CODE, s3fifo.CODE, lecar.CODE, lpc.CODE, workload_aware.CODE
UNICACHE, OPT_ONLINE = unicache.CODE, opt_online.CODE


@jit()
def miss_begin(code: int, ist: I64) -> None:
    if code == ARC:
        arc.arc_miss_begin(ist)


@jit()
def reserve(code: int, ist: I64, fst: F64, n: int) -> tuple[I64, F64]:
    """The state with room for n more hook calls (the same arrays when there is room)."""
    if code == LPC:
        return lpc.lpc_reserve(ist, fst, n)
    return ist, fst


@jit(nrt=False)
def hook(
    code: int,
    ist: I64,
    fst: F64,
    h: int,
    x: int,
    y: int,
    key: I64,
    depth: I64,
    rng: np.random.Generator,
    aux: F64,
) -> int:
    """Run hook h of policy ``code`` on entry (or key) x (y: a split's lower entry)."""
    if code == LPC:
        return int(lpc.lpc_hook(ist, fst, h, x, y, aux))
    if code == WA:
        return int(workload_aware.wa_hook(ist, fst, h, x, depth, aux))
    if code == UNICACHE:
        return int(unicache.uc_hook(ist, fst, h, x, depth, aux))
    if code == OPT_ONLINE:
        return int(opt_online.oo_hook(ist, fst, h, x, key, depth))
    if h == SPLIT:
        h = INSERT  # the new upper part is announced as an insertion
    if h == INSERT:
        if code == ARC:
            arc.arc_insert(ist, fst, x, key[x])
        elif code == S3FIFO:
            s3fifo.s3fifo_insert(ist, fst, x, key[x])
        else:
            lecar.lecar_insert(ist, fst, x, key[x])
    elif h in (ACCESS, HIT_FREE, EVICTABLE, PINNED):
        if h in (ACCESS, HIT_FREE):  # a hit (then, for HIT_FREE, pinned)
            if code == ARC:
                arc.arc_access(ist, x)
            elif code == S3FIFO:
                s3fifo.s3fifo_access(ist, x)
            else:
                lecar.lecar_access(ist, x)
            if h == ACCESS:
                return 0
        if code == LECAR:
            lecar.lecar_set_free(ist, x, h == EVICTABLE)
        else:
            set_free(ist, x, h == EVICTABLE)
    elif h == REMOVE:
        if code == ARC:
            arc.arc_remove(ist, x)
        elif code == S3FIFO:
            s3fifo.s3fifo_remove(ist, x)
        else:
            lecar.lecar_remove(ist, x)
    elif h == MISS:
        if code == ARC:
            arc.arc_miss(ist, fst, x)
        elif code == LECAR:
            lecar.lecar_regret(ist, fst, x)
    elif h == EVICT:
        if code == ARC:
            return int(arc.arc_pop(ist, fst, key))
        if code == S3FIFO:
            return int(s3fifo.s3fifo_pop(ist, fst, key))
        return int(lecar.lecar_pop(ist, fst, key, rng))
    return 0


@jit(nrt=False)
def waiting_begin(code: int, ist: I64) -> None:
    """A new waiting queue follows (policies that read it: opt-online, unicache-opt)."""
    if code == OPT_ONLINE:
        opt_online.oo_waiting_begin(ist)
    else:
        unicache.uc_waiting_begin(ist)


@jit(nrt=False)
def waiting_add(code: int, ist: I64, fst: F64, k: int, pos: int, key: I64, depth: I64) -> None:
    """Waiting request ``pos`` (in queue order, called in that order) looks key k up."""
    if code == OPT_ONLINE:
        opt_online.oo_waiting_add(ist, fst, k, pos, key, depth)
    else:
        unicache.uc_waiting_add(ist, k, pos)


@jit(nrt=False)
def waiting_end(code: int, ist: I64, fst: F64, key: I64, depth: I64) -> None:
    if code == OPT_ONLINE:
        opt_online.oo_waiting_end(ist, fst, key, depth)


@jit(nrt=False)
def waiting(code: int, ist: I64, fst: F64, keys: I64, pos: I64, key: I64, depth: I64) -> None:
    """The whole waiting queue at once: its lookup keys and their requests' positions."""
    waiting_begin(code, ist)
    for i in range(keys.shape[0]):
        waiting_add(code, ist, fst, keys[i], pos[i], key, depth)
    waiting_end(code, ist, fst, key, depth)


@jit()
def batch(
    code: int,
    ist: I64,
    fst: F64,
    h: int,
    xs: I64,
    y: int,
    key: I64,
    depth: I64,
    rng: np.random.Generator,
    aux: F64,
) -> int:
    """Run hook h on every x in order; for EVICT fill xs with up to len(xs) victims and
    return how many."""
    if h == EVICT:
        for i in range(xs.shape[0]):
            v: int = hook(code, ist, fst, EVICT, 0, y, key, depth, rng, aux)
            if v < 0:
                return i
            xs[i] = v
        return int(xs.shape[0])
    if h == MISS:
        miss_begin(code, ist)
    for i in range(xs.shape[0]):
        hook(code, ist, fst, h, xs[i], y, key, depth, rng, aux)
    return int(xs.shape[0])
