"""LPC (learned prefix caching): evict the blocks of the conversations least likely to go on.

Each cached block carries a continuation probability ``p`` and a last-access time ``t``,
ranked by the probability decayed with idle time (the paper's Sec. 3.4.2)::

    p_cur = p d / (p d + 1 - p),   d = exp(-(t_now - t) * scale)   (scale 1e-2 / s)

(the odds of continuing shrink by ``d``). Which ``p`` and ``t`` a block carries (Sec.
3.4-3.5, read from ``../shared/papers/lpc-summary-zh.md``):

- a finished sequence's blocks enter the heap with *that request's* prediction and its
  time, so a conversation's latest turn replaces what its earlier turns predicted for the
  blocks it alone uses;
- a block shared by several conversations (a system prompt, a common first question) keeps
  each conversation's latest prediction and time and ranks by the largest of their decayed
  values (Sec. 3.5's max-pooling across conversations). The decay shrinks every
  conversation's odds by the same factor, so the largest stays the largest: it is the
  conversation with the largest ``logit(p) + scale * t``, found once per access.

Blocks enter a min-heap when they become evictable (their sequence finished); a hit pins
them, taking them out; every ``update_interval_s`` (10 s) every evictable block is
re-ranked with the current time, and in between the heap keeps the ranks it had. Ties go
to the block that became evictable first.

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state, called by the
class and by the replay kernels: an indexed heap of evictable entries, and per shared
entry a list of its conversations' (p, t) records, taken from a pool that grows (records
of an evicted entry are freed)::

    entry rows   OWNER (conversation; -1 none, -2 shared)  HEAD/TAIL/NREC (its records)
                 BEST (the record it ranks by)  ORDER  HPOS (heap position)
    heap rows    HE (heap position -> entry) KO, KP (float): its order and rank
    float rows   P T (per entry), RP RT (records)
    record rows  RCONV RENTRY RNEXT RSEQ (int), RP RT (float); free ones chained from
                 FREE_HEAD; TABLE: open addressing (entry, conversation) -> record

A conversation's record is found through the table and the entry keeps the record it
ranks by, so an access costs O(1) unless the leading conversation's own rank falls.

``lpc:model=PATH`` uses a trained predictor (``prefixlab lpc train``); ``lpc-oracle`` uses
the true label (does the conversation continue after this request?) as ``p``. LPC's
predictor takes GPU memory the cache cannot use (1 GB in the paper's setup, "for a fair
comparison with LRU, LPC's available prefix-cache size is reduced by this 1 GB"):
``predictor_bytes`` (default 1 GiB for ``lpc``, 0 for the oracle) is deducted from the
capacity by the runners, which need the model (bytes per block) to do it.

Time: the engine runner's simulated clock; under the replay runner, the arrival time of the
request being processed.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np
import numpy.typing as npt

from prefixlab._jit import jit
from prefixlab.policies._arrays import (
    ABASE,
    ACCESS,
    EVICT,
    EVICTABLE,
    FROWS,
    FS,
    HIT_FREE,
    INSERT,
    IROWS,
    NOW,
    PINNED,
    REMOVE,
    REQ,
    SC,
    SLOT,
    SPLIT,
    UPDATE,
    iheap_remove,
    iheap_set,
    iheap_sift_down,
    set_free,
    widen,
)
from prefixlab.types import F64, I64

CODE = 4
# int rows (per entry, then heap positions, then records) and float rows
OWNER, HEAD, TAIL, ORDER, HPOS, BEST, NREC = range(IROWS, IROWS + 7)
HE, KO, RCONV, RNEXT, RENTRY, RSEQ, TABLE = range(IROWS + 7, IROWS + 14)  # KO = HE + 1
P, T, KP, RP, RT = range(FROWS, FROWS + 5)
# scalar slots; float scalars
HN, NEXT_ORDER, FREE_HEAD, RTOP, NFREE_REC, MAXREC, NEXT_SEQ = (SLOT + i for i in range(7))
TSIZE = SLOT + 7  # the table's cells (its own: a state widened elsewhere keeps it valid)
SCALE, INTERVAL, LAST_UPDATE = 0, 1, 2
# aux rows: arrival, prediction, conversation
AUX_PROB, AUX_CONV = 1, 2


@jit(inline=True)
def _decayed(p: float, idle: float, scale: float) -> float:
    if p >= 1.0:  # certainty: d / d = 1 however small d is (even once exp underflows)
        return 1.0
    if p <= 0.0:  # 0 d / (0 d + 1) = 0 without computing d
        return 0.0
    d = math.exp(-idle * scale)
    pd = p * d
    den = pd + 1.0 - p
    return pd / den if den > 0 else 0.0


@overload
def decayed(p: float, idle_s: float, scale: float) -> float: ...
@overload
def decayed(p: npt.ArrayLike, idle_s: npt.ArrayLike, scale: float) -> F64 | float: ...
def decayed(p: npt.ArrayLike, idle_s: npt.ArrayLike, scale: float) -> F64 | float:
    """LPC's decayed continuation probability (floats or arrays, elementwise)."""
    pa, ia = np.broadcast_arrays(np.asarray(p, np.float64), np.asarray(idle_s, np.float64))
    out = np.array(
        [_decayed(float(a), float(b), scale) for a, b in zip(pa.flat, ia.flat, strict=True)]
    )
    return out.reshape(pa.shape) if pa.shape else out[0]


