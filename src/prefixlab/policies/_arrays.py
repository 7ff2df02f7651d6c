"""Array state for queue-and-ghost policies (ARC, S3-FIFO, LeCaR, and the others).

One state layout serves every such policy, so that the compiled replay kernel can carry any
of them: two 2-D arrays, ``I`` (int64) and ``F`` (float64), whose rows are indexed by
entry, by key or by slot, and whose last row holds scalars. Two arrays, not a tuple of
many, because a compiled call copies and reference-counts every array it is given. The
functions are :func:`prefixlab._jit.jit` functions: the policy classes
(:mod:`prefixlab.policies.array_policy`) call them through
:mod:`prefixlab.policies._dispatch` in batches, the kernel entry by entry::

    I rows   by entry: MEMBER POSITION FREE MISSING P0 P1 P2  (P*: the policy's own)
             by key:   GSEQ0 GSEQ1 K0 K1       (ghost stamps; the policy's own)
             by slot:  ghost rings (key, stamp) x 2; lazy heaps (a, b, entry) x 3
             SC:       scalars (counts, heads, tails, limits, the policy's own from SLOT)
    F rows   by key:   GWHEN0 GWHEN1           FS: float scalars

An *ordered queue* (``fq_*``) keeps members in append order and finds its oldest free
member in O(log n) amortised, however many pinned members lie ahead of it. Each member has
a position (a counter bumped by an append) and at most one live (position, entry) item: an
append of a free member goes to the back of the queue's ring (positions only grow there),
and a member that becomes free with no live item goes to the queue's lazy heap (heap q).
An item is live while its entry is still a member at that position; stale items and pinned
members' items are dropped when they reach the front, and the oldest free member is the
older of the ring's front and the heap's top. A *ghost list*
(``ghost_*``) is a bounded FIFO of keys with O(1) membership.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from prefixlab._jit import jit
from prefixlab.types import F64, I64
from prefixlab.workload.trace import BlockLayout

#: ``passes(forward)``: (first request, layout, the policy's columns) per chunk of a
#: streamed trace, first to last (forward) or last to first
ChunkPasses = Callable[[bool], Iterator[tuple[int, BlockLayout, F64]]]

State = tuple[I64, F64]

# I rows
MEMBER, POSITION, FREE, MISSING, P0, P1, P2 = range(7)
GSEQ0, K0, K1 = 7, 9, 10  # GSEQ1 = 8
GRING0 = 11  # ghost g: keys in row GRING0 + 2g, stamps in GRING0 + 2g + 1
HEAP0 = 15  # lazy heap h: a, b, entry in rows HEAP0 + 3h .. + 2
RING0 = 24  # queue q's appends: positions in row RING0 + 2q, entries in RING0 + 2q + 1
SC = 28
IROWS = 29
# F rows
GWHEN0, FS = 0, 2  # GWHEN1 = 1
FROWS = 3
# scalar slots in I[SC]
LEN0, LEN1, NFREE, NEXTPOS = 0, 1, 2, 3
HN0 = 4  # heap h's size in slot HN0 + h (3 heaps)
GHEAD0 = 7  # ghost g: head, tail, count, limit in slots GHEAD0 + 4g .. + 3
RHEAD0 = 15  # queue q's ring: head, tail in slots RHEAD0 + 2q, + 1
SLOT = 19  # the policy's own slots start here
#: hook numbers (:mod:`prefixlab.policies._dispatch` runs them; MISS takes a key, EVICT
#: returns a victim, SPLIT takes the lower entry as its second operand; HIT_FREE is ACCESS
#: then PINNED on an evictable entry a hit pins, which a policy may do in one step)
INSERT, ACCESS, EVICTABLE, PINNED, REMOVE, MISS, EVICT, UPDATE, SPLIT, HIT_FREE = range(10)
#: set by the caller before each hook: the request index (I[SC, REQ]) and the time
#: (F[FS, NOW]: the engine's clock, or under replay the request's arrival time)
REQ = NOW = 63
#: I[SC, ABASE]: the request whose numbers are aux's column 0 (0 but in a streamed replay,
#: which hands a policy each chunk's columns): hooks read request r's at r - I[SC, ABASE]
ABASE = 61
#: I[SC, NEG_ROWS]: bit r set when int row r's unused columns hold -1 (a widened state's
#: new columns are filled so)
NEG_ROWS = 62


def new_state(
    num_entries: int, num_keys: int, ghost_limits: tuple[int, int], extra: tuple[int, int] = (0, 0)
) -> State:
    """Empty state for ``num_entries`` entries and keys below ``num_keys``; ``extra`` rows
    (int, float) after the shared ones are the policy's own (rows IROWS.., FROWS..)."""
    n = max(num_entries, 1)
    width = max(4 * n + 64, num_keys, 2 * max(ghost_limits) + 64, 64)
    ist = np.zeros((IROWS + extra[0], width), np.int64)
    ist[GSEQ0 : GSEQ0 + 2] = -1
    ist[SC, NEG_ROWS] = (1 << GSEQ0) | (1 << (GSEQ0 + 1))
    ist[SC, GHEAD0 + 3] = ghost_limits[0]
    ist[SC, GHEAD0 + 7] = ghost_limits[1]
    return ist, np.zeros((FROWS + extra[1], width), np.float64)


