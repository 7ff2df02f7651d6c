"""Hook dispatch for the array-state policies (ARC, S3-FIFO, LeCaR) by their code.

Their classes (batches) and the replay kernel (one entry at a time) both come through
:func:`hook`, so each policy's behaviour lives in its own module's functions only. Hook
numbers: 0 insert, 1 access, 2 evictable, 3 pinned, 4 remove, 5 miss (x is a key),
6 evict (returns the victim, -1 when none); :func:`miss_begin` opens a request's misses.
"""

from __future__ import annotations

from typing import Any

from prefixlab._jit import jit
from prefixlab.policies import arc, lecar, s3fifo
from prefixlab.policies._arrays import set_free
from prefixlab.policies.base import I64

INSERT, ACCESS, EVICTABLE, PINNED, REMOVE, MISS, EVICT = range(7)
ARC, S3FIFO, LECAR = arc.CODE, s3fifo.CODE, lecar.CODE


@jit()
def miss_begin(code: int, ist: I64) -> None:
    if code == ARC:
        arc.arc_miss_begin(ist)


@jit()
def hook(code: int, ist: I64, fst: Any, h: int, x: int, key: I64, rng: Any) -> int:
    """Run hook h of policy ``code`` on entry (or key) x."""
    if h == INSERT:
        if code == ARC:
            arc.arc_insert(ist, fst, x, key[x])
        elif code == S3FIFO:
            s3fifo.s3fifo_insert(ist, fst, x, key[x])
        else:
            lecar.lecar_insert(ist, fst, x, key[x])
    elif h == ACCESS:
        if code == ARC:
            arc.arc_access(ist, x)
        elif code == S3FIFO:
            s3fifo.s3fifo_access(ist, x)
        else:
            lecar.lecar_access(ist, x)
    elif h in (EVICTABLE, PINNED):
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


@jit()
def batch(code: int, ist: I64, fst: Any, h: int, xs: I64, key: I64, rng: Any) -> int:
    """Run hook h on every x in order; for EVICT fill xs with up to len(xs) victims and
    return how many."""
    if h == EVICT:
        for i in range(xs.shape[0]):
            v: int = hook(code, ist, fst, EVICT, 0, key, rng)
            if v < 0:
                return i
            xs[i] = v
        return int(xs.shape[0])
    if h == MISS:
        miss_begin(code, ist)
    for i in range(xs.shape[0]):
        hook(code, ist, fst, h, xs[i], key, rng)
    return int(xs.shape[0])