@jit(inline=True)
def _rank(p: float, t: float, scale: float) -> float:
    """Order of a conversation's decayed probability at any later time: log-odds + scale t."""
    if p >= 1.0:
        return math.inf
    if p <= 0.0:
        return -math.inf
    return math.log(p / (1.0 - p)) + scale * t


# ----------------------------------------------------------------------------- heap
@jit(nrt=False)
def _rerank(ist: I64, fst: F64, e: int) -> None:
    """Rank e by its decayed probability now (inserting it in the heap if absent)."""
    rank = _decayed(fst[P, e], fst[FS, NOW] - fst[T, e], fst[FS, SCALE])
    iheap_set(ist, fst, KP, HE, HPOS, HN, e, rank, ist[ORDER, e])


@jit(inline=True)
def _unheap(ist: I64, fst: F64, e: int) -> None:
    iheap_remove(ist, fst, KP, HE, HPOS, HN, e)


# ----------------------------------------------------------------------------- records
@jit(inline=True)
def _slot(e: int, conv: int, width: int) -> int:
    return int((e * 1_000_003 + (conv + 2) * 998_244_353) % width)


@jit(nrt=False)
def _find(ist: I64, e: int, conv: int) -> int:
    """The record of (e, conv), or -1."""
    w = ist[SC, TSIZE]
    s = _slot(e, conv, w)
    while True:
        x = ist[TABLE, s]
        if x < 0:
            return -1
        if ist[RENTRY, x] == e and ist[RCONV, x] == conv:
            return int(x)
        s = s + 1 if s + 1 < w else 0


@jit(nrt=False)
def _table_add(ist: I64, x: int) -> None:
    w = ist[SC, TSIZE]
    s = _slot(ist[RENTRY, x], ist[RCONV, x], w)
    while ist[TABLE, s] >= 0:
        s = s + 1 if s + 1 < w else 0
    ist[TABLE, s] = x


@jit(nrt=False)
def _table_drop(ist: I64, x: int) -> None:
    """Remove record x from the table (backward-shift deletion keeps probes unbroken)."""
    w = ist[SC, TSIZE]
    s = _slot(ist[RENTRY, x], ist[RCONV, x], w)
    while ist[TABLE, s] != x:
        s = s + 1 if s + 1 < w else 0
    ist[TABLE, s] = -1
    j = s
    while True:
        j = j + 1 if j + 1 < w else 0
        y = ist[TABLE, j]
        if y < 0:
            return
        k = _slot(ist[RENTRY, y], ist[RCONV, y], w)
        if (k <= s or k > j) if s <= j else (k <= s and k > j):
            ist[TABLE, s] = y
            ist[TABLE, j] = -1
            s = j