@jit()
def widen(ist: I64, fst: F64, width: int) -> tuple[I64, F64]:
    """The state copied into ``width`` columns (the same arrays when they are that wide):
    rows keep their content, new columns hold 0, or -1 in the rows of ``I[SC, NEG_ROWS]``."""
    old = ist.shape[1]
    if width <= old:
        return ist, fst
    i2 = np.zeros((ist.shape[0], width), np.int64)
    f2 = np.zeros((fst.shape[0], width), np.float64)
    mask = ist[SC, NEG_ROWS]
    for r in range(min(ist.shape[0], 63)):
        if (mask >> r) & 1:
            i2[r, old:] = -1
    i2[:, :old] = ist
    f2[:, :old] = fst
    return i2, f2


def grow_state(st: State, num_entries: int, num_keys: int) -> State:
    """The state with room for more entries (a radix tree grew) or keys (new key ids)."""
    ist, fst = st
    width = ist.shape[1]
    need = max(4 * num_entries + 64, num_keys)
    if need <= width:
        return st
    i2, f2 = widen(ist, fst, max(need, 2 * width))
    return i2, f2


# ----------------------------------------------------------------------------- lazy heaps
@jit(nrt=False)
def heap_push(ist: I64, h: int, a: int, b: int, e: int) -> None:
    """Push item (a, b, e) on lazy heap h (ordered by a, then b)."""
    ra, rb, re = HEAP0 + 3 * h, HEAP0 + 3 * h + 1, HEAP0 + 3 * h + 2
    i = ist[SC, HN0 + h]
    if i == ist.shape[1]:
        i = _heap_compact(ist, h)
    ist[SC, HN0 + h] = i + 1
    while i > 0:
        p = (i - 1) // 2
        pa, pb = ist[ra, p], ist[rb, p]
        if pa < a or (pa == a and pb <= b):
            break
        ist[ra, i], ist[rb, i], ist[re, i] = pa, pb, ist[re, p]
        i = p
    ist[ra, i], ist[rb, i], ist[re, i] = a, b, e


