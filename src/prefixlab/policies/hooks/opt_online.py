"""OPT online: Belady's rule with only what a serving engine can see, its waiting queue.

A block that no waiting request looks up has an unknown next use, taken as +inf: those go
first, least recently used first. Blocks that a waiting request will look up go last, the
one needed by the request furthest back in the queue first (deepest first among blocks of
the same request, so a prefix is never evicted before its extension).

The engine runner hands the waiting queue to the policy before each step's admissions
(``on_waiting``). The replay runner has no queue, so the policy is refused there.

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state, called by the
class and by the compiled engine (which feeds the waiting queue through
:func:`oo_waiting_begin` / :func:`oo_waiting_add` / :func:`oo_waiting_end` itself, and
only when the queue changed)::

    entry rows  P0: LRU stamp (bumped when the block becomes evictable or is touched)
                FREE: evictable; P1, P2: next and previous evictable block of its key;
                LKEY: the key whose list holds it (a radix split changes a node's key)
    key rows    WPOS: position of the first waiting request that looks the key up (-1);
                WGEN: the waiting queue that last named it; KHEAD: its first evictable block
    slot rows   WLIST, WLIST + 1: the keys WPOS holds (this queue's, the next one's while
                it is fed); an indexed heap (HE, HE + 1 ties, KP ranks,
                HPOS by entry) of the evictable blocks by (rank, tie)

A block's rank is -inf with its LRU stamp as the tie when no waiting request needs it, and
otherwise ``-position`` with ``-depth x 2**40 + stamp`` as the tie: the heap's top is the
victim. A new waiting queue re-ranks only the evictable blocks of the keys whose position
changed (found through their key's list).
"""

from __future__ import annotations

import math

from prefixlab._jit import jit
from prefixlab.policies._arrays import (
    ACCESS,
    EVICT,
    EVICTABLE,
    FREE,
    FROWS,
    HIT_FREE,
    IROWS,
    P0,
    P1,
    P2,
    PINNED,
    REMOVE,
    SC,
    SLOT,
    UPDATE,
    iheap_remove,
    iheap_set,
    set_free,
)
from prefixlab.types import F64, I64

CODE = 7
STAMP, KNEXT, KPREV = P0, P1, P2
# WLIST + 0 / + 1: the listed keys of the current and of the next waiting queue; HE + 1: ties
WPOS, WGEN, KHEAD, WLIST, HE, HPOS, LKEY = (IROWS + i for i in (0, 1, 2, 3, 5, 7, 8))
KP = FROWS
CLOCK, HN, GEN, WCOUNT, WNEW, WROW = (SLOT + i for i in range(6))
_DEPTH_SHIFT = 1 << 40


@jit(nrt=False)
def _place(ist: I64, fst: F64, e: int, key: I64, depth: I64) -> None:
    """Put evictable e in the heap at its rank under the current waiting queue."""
    p = ist[WPOS, key[e]]
    if p < 0:
        iheap_set(ist, fst, KP, HE, HPOS, HN, e, -math.inf, ist[STAMP, e])
    else:
        tie = -depth[e] * _DEPTH_SHIFT + ist[STAMP, e]
        iheap_set(ist, fst, KP, HE, HPOS, HN, e, -float(p), tie)


@jit(nrt=False)
def _set_pos(ist: I64, fst: F64, k: int, p: int, key: I64, depth: I64) -> None:
    """Key k's first waiting position is now p (-1: none): re-rank its evictable blocks."""
    if ist[WPOS, k] == p:
        return
    ist[WPOS, k] = p
    e = ist[KHEAD, k]
    while e >= 0:
        _place(ist, fst, e, key, depth)
        e = ist[KNEXT, e]


@jit(nrt=False)
def oo_waiting_begin(ist: I64) -> None:
    """A new waiting queue follows (oo_waiting_add in queue order, then oo_waiting_end)."""
    ist[SC, GEN] += 1
    ist[SC, WNEW] = 0  # this queue's keys go to the other list row


@jit(nrt=False)
def oo_waiting_add(ist: I64, fst: F64, k: int, pos: int, key: I64, depth: I64) -> None:
    """Waiting request ``pos`` (in queue order) looks key ``k`` up."""
    if ist[WGEN, k] != ist[SC, GEN]:
        ist[WGEN, k] = ist[SC, GEN]
        _set_pos(ist, fst, k, pos, key, depth)
        ist[WLIST + 1 - ist[SC, WROW], ist[SC, WNEW]] = k
        ist[SC, WNEW] += 1


@jit(nrt=False)
def oo_waiting_end(ist: I64, fst: F64, key: I64, depth: I64) -> None:
    """Keys of the old queue that the new one does not name lose their position."""
    row = WLIST + ist[SC, WROW]
    for i in range(ist[SC, WCOUNT]):
        k = ist[row, i]
        if ist[WGEN, k] != ist[SC, GEN]:
            _set_pos(ist, fst, k, -1, key, depth)
    ist[SC, WROW] = 1 - ist[SC, WROW]
    ist[SC, WCOUNT] = ist[SC, WNEW]


@jit(nrt=False)
def _free(ist: I64, fst: F64, e: int, k: int) -> None:
    set_free(ist, e, True)
    ist[LKEY, e] = k
    h = ist[KHEAD, k]
    ist[KNEXT, e], ist[KPREV, e] = h, -1
    if h >= 0:
        ist[KPREV, h] = e
    ist[KHEAD, k] = e


@jit(nrt=False)
def _unfree(ist: I64, fst: F64, e: int) -> None:
    k = ist[LKEY, e]
    set_free(ist, e, False)
    iheap_remove(ist, fst, KP, HE, HPOS, HN, e)
    nx, pv = ist[KNEXT, e], ist[KPREV, e]
    if pv >= 0:
        ist[KNEXT, pv] = nx
    else:
        ist[KHEAD, k] = nx
    if nx >= 0:
        ist[KPREV, nx] = pv


@jit(nrt=False)
def oo_hook(ist: I64, fst: F64, h: int, x: int, key: I64, depth: I64) -> int:
    """Hook h on entry x (insertions, splits and misses change nothing; an update, when a
    radix split gave an evictable node another first key, moves it to that key's list)."""
    if h == EVICTABLE:
        if not ist[FREE, x]:
            _free(ist, fst, x, key[x])
            ist[SC, CLOCK] += 1
            ist[STAMP, x] = ist[SC, CLOCK]
            _place(ist, fst, x, key, depth)
    elif h in (ACCESS, HIT_FREE):
        if ist[FREE, x]:  # an evictable block touched: most recently used now
            ist[SC, CLOCK] += 1
            ist[STAMP, x] = ist[SC, CLOCK]
            if h == HIT_FREE:
                _unfree(ist, fst, x)
            else:
                _place(ist, fst, x, key, depth)
    elif h in (PINNED, REMOVE):
        if ist[FREE, x]:
            _unfree(ist, fst, x)
    elif h == UPDATE:
        if ist[FREE, x] and ist[LKEY, x] != key[x]:
            _unfree(ist, fst, x)
            _free(ist, fst, x, key[x])
            _place(ist, fst, x, key, depth)
    elif h == EVICT:
        if ist[SC, HN] == 0:
            return -1
        e = ist[HE, 0]
        _unfree(ist, fst, e)
        return int(e)
    return 0
