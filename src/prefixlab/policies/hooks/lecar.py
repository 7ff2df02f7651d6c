"""LeCaR (Vietri et al., HotStorage'18): regret-minimising mix of LRU and LFU.

On each eviction an expert (LRU or LFU) is drawn with probability given by its weight; the
victim's key enters that expert's history. A later miss on a key in an expert's history is
regret for that expert: its weight is multiplied by exp(-learning_rate * discount^age),
with ``discount = 0.005 ** (1 / capacity)`` and age counted in insertions and hits (as the
paper and libCacheSim do). Randomness comes
from a seeded generator.

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state (queue 0 = the LRU
order, heap 1 = the LFU order of free entries by (hits, stamp), ghost 0 / 1 = the LRU /
LFU histories), called by the class and by the replay kernel; both draw from the policy's
one ``numpy.random.Generator``.
"""

from __future__ import annotations

import math

import numpy as np

from prefixlab._jit import jit
from prefixlab.policies._arrays import (
    FREE,
    FS,
    HEAP0,
    HN0,
    NFREE,
    P0,
    P1,
    P2,
    SC,
    SLOT,
    fq_append,
    fq_discard,
    fq_oldest_free,
    ghost_add,
    ghost_pop,
    heap_drop_top,
    heap_push,
    set_free,
)
from prefixlab.types import F64, I64

CODE = 3
# entry rows: hits (0: not tracked), stamp of the last touch, LFU item dropped while pinned
FREQ, STAMP, DROPPED = P0, P1, P2
TIME = SLOT  # scalar slot; float scalars: discount, w_lru, learning rate
DISCOUNT, W_LRU, RATE = 0, 1, 2
LFU = 2  # lazy heap 2: (hits, stamp) items of tracked entries


@jit(nrt=False)
def _lfu_push(ist: I64, e: int) -> None:
    """Give e a live LFU item if it is free, else mark it so that freeing it does."""
    if ist[FREE, e]:
        ist[DROPPED, e] = 0
        heap_push(ist, LFU, ist[FREQ, e], ist[STAMP, e], e)
    else:
        ist[DROPPED, e] = 1


@jit(nrt=False)
def _lfu_victim(ist: I64) -> int:
    """Fewest hits, then oldest stamp, among free entries. Stale items and pinned
    entries' items are dropped (freeing a pinned entry pushes it back)."""
    ra, rb, re = HEAP0 + 3 * LFU, HEAP0 + 3 * LFU + 1, HEAP0 + 3 * LFU + 2
    while ist[SC, HN0 + LFU] > 0:
        e = ist[re, 0]
        if ist[FREQ, e] > 0 and ist[STAMP, e] == ist[rb, 0] and ist[FREQ, e] == ist[ra, 0]:
            if ist[FREE, e]:
                return int(e)
            ist[DROPPED, e] = 1
        heap_drop_top(ist, LFU)
    return -1


@jit(nrt=False)
def _touch(ist: I64, e: int) -> None:
    ist[SC, TIME] += 1
    ist[STAMP, e] = ist[SC, TIME]
    fq_append(ist, 0, e)
    _lfu_push(ist, e)


@jit(nrt=False)
def lecar_regret(ist: I64, fst: F64, key: int) -> None:
    """A miss on a key in an expert's history is regret for that expert."""
    for g in range(2):
        when = ghost_pop(ist, fst, g, key)
        if when >= 0.0:
            regret = fst[FS, DISCOUNT] ** (float(ist[SC, TIME]) - when)
            w_lru, w_lfu = fst[FS, W_LRU], 1.0 - fst[FS, W_LRU]
            if g == 0:
                w_lru *= math.exp(-fst[FS, RATE] * regret)
            else:
                w_lfu *= math.exp(-fst[FS, RATE] * regret)
            fst[FS, W_LRU] = w_lru / (w_lru + w_lfu)


@jit(nrt=False)
def lecar_insert(ist: I64, fst: F64, e: int, key: int) -> None:
    lecar_regret(ist, fst, key)  # a no-op when on_miss already charged it
    ist[FREQ, e] = 1
    _touch(ist, e)


@jit(nrt=False)
def lecar_access(ist: I64, e: int) -> None:
    if ist[FREQ, e] > 0:
        ist[FREQ, e] += 1
        _touch(ist, e)


@jit(nrt=False)
def lecar_set_free(ist: I64, e: int, free: bool) -> None:
    set_free(ist, e, free)
    if free and ist[FREQ, e] > 0 and ist[DROPPED, e]:
        _lfu_push(ist, e)


@jit(nrt=False)
def lecar_remove(ist: I64, e: int) -> None:
    set_free(ist, e, False)
    fq_discard(ist, 0, e)
    ist[FREQ, e] = 0
    ist[DROPPED, e] = 0


@jit()
def lecar_pop(ist: I64, fst: F64, key: I64, rng: np.random.Generator) -> int:
    if ist[SC, NFREE] == 0:
        return -1
    use_lru = rng.random() < fst[FS, W_LRU]
    victim = fq_oldest_free(ist, 0) if use_lru else _lfu_victim(ist)
    ghost_add(ist, fst, 0 if use_lru else 1, key[victim], float(ist[SC, TIME]))
    lecar_remove(ist, victim)
    return victim