@jit()
def lpc_reserve(ist: I64, fst: F64, n: int) -> tuple[I64, F64]:
    """Room for the records of n more hooks (an access adds at most two, a split, at most
    two per request, copies one entry's, and no entry ever had more than MAXREC), with the
    table of (entry, conversation) -> record at most half full."""
    need = 2 * n + 2 * ist[SC, MAXREC] + 2
    live = ist[SC, RTOP] - ist[SC, NFREE_REC]
    w = ist.shape[1]
    if w - ist[SC, RTOP] + ist[SC, NFREE_REC] >= need and 2 * (live + need) <= ist[SC, TSIZE]:
        return ist, fst
    i2, f2 = widen(ist, fst, 2 * w + 4 * need)
    i2[TABLE] = -1  # slots depend on the table's size: rebuild
    i2[SC, TSIZE] = i2.shape[1]
    for e in range(i2.shape[1]):
        x = i2[HEAD, e]
        while x >= 0:
            _table_add(i2, x)
            x = i2[RNEXT, x]
    return i2, f2


@jit(nrt=False)
def _record(ist: I64, fst: F64, e: int, conv: int, p: float, t: float) -> int:
    """Append a (conversation, p, t) record to e's list; returns it."""
    r = ist[SC, FREE_HEAD]
    if r >= 0:
        ist[SC, FREE_HEAD] = ist[RNEXT, r]
        ist[SC, NFREE_REC] -= 1
    else:
        r = ist[SC, RTOP]
        ist[SC, RTOP] = r + 1
    ist[RCONV, r] = conv
    ist[RENTRY, r] = e
    ist[RSEQ, r] = ist[SC, NEXT_SEQ]
    ist[SC, NEXT_SEQ] += 1
    fst[RP, r] = p
    fst[RT, r] = t
    ist[RNEXT, r] = -1
    ist[NREC, e] += 1
    ist[SC, MAXREC] = max(ist[SC, MAXREC], ist[NREC, e])
    tail = ist[TAIL, e]
    if tail >= 0:
        ist[RNEXT, tail] = r
    else:
        ist[HEAD, e] = r
    ist[TAIL, e] = r
    _table_add(ist, r)
    return int(r)


@jit(nrt=False)
def _forget(ist: I64, e: int) -> None:
    """Free e's records."""
    r = ist[HEAD, e]
    while r >= 0:
        _table_drop(ist, r)
        nxt = ist[RNEXT, r]
        ist[RNEXT, r] = ist[SC, FREE_HEAD]
        ist[SC, FREE_HEAD] = r
        ist[SC, NFREE_REC] += 1
        r = nxt
    ist[HEAD, e] = -1
    ist[TAIL, e] = -1
    ist[NREC, e] = 0
    ist[BEST, e] = -1


@jit(inline=True)
def _above(ist: I64, fst: F64, x: int, y: int, scale: float) -> bool:
    """Record x ranks above record y: a larger (log-odds rank, time), or equal and listed
    first (``max`` over the conversations in the order they came)."""
    rx, ry = _rank(fst[RP, x], fst[RT, x], scale), _rank(fst[RP, y], fst[RT, y], scale)
    if rx != ry:
        return bool(rx > ry)
    if fst[RT, x] != fst[RT, y]:
        return bool(fst[RT, x] > fst[RT, y])
    return bool(ist[RSEQ, x] < ist[RSEQ, y])


