"""Workload-aware eviction: ``wa-atc25`` ("KVCache Cache in the Wild", Wang et al., USENIX
ATC'25, arXiv 2506.02634) and ``wa``, the per-category LRU the UniCache paper compares with.

The paper observes that, within one request *category* (request type and turn), the time
to a block's next reuse is predictable and roughly exponential, and that head blocks of a
prompt are worth more than tail blocks. WA therefore:

1. fits, per category, on a profiling window, the probability ``p_c`` that a block touched
   by a request of the category is touched again, and an exponential reuse-time
   distribution (rate ``lambda_c = 1 / mean reuse time``, its maximum-likelihood estimate);
2. keeps one LRU queue per category (a block belongs to the category of the request that
   last stored or reused it) and, at eviction, scores only each queue's head by the
   probability that it is reused within the next ``window_s`` seconds::

       P = p_c * (exp(-lambda_c * age) - exp(-lambda_c * (age + window_s)))

   with ``age = t_now - t_last``. The lowest ``P`` goes; ties go to the later (tail)
   block. Within a queue, blocks released together leave tail first.

Our reading, where the paper's text was not available to check: a category is the task
label and the turn (``turn + 1``, turns from ``max_turn`` on merged); the profiling window
is the first ``profile`` share of the requests (the authors' demo profiles one hour and
serves the next), replayed like the rest; a reuse is the next request that touches the
key (looks it up or stores it) inside the window; categories with fewer than
``min_samples`` touches use the fit over all categories.

``wa`` is the baseline as the UniCache paper defines it: "A workload-aware cache eviction
policy that applies LRU within each workload" (Sec. 6.1; Sec. 1: it "classifies requests by
task category (e.g., multi-turn or single-turn) and applies LRU within each category
separately"). A category is the task label (``max_turn=1``; larger values split by turn as
above). The paper does not say how the categories share the capacity; ours: in proportion
to their reuses in the profiling window, the category most over its share evicting its least
recently used block.

Time: the engine runner's simulated clock; under the replay runner, the arrival time of the
request being processed.

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state, called by the
class and by the replay and engine kernels. Each category's evictable blocks form a sorted
list by (last touch, push order), whose head is the least recent (a pairing heap,
:func:`prefixlab.policies._arrays.slist_insert`)::

    entry rows     CAT TOKEN PREV NEXT CHILD (int; CHILD is row TAIL), TLAST (float)
    category rows  HEAD COUNT (evictable; int), HELD PROB RATE SHARE (float)
"""

from __future__ import annotations

import math

import numpy as np

from prefixlab._jit import jit
from prefixlab._keytable import kcell, with_room
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
    set_free,
    slist_insert,
    slist_remove,
)
from prefixlab.types import F64, I64
from prefixlab.workload.trace import BlockLayout, Trace


def categories(
    trace: Trace, max_turn: int, names: dict[str, int] | None = None
) -> tuple[list[str], I64]:
    """The category names and each request's category index (task label, and the turn
    unless ``max_turn`` is 1). ``names``: the categories met so far (a streamed trace's
    earlier chunks), numbered in order of first appearance; new ones are added to it."""
    names = {} if names is None else names
    out = np.zeros(len(trace), dtype=np.int64)
    for i, (task, turn) in enumerate(zip(trace.task, trace.turn.tolist(), strict=True)):
        t = int(turn) + 1
        label = task or "(none)"
        if max_turn > 1:
            label = f"{label}_{t if t < max_turn else f'{max_turn}+'}"
        out[i] = names.setdefault(label, len(names))
    return list(names), out


