"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost FIFO.

New entries enter S unless their key is in the ghost G (then M). Hits raise a 2-bit counter
(capped at 3). Evicting from S: an entry hit at least ``move_to_main_threshold`` times moves
to M, otherwise it is evicted and its key enters G. Evicting from M: an entry with a non-zero
counter is reinserted with the counter decremented (CLOCK-like), otherwise evicted. S is
drained while it holds at least ``small_ratio`` of the capacity. Pinned entries are skipped.

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state (queue 0 = S,
queue 1 = M, ghost 0 = G), called by the class and by the replay kernel.
"""

from __future__ import annotations

from prefixlab._jit import jit
from prefixlab.policies._arrays import (
    LEN0,
    NFREE,
    P0,
    P1,
    SC,
    SLOT,
    fq_append,
    fq_discard,
    fq_oldest_free,
    ghost_add,
    ghost_contains,
    ghost_pop,
    set_free,
)
from prefixlab.types import F64, I64

CODE = 2
FREQ, HAS_FREQ = P0, P1  # entry rows
SMALL_TARGET, THRESHOLD = SLOT, SLOT + 1  # scalar slots


@jit(nrt=False)
def s3fifo_insert(ist: I64, fst: F64, e: int, key: int) -> None:
    ist[FREQ, e] = 0
    ist[HAS_FREQ, e] = 1
    if ghost_contains(ist, 0, key):
        ghost_pop(ist, fst, 0, key)
        fq_append(ist, 1, e)
    else:
        fq_append(ist, 0, e)


@jit(nrt=False)
def s3fifo_access(ist: I64, e: int) -> None:
    if ist[HAS_FREQ, e]:
        ist[FREQ, e] = min(ist[FREQ, e] + 1, 3)


@jit(nrt=False)
def s3fifo_remove(ist: I64, e: int) -> None:
    set_free(ist, e, False)
    fq_discard(ist, 0, e)
    fq_discard(ist, 1, e)
    ist[HAS_FREQ, e] = 0


@jit(nrt=False)
def _evict_small(ist: I64, fst: F64, key: I64) -> int:
    e = fq_oldest_free(ist, 0)
    while e >= 0:
        fq_discard(ist, 0, e)
        if ist[FREQ, e] >= ist[SC, THRESHOLD]:
            ist[FREQ, e] = 0
            fq_append(ist, 1, e)
        else:
            ghost_add(ist, fst, 0, key[e], 0.0)
            return e
        e = fq_oldest_free(ist, 0)
    return -1


@jit(nrt=False)
def _evict_main(ist: I64) -> int:
    # Every pass over a free entry decrements its counter (<= 3), so this terminates.
    e = fq_oldest_free(ist, 1)
    while e >= 0:
        if ist[FREQ, e] > 0:
            ist[FREQ, e] -= 1
            fq_append(ist, 1, e)
        else:
            fq_discard(ist, 1, e)
            return e
        e = fq_oldest_free(ist, 1)
    return -1


@jit(nrt=False)
def s3fifo_pop(ist: I64, fst: F64, key: I64) -> int:
    if ist[SC, NFREE] == 0:
        return -1
    victim = -1
    if ist[SC, LEN0] >= ist[SC, SMALL_TARGET]:
        victim = _evict_small(ist, fst, key)
    if victim < 0:
        victim = _evict_main(ist)
    if victim < 0:
        victim = _evict_small(ist, fst, key)
    if victim < 0:
        # S's evictable entries had all been hit and were just promoted: evict from M.
        victim = _evict_main(ist)
    if victim >= 0:
        set_free(ist, victim, False)
        ist[HAS_FREQ, victim] = 0
    return victim