@jit(nrt=False)
def _sift_down(ist: I64, h: int, i: int, n: int) -> None:
    ra, rb, re = HEAP0 + 3 * h, HEAP0 + 3 * h + 1, HEAP0 + 3 * h + 2
    a, b, e = ist[ra, i], ist[rb, i], ist[re, i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        d = c + 1
        if d < n:
            da, ca = ist[ra, d], ist[ra, c]
            if da < ca or (da == ca and ist[rb, d] < ist[rb, c]):
                c = d
        if ist[ra, c] > a or (ist[ra, c] == a and ist[rb, c] >= b):
            break
        ist[ra, i], ist[rb, i], ist[re, i] = ist[ra, c], ist[rb, c], ist[re, c]
        i = c
    ist[ra, i], ist[rb, i], ist[re, i] = a, b, e


@jit(nrt=False)
def heap_drop_top(ist: I64, h: int) -> None:
    """Remove lazy heap h's top item."""
    n = ist[SC, HN0 + h] - 1
    ist[SC, HN0 + h] = n
    if n > 0:
        for r in range(3):
            ist[HEAP0 + 3 * h + r, 0] = ist[HEAP0 + 3 * h + r, n]
        _sift_down(ist, h, 0, n)


@jit(nrt=False)
def _heap_compact(ist: I64, h: int) -> int:
    """Keep only live items (an item is live while its entry's key fields still equal
    it: queue heaps check membership and position, LeCaR's LFU heap its stamp), then
    restore the heap in place; returns the new size."""
    ra, rb, re = HEAP0 + 3 * h, HEAP0 + 3 * h + 1, HEAP0 + 3 * h + 2
    w = 0
    for i in range(ist[SC, HN0 + h]):
        e = ist[re, i]
        if h < 2:
            live = ist[MEMBER, e] == h + 1 and ist[POSITION, e] == ist[ra, i]
        else:
            live = ist[P1, e] == ist[rb, i] and ist[P0, e] > 0
        if live and ist[FREE, e]:
            ist[ra, w], ist[rb, w], ist[re, w] = ist[ra, i], ist[rb, i], e
            w += 1
        elif live:  # pinned: freeing it pushes it back
            if h < 2:
                ist[MISSING, e] = 1
            else:
                ist[P2, e] = 1
    for i in range(w // 2 - 1, -1, -1):
        _sift_down(ist, h, i, w)
    ist[SC, HN0 + h] = w
    return w


# ----------------------------------------------------------------------------- indexed heaps
# An *indexed heap* (LPC's evictable blocks, UniCache's queues) holds entries by position:
# the entry in int row ``he``, its tie-break in int row ``he + 1``, its rank in float row
# ``kp`` (keys stored by position, so siblings share a cache line); the size in
# ``I[SC, sn]``; each entry's position in int row ``hpos`` (-1: not in it). The lowest
# (rank, tie) is on top.
@jit(nrt=False)
def iheap_sift_down(ist: I64, fst: F64, kp: int, he: int, hpos: int, sn: int, i: int) -> None:
    """Move position i's item down to its place (its subtrees are heaps)."""
    n = ist[SC, sn]
    ko = he + 1
    rank, tie, e = fst[kp, i], ist[ko, i], ist[he, i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        cp, co = fst[kp, c], ist[ko, c]
        if c + 1 < n:
            dp, do = fst[kp, c + 1], ist[ko, c + 1]
            if dp < cp or (dp == cp and do < co):
                c, cp, co = c + 1, dp, do
        if rank < cp or (rank == cp and tie < co):
            break
        fst[kp, i], ist[ko, i], ist[he, i] = cp, co, ist[he, c]
        ist[hpos, ist[he, i]] = i
        i = c
    fst[kp, i], ist[ko, i], ist[he, i] = rank, tie, e
    ist[hpos, e] = i


@jit(nrt=False)
def iheap_sift(ist: I64, fst: F64, kp: int, he: int, hpos: int, sn: int, i: int) -> None:
    """Restore heap order around position i (up, then down)."""
    ko = he + 1
    rank, tie, e = fst[kp, i], ist[ko, i], ist[he, i]
    start = i
    while i > 0:
        p = (i - 1) // 2
        pp, po = fst[kp, p], ist[ko, p]
        if pp < rank or (pp == rank and po < tie):
            break
        fst[kp, i], ist[ko, i], ist[he, i] = pp, po, ist[he, p]
        ist[hpos, ist[he, i]] = i
        i = p
    if i == start:
        iheap_sift_down(ist, fst, kp, he, hpos, sn, i)
    else:
        fst[kp, i], ist[ko, i], ist[he, i] = rank, tie, e
        ist[hpos, e] = i


@jit(nrt=False)
def iheap_set(
    ist: I64, fst: F64, kp: int, he: int, hpos: int, sn: int, e: int, rank: float, tie: int
) -> None:
    """Put e in the heap with key (rank, tie), or re-key it there."""
    i = ist[hpos, e]
    if i < 0:
        i = ist[SC, sn]
        ist[SC, sn] = i + 1
        ist[he, i] = e
    fst[kp, i], ist[he + 1, i] = rank, tie
    iheap_sift(ist, fst, kp, he, hpos, sn, i)


@jit(nrt=False)
def iheap_remove(ist: I64, fst: F64, kp: int, he: int, hpos: int, sn: int, e: int) -> None:
    """Take e out of the heap (no-op if it is not in it)."""
    i = ist[hpos, e]
    if i < 0:
        return
    last = ist[SC, sn] - 1
    ist[SC, sn] = last
    ist[hpos, e] = -1
    if i != last:
        ko = he + 1
        fst[kp, i], ist[ko, i], ist[he, i] = fst[kp, last], ist[ko, last], ist[he, last]
        iheap_sift(ist, fst, kp, he, hpos, sn, i)


# ----------------------------------------------------------------------------- sorted lists
# A *sorted list* (WA's categories, UniCache's session queues) gives the member with the
# lowest (rank in float row ``kr``, tie in int row ``kt``, both by entry; ties are unique)
# as list c's head ``I[hd, c]``, and takes members in and out anywhere. It is a pairing
# heap: int rows ``prv`` (parent, or left sibling), ``prv + 1`` (right sibling) and
# ``hd + 1`` (leftmost child) by entry. Insertion is O(1) and removal O(log n) amortised
# whatever the order ranks arrive in (under the engine a block's last access can be long
# before it becomes evictable; a list walked from its tail paid for every later one).
@jit(inline=True)
def _sl_less(ist: I64, fst: F64, kr: int, kt: int, a: int, b: int) -> bool:
    ra, rb = fst[kr, a], fst[kr, b]
    return bool(ra < rb or (ra == rb and ist[kt, a] < ist[kt, b]))


@jit(inline=True)
def _sl_link(ist: I64, fst: F64, kr: int, kt: int, prv: int, ch: int, a: int, b: int) -> int:
    """Meld two roots; returns the new root (the other becomes its leftmost child)."""
    if _sl_less(ist, fst, kr, kt, b, a):
        a, b = b, a
    c = ist[ch, a]
    ist[prv + 1, b] = c
    if c >= 0:
        ist[prv, c] = b
    ist[prv, b] = a
    ist[ch, a] = b
    return a


@jit(nrt=False)
def _sl_merge_pairs(ist: I64, fst: F64, kr: int, kt: int, prv: int, ch: int, x: int) -> int:
    """Meld the sibling chain from x into one root (two passes); -1 if x is -1."""
    if x < 0:
        return -1
    acc = -1  # pass 1: melded pairs, chained through the sibling row, last pair first
    while x >= 0:
        y = ist[prv + 1, x]
        if y < 0:
            ist[prv + 1, x] = acc
            acc = x
            break
        nxt = ist[prv + 1, y]
        ist[prv + 1, x] = -1
        ist[prv + 1, y] = -1
        m = _sl_link(ist, fst, kr, kt, prv, ch, x, y)
        ist[prv + 1, m] = acc
        acc = m
        x = nxt
    root = acc  # pass 2: fold them, last first
    rest = ist[prv + 1, root]
    ist[prv + 1, root] = -1
    while rest >= 0:
        nxt = ist[prv + 1, rest]
        ist[prv + 1, rest] = -1
        root = _sl_link(ist, fst, kr, kt, prv, ch, root, rest)
        rest = nxt
    ist[prv, root] = -1
    return int(root)


@jit(nrt=False)
def slist_insert(ist: I64, fst: F64, kr: int, kt: int, prv: int, hd: int, c: int, e: int) -> None:
    """Put e in list c (its rank and tie set)."""
    ch = hd + 1
    ist[prv, e] = -1
    ist[prv + 1, e] = -1
    ist[ch, e] = -1
    root = ist[hd, c]
    if root >= 0:
        e = _sl_link(ist, fst, kr, kt, prv, ch, root, e)
        ist[prv, e] = -1
    ist[hd, c] = e


@jit(nrt=False)
def slist_remove(ist: I64, fst: F64, kr: int, kt: int, prv: int, hd: int, c: int, e: int) -> None:
    """Take e (a member) out of list c."""
    ch = hd + 1
    sub = _sl_merge_pairs(ist, fst, kr, kt, prv, ch, ist[ch, e])
    ist[ch, e] = -1
    if ist[hd, c] == e:
        ist[hd, c] = sub
        return
    p, n = ist[prv, e], ist[prv + 1, e]  # cut e's subtree from its parent's children
    if ist[ch, p] == e:
        ist[ch, p] = n
    else:
        ist[prv + 1, p] = n
    if n >= 0:
        ist[prv, n] = p
    if sub >= 0:
        root = _sl_link(ist, fst, kr, kt, prv, ch, ist[hd, c], sub)
        ist[prv, root] = -1
        ist[hd, c] = root


# ----------------------------------------------------------------------------- queues
@jit(nrt=False)
def _ring_push(ist: I64, q: int, p: int, e: int) -> None:
    """Append item (p, e) to queue q's ring, compacting it to its live items when full."""
    rp, re, h = RING0 + 2 * q, RING0 + 2 * q + 1, RHEAD0 + 2 * q
    if ist[SC, h + 1] == ist.shape[1]:
        w = 0
        for i in range(ist[SC, h], ist[SC, h + 1]):
            x = ist[re, i]
            if ist[MEMBER, x] == q + 1 and ist[POSITION, x] == ist[rp, i]:
                ist[rp, w], ist[re, w] = ist[rp, i], x
                w += 1
        ist[SC, h], ist[SC, h + 1] = 0, w
    t = ist[SC, h + 1]
    ist[rp, t], ist[re, t] = p, e
    ist[SC, h + 1] = t + 1


@jit(nrt=False)
def fq_append(ist: I64, q: int, e: int) -> None:
    """Put e at the back of queue q (moving it there if it is a member)."""
    if ist[MEMBER, e] != q + 1:
        ist[MEMBER, e] = q + 1
        ist[SC, LEN0 + q] += 1
    p = ist[SC, NEXTPOS] + 1
    ist[SC, NEXTPOS] = p
    ist[POSITION, e] = p
    if ist[FREE, e]:
        ist[MISSING, e] = 0
        _ring_push(ist, q, p, e)
    else:
        ist[MISSING, e] = 1


@jit(nrt=False)
def fq_discard(ist: I64, q: int, e: int) -> None:
    """Take e out of queue q (no-op if it is not a member); its items go stale."""
    if ist[MEMBER, e] == q + 1:
        ist[MEMBER, e] = 0
        ist[MISSING, e] = 0
        ist[SC, LEN0 + q] -= 1


@jit(nrt=False)
def fq_oldest_free(ist: I64, q: int) -> int:
    """Queue q's oldest evictable member, or -1 (drops stale and pinned items in front)."""
    rp, re, h = RING0 + 2 * q, RING0 + 2 * q + 1, RHEAD0 + 2 * q
    ring = -1
    while ist[SC, h] < ist[SC, h + 1]:
        i = ist[SC, h]
        e = ist[re, i]
        if ist[MEMBER, e] == q + 1 and ist[POSITION, e] == ist[rp, i]:
            if ist[FREE, e]:
                ring = e
                break
            ist[MISSING, e] = 1  # pinned: freeing it pushes it back (on the heap)
        ist[SC, h] = i + 1
    ha, he = HEAP0 + 3 * q, HEAP0 + 3 * q + 2
    heap = -1
    while ist[SC, HN0 + q] > 0:
        e = ist[he, 0]
        if ist[MEMBER, e] == q + 1 and ist[POSITION, e] == ist[ha, 0]:
            if ist[FREE, e]:
                heap = e
                break
            ist[MISSING, e] = 1
        heap_drop_top(ist, q)
    if ring < 0:
        return int(heap)
    if heap < 0 or ist[POSITION, ring] < ist[POSITION, heap]:
        return int(ring)
    return int(heap)


@jit(nrt=False)
def set_free(ist: I64, e: int, free: bool) -> None:
    """e became evictable (True) or pinned (False)."""
    if free == (ist[FREE, e] != 0):
        return
    ist[FREE, e] = 1 if free else 0
    ist[SC, NFREE] += 1 if free else -1
    q = ist[MEMBER, e] - 1
    if free and q >= 0 and ist[MISSING, e]:
        ist[MISSING, e] = 0
        heap_push(ist, q, ist[POSITION, e], 0, e)


# ----------------------------------------------------------------------------- ghosts
@jit(nrt=False)
def ghost_contains(ist: I64, g: int, key: int) -> bool:
    return bool(ist[GSEQ0 + g, key] >= 0)


@jit(nrt=False)
def ghost_len(ist: I64, g: int) -> int:
    return int(ist[SC, GHEAD0 + 4 * g + 2])


@jit()
def ghost_pop(ist: I64, fst: F64, g: int, key: int) -> float:
    """Forget key; returns the time it was added, or -1.0 if it was not there."""
    if ist[GSEQ0 + g, key] < 0:
        return -1.0
    ist[GSEQ0 + g, key] = -1
    ist[SC, GHEAD0 + 4 * g + 2] -= 1
    return float(fst[GWHEN0 + g, key])


@jit(nrt=False)
def ghost_trim(ist: I64, g: int, limit: int) -> None:
    """Drop the oldest keys until at most ``limit`` remain."""
    s, rk, rs = GHEAD0 + 4 * g, GRING0 + 2 * g, GRING0 + 2 * g + 1
    lim = max(limit, 0)
    while ist[SC, s + 2] > lim:
        i = ist[SC, s]
        ist[SC, s] = i + 1
        key = ist[rk, i]
        if ist[GSEQ0 + g, key] == ist[rs, i]:
            ist[GSEQ0 + g, key] = -1
            ist[SC, s + 2] -= 1


@jit(nrt=False)
def ghost_add(ist: I64, fst: F64, g: int, key: int, when: float) -> None:
    """Add key at the back (moving it there if present), then trim to the list's limit."""
    s, rk, rs = GHEAD0 + 4 * g, GRING0 + 2 * g, GRING0 + 2 * g + 1
    if ist[GSEQ0 + g, key] >= 0:
        ist[GSEQ0 + g, key] = -1
        ist[SC, s + 2] -= 1
    if ist[SC, s + 1] == ist.shape[1]:  # compact: keep only live copies, in order
        w = 0
        for i in range(ist[SC, s], ist[SC, s + 1]):
            if ist[GSEQ0 + g, ist[rk, i]] == ist[rs, i]:
                ist[rk, w], ist[rs, w] = ist[rk, i], ist[rs, i]
                w += 1
        ist[SC, s], ist[SC, s + 1] = 0, w
    t = ist[SC, s + 1]
    stamp = ist[rs, t - 1] + 1 if t > 0 else 0
    ist[rk, t], ist[rs, t] = key, stamp
    ist[SC, s + 1] = t + 1
    ist[GSEQ0 + g, key] = stamp
    fst[GWHEN0 + g, key] = when
    ist[SC, s + 2] += 1
    ghost_trim(ist, g, ist[SC, s + 3])