class CategoryFit:
    """Per category, over the requests of a profiling window given in order (one chunk
    after another): how many key touches, how many reuses, and the sum of the reuse
    times. A touch of a key is a request storing or looking it up; its reuse is the next
    touch of the same key inside the window, counted for the earlier touch's category
    when the later one is met. Memory: one entry per distinct key touched."""

    def __init__(self) -> None:
        self.table = np.full((16, 2), -1, np.int64)  # key -> its record
        self.last_cat = np.zeros(16, np.int64)  # record -> the last touch's category,
        self.last_at = np.zeros(16, np.float64)  # and its arrival
        self.used = 0
        self.acc = np.zeros((3, 1), np.float64)  # touches, reuses, reuse-time sums

    def add(self, keys: I64, offs: I64, arrival: F64, cat: I64, count: int) -> None:
        """The chunk's first ``count`` requests (keys: any 64-bit ids, equal when the
        blocks are; offs: each request's key range)."""
        if count <= 0:
            return
        need = self.used + int(offs[count] - offs[0])
        self.table = with_room(self.table, need)
        if need > self.last_cat.shape[0]:
            grown = max(need, 2 * self.last_cat.shape[0])
            self.last_cat = np.resize(self.last_cat, grown)
            self.last_at = np.resize(self.last_at, grown)
        ncat = max(int(cat[:count].max()) + 1, self.acc.shape[1])
        if ncat > self.acc.shape[1]:
            self.acc = np.pad(self.acc, ((0, 0), (0, ncat - self.acc.shape[1])))
        self.used = _fit_pass(
            keys,
            offs,
            arrival,
            cat,
            count,
            self.table,
            self.last_cat,
            self.last_at,
            self.used,
            self.acc,
        )

    def result(self, num_cats: int, min_samples: int) -> tuple[F64, F64, F64]:
        """Per category: reuse probability, exponential rate, and the number of reuses
        (categories with fewer than ``min_samples`` touches take the fit over all)."""
        acc = np.zeros((3, num_cats), np.float64)
        k = min(num_cats, self.acc.shape[1])
        acc[:, :k] = self.acc[:, :k]
        touches, reused, gap_sum = acc
        all_p = reused.sum() / max(touches.sum(), 1.0)
        all_rate = reused.sum() / max(gap_sum.sum(), 1e-9) if reused.sum() else 1.0
        p = np.where(touches >= min_samples, reused / np.maximum(touches, 1.0), all_p)
        rate = np.where(
            (touches >= min_samples) & (reused > 0), reused / np.maximum(gap_sum, 1e-9), all_rate
        )
        return p.astype(np.float64), rate.astype(np.float64), reused.copy()


@jit()
def _fit_pass(
    keys: I64,
    offs: I64,
    arrival: F64,
    cat: I64,
    count: int,
    table: I64,
    last_cat: I64,
    last_at: F64,
    used: int,
    acc: F64,
) -> int:
    for r in range(count):
        c, t = cat[r], arrival[r]
        for j in range(offs[r], offs[r + 1]):
            acc[0, c] += 1.0
            cell = kcell(table, keys[j])
            x = table[cell, 1]
            if x < 0:
                x = used
                used += 1
                table[cell, 0] = keys[j]
                table[cell, 1] = x
            else:
                acc[1, last_cat[x]] += 1.0
                acc[2, last_cat[x]] += t - last_at[x]
            last_cat[x] = c
            last_at[x] = t
    return used


def fit_categories(
    layout: BlockLayout, arrival: F64, cat: I64, num_cats: int, upto: int, min_samples: int
) -> tuple[F64, F64, F64]:
    """Per category, on requests ``[0, upto)``: reuse probability, exponential rate, and the
    number of reuses (:class:`CategoryFit`)."""
    fit = CategoryFit()
    fit.add(layout.keys, layout.key_offsets, arrival, cat, upto)
    return fit.result(num_cats, min_samples)


# int rows (per entry, then per category) and float rows; scalar slots
CAT, TOKEN, PREV, NEXT, HEAD, TAIL, COUNT = range(IROWS, IROWS + 7)  # sorted lists: NEXT = PREV + 1
TLAST, HELD, PROB, RATE, SHARE = range(FROWS, FROWS + 5)
NEXT_TOKEN, NCATS, MODE = SLOT, SLOT + 1, SLOT + 2
WINDOW = 0  # float scalar
AUX_CAT = 1  # aux rows: arrival, category
CODE = 5


