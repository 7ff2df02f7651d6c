"""ARC (Megiddo & Modha, FAST'03): adaptive split between recency (T1) and frequency (T2).

T1 holds entries seen once, T2 entries hit again; ghost lists B1/B2 remember the keys evicted
from each. A miss on a B1 key grows the target size ``p`` of T1, a miss on a B2 key shrinks
it. ``c`` is the structure's entry capacity. Pinned entries are skipped by the victim search.

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state (queue 0 = T1,
queue 1 = T2, ghost 0 = B1, ghost 1 = B2), called by the class and by the replay kernel.
"""

from __future__ import annotations

from prefixlab._jit import jit
from prefixlab.policies._arrays import (
    FS,
    K0,
    K1,
    LEN0,
    LEN1,
    NFREE,
    SC,
    SLOT,
    fq_append,
    fq_discard,
    fq_oldest_free,
    ghost_add,
    ghost_contains,
    ghost_len,
    ghost_pop,
    ghost_trim,
    set_free,
)
from prefixlab.types import F64, I64

CODE = 1
# scalar slots; key rows: K0 = goes to T2 (adapted on its miss), K1 = announced in this batch
C, MISS_IN_B2, NO_GHOST, BATCH = (SLOT + i for i in range(4))
TO_T2, ANNOUNCED = K0, K1


@jit(nrt=False)
def _make_directory_room(ist: I64) -> None:
    """Case IV of the paper: a page in no list keeps |L1| <= c and |L1|+|L2| <= 2c."""
    c = ist[SC, C]
    l1 = ist[SC, LEN0] + ghost_len(ist, 0)
    if l1 >= c:
        if ist[SC, LEN0] < c:
            ghost_trim(ist, 0, ghost_len(ist, 0) - 1)
        else:
            ist[SC, NO_GHOST] = 1
    elif l1 + ist[SC, LEN1] + ghost_len(ist, 1) >= 2 * c:
        ghost_trim(ist, 1, ghost_len(ist, 1) - 1)


@jit(nrt=False)
def _adapt(ist: I64, fst: F64, key: int) -> bool:
    """Adapt p if ``key`` is a ghost; True when it goes to T2."""
    b1, b2 = ghost_len(ist, 0), ghost_len(ist, 1)
    if ghost_contains(ist, 0, key):
        fst[FS, 0] = min(float(ist[SC, C]), fst[FS, 0] + max(b2 / max(b1, 1), 1.0))
        ghost_pop(ist, fst, 0, key)
        return True
    if ghost_contains(ist, 1, key):
        fst[FS, 0] = max(0.0, fst[FS, 0] - max(b1 / max(b2, 1), 1.0))
        ghost_pop(ist, fst, 1, key)
        ist[SC, MISS_IN_B2] = 1
        return True
    return False


@jit(nrt=False)
def arc_miss_begin(ist: I64) -> None:
    """A request's missed keys follow: ARC adapts p before REPLACE picks its victims."""
    ist[SC, MISS_IN_B2] = 0
    ist[SC, BATCH] += 1


@jit(nrt=False)
def arc_miss(ist: I64, fst: F64, key: int) -> None:
    ist[ANNOUNCED, key] = ist[SC, BATCH]
    if _adapt(ist, fst, key):
        ist[TO_T2, key] = 1
    else:
        _make_directory_room(ist)


@jit(nrt=False)
def arc_insert(ist: I64, fst: F64, e: int, key: int) -> None:
    if ist[TO_T2, key]:
        ist[TO_T2, key] = 0
        fq_append(ist, 1, e)
    elif ist[ANNOUNCED, key] == ist[SC, BATCH] and ist[SC, BATCH] > 0:
        # on_miss handled it. A ghost created since (another holder of the key evicted for
        # this request) must not adapt p a second time.
        ist[ANNOUNCED, key] = 0
        ghost_pop(ist, fst, 0, key)
        ghost_pop(ist, fst, 1, key)
        fq_append(ist, 0, e)
    elif _adapt(ist, fst, key):  # no on_miss came first (hooks driven directly)
        fq_append(ist, 1, e)
    else:
        fq_append(ist, 0, e)


@jit(nrt=False)
def arc_access(ist: I64, e: int) -> None:
    fq_discard(ist, 0, e)
    fq_append(ist, 1, e)


@jit(nrt=False)
def arc_remove(ist: I64, e: int) -> None:
    set_free(ist, e, False)
    fq_discard(ist, 0, e)
    fq_discard(ist, 1, e)


@jit(nrt=False)
def arc_pop(ist: I64, fst: F64, key: I64) -> int:
    if ist[SC, NFREE] == 0:
        return -1
    from_t1 = fq_oldest_free(ist, 0)
    from_t2 = fq_oldest_free(ist, 1)
    p, t1 = fst[FS, 0], ist[SC, LEN0]
    t1_over = t1 > p or (ist[SC, MISS_IN_B2] == 1 and t1 == p)
    if from_t1 >= 0 and (t1_over or from_t2 < 0):
        victim, q = from_t1, 0
    elif from_t2 >= 0:
        victim, q = from_t2, 1
    else:
        return -1
    set_free(ist, victim, False)
    fq_discard(ist, q, victim)
    if q == 0 and ist[SC, NO_GHOST]:
        ist[SC, NO_GHOST] = 0
    else:
        ghost_add(ist, fst, q, key[victim], 0.0)
    # Safety bounds when hooks are driven without on_miss: |T1|+|B1| <= c, all <= 2c.
    c = ist[SC, C]
    ghost_trim(ist, 0, c - ist[SC, LEN0])
    ghost_trim(ist, 1, 2 * c - ist[SC, LEN0] - ist[SC, LEN1] - ghost_len(ist, 0))
    return victim