# ----------------------------------------------------------------------------- hooks
@jit(nrt=False)
def _access(ist: I64, fst: F64, e: int, aux: F64) -> None:
    r = ist[SC, REQ] - ist[SC, ABASE]
    q, now, c = aux[AUX_PROB, r], fst[FS, NOW], int(aux[AUX_CONV, r])
    if ist[OWNER, e] == c:  # the conversation's latest prediction replaces its earlier one
        fst[P, e] = q
        fst[T, e] = now
    else:  # another conversation's block: now shared, ranked by the largest
        scale = fst[FS, SCALE]
        if ist[OWNER, e] != -2:
            ist[BEST, e] = _record(ist, fst, e, ist[OWNER, e], fst[P, e], fst[T, e])
            ist[OWNER, e] = -2
        best = ist[BEST, e]
        x = _find(ist, e, c)
        if x < 0:
            x = _record(ist, fst, e, c, q, now)
            if _above(ist, fst, x, best, scale):
                ist[BEST, e] = x
        else:
            old_rank, old_t = _rank(fst[RP, x], fst[RT, x], scale), fst[RT, x]
            fst[RP, x] = q
            fst[RT, x] = now
            new_rank = _rank(q, now, scale)
            if x != best:
                if _above(ist, fst, x, best, scale):
                    ist[BEST, e] = x
            elif new_rank < old_rank or (new_rank == old_rank and now < old_t):
                best = ist[HEAD, e]  # the leader fell: look again
                y = ist[RNEXT, best]
                while y >= 0:
                    if _above(ist, fst, y, best, scale):
                        best = y
                    y = ist[RNEXT, y]
                ist[BEST, e] = best
        best = ist[BEST, e]
        fst[P, e] = fst[RP, best]
        fst[T, e] = fst[RT, best]
    if ist[HPOS, e] >= 0:
        _rerank(ist, fst, e)


@jit(inline=True)
def lpc_hook(ist: I64, fst: F64, h: int, x: int, y: int, aux: F64) -> int:
    """Hook h (named in :mod:`prefixlab.policies._arrays`) on entry x."""
    if h == INSERT:  # insert: the request's prediction and time; its conversation owns it
        r = ist[SC, REQ] - ist[SC, ABASE]
        fst[P, x] = aux[AUX_PROB, r]
        fst[T, x] = fst[FS, NOW]
        ist[OWNER, x] = int(aux[AUX_CONV, r])
        _forget(ist, x)
    elif h == ACCESS:
        _access(ist, fst, x, aux)
    elif h == HIT_FREE:  # pinned first: the access then has no rank to update
        set_free(ist, x, False)
        _unheap(ist, fst, x)
        _access(ist, fst, x, aux)
    elif h == EVICTABLE:  # evictable: ranked now; ties to the first to become evictable
        set_free(ist, x, True)
        ist[ORDER, x] = ist[SC, NEXT_ORDER]
        ist[SC, NEXT_ORDER] += 1
        _rerank(ist, fst, x)
    elif h == PINNED:
        set_free(ist, x, False)
        _unheap(ist, fst, x)
    elif h == REMOVE:  # removed
        set_free(ist, x, False)
        _unheap(ist, fst, x)
        fst[P, x] = 0.0
        fst[T, x] = 0.0
        ist[OWNER, x] = -1
        _forget(ist, x)
    elif h == EVICT:
        return _pop(ist, fst)
    elif h == UPDATE:  # changed without an access: re-rank, credit nothing
        if ist[HPOS, x] >= 0:
            _rerank(ist, fst, x)
    elif h == SPLIT:  # split: the upper part x inherits the lower part's conversations
        fst[P, x] = fst[P, y]
        fst[T, x] = fst[T, y]
        ist[OWNER, x] = ist[OWNER, y]
        _forget(ist, x)
        r = ist[HEAD, y]
        while r >= 0:
            copy = _record(ist, fst, x, ist[RCONV, r], fst[RP, r], fst[RT, r])
            if r == ist[BEST, y]:
                ist[BEST, x] = copy
            r = ist[RNEXT, r]
    return 0


@jit(nrt=False)
def _pop(ist: I64, fst: F64) -> int:
    now = fst[FS, NOW]
    if now - fst[FS, LAST_UPDATE] >= fst[FS, INTERVAL]:  # new ranks for every evictable
        fst[FS, LAST_UPDATE] = now
        n = ist[SC, HN]
        scale = fst[FS, SCALE]
        for i in range(n):
            e = ist[HE, i]
            fst[KP, i] = _decayed(fst[P, e], now - fst[T, e], scale)
        for i in range(n // 2 - 1, -1, -1):
            iheap_sift_down(ist, fst, KP, HE, HPOS, HN, i)
    if ist[SC, HN] == 0:
        return -1
    e = ist[HE, 0]
    _unheap(ist, fst, e)
    set_free(ist, e, False)
    _forget(ist, e)
    return int(e)