@jit(inline=True)
def reuse_chance(p: float, lam: float, age: float, window: float) -> float:
    """P(reuse within ``window``) of a block idle ``age``: p (e^-lam age - e^-lam (age+w))."""
    return p * (math.exp(-lam * age) - math.exp(-lam * (age + window)))


@jit(nrt=False)
def _unlist(ist: I64, fst: F64, e: int) -> bool:
    """Take e out of its category's list; True if it was there (evictable)."""
    if ist[TOKEN, e] < 0:
        return False
    slist_remove(ist, fst, TLAST, TOKEN, PREV, HEAD, ist[CAT, e], e)
    ist[TOKEN, e] = -1
    ist[COUNT, ist[CAT, e]] -= 1
    set_free(ist, e, False)
    return True


@jit(nrt=False)
def _push(ist: I64, fst: F64, e: int) -> None:
    """List e in its category, after every entry touched earlier or at its time."""
    ist[TOKEN, e] = ist[SC, NEXT_TOKEN]
    ist[SC, NEXT_TOKEN] += 1
    ist[COUNT, ist[CAT, e]] += 1
    set_free(ist, e, True)
    slist_insert(ist, fst, TLAST, TOKEN, PREV, HEAD, ist[CAT, e], e)


@jit(nrt=False)
def _touch(ist: I64, fst: F64, e: int, aux: F64) -> None:
    c = int(aux[AUX_CAT, ist[SC, REQ] - ist[SC, ABASE]])
    if ist[CAT, e] >= 0:
        fst[HELD, ist[CAT, e]] -= 1.0
    ist[CAT, e] = c
    fst[HELD, c] += 1.0
    fst[TLAST, e] = fst[FS, NOW]


@jit(nrt=False)
def _choose(ist: I64, fst: F64, depth: I64) -> int:
    """The head with the lowest reuse probability (wa-atc25: ties to the deeper block,
    then the lower category), or (wa) the head of the category most over its share (ties
    to the older head, then the lower category); -1 when nothing is evictable."""
    now = fst[FS, NOW]
    window = fst[FS, WINDOW]
    total = 0.0
    for c in range(ist[SC, NCATS]):
        total += fst[HELD, c]
    total = max(total, 1.0)
    best = -1
    k0, k1 = 0.0, 0.0
    for c in range(ist[SC, NCATS]):
        if ist[COUNT, c] <= 0:
            continue
        e = ist[HEAD, c]
        if ist[SC, MODE] == 0:
            age = max(now - fst[TLAST, e], 0.0)
            a = reuse_chance(fst[PROB, c], fst[RATE, c], age, window)
            b = -float(depth[e])
        else:
            a = -(fst[HELD, c] / total - fst[SHARE, c])
            b = fst[TLAST, e]
        if best < 0 or a < k0 or (a == k0 and b < k1):
            best, k0, k1 = e, a, b
    return int(best)


@jit(inline=True)
def wa_hook(ist: I64, fst: F64, h: int, x: int, depth: I64, aux: F64) -> int:
    """Hook h (named in :mod:`prefixlab.policies._arrays`) on entry x."""
    if h == INSERT:
        _touch(ist, fst, x, aux)
    elif h == ACCESS:  # re-listed in its (new) category with its new time
        free = _unlist(ist, fst, x)
        _touch(ist, fst, x, aux)
        if free:
            _push(ist, fst, x)
    elif h == HIT_FREE:  # pinned by the hit: off its list
        _unlist(ist, fst, x)
        _touch(ist, fst, x, aux)
    elif h == EVICTABLE:
        _push(ist, fst, x)
    elif h == PINNED:
        _unlist(ist, fst, x)
    elif h == REMOVE:
        _unlist(ist, fst, x)
        if ist[CAT, x] >= 0:
            fst[HELD, ist[CAT, x]] -= 1.0
        ist[CAT, x] = -1
    elif h == EVICT:
        e = _choose(ist, fst, depth)
        if e >= 0:
            _unlist(ist, fst, e)
            fst[HELD, ist[CAT, e]] -= 1.0
            ist[CAT, e] = -1
        return e
    return 0
