"""Compiled sequential replay of the radix cache (SGLang semantics), for the built-in policies,
and the tree's operations the compiled engine runs (``rx_*``).

The same tree, events and clock as :class:`prefixlab.cache.radix.RadixCache` (its docstring
has the rules), in arrays, for the whole trace in one call (the replay) or one operation
per call (``rx_walk``, ``rx_room``, ``rx_acquire``, ``rx_grow_room``, ``rx_reserve``,
``rx_keep_free``, ``rx_commit``, ``rx_release``: the cache's verbs, which the replay kernel
calls in sequence per request and :mod:`prefixlab.runner.engine._kernel` interleaves):

* an edge is a range of the tree's own key pool (``estart``, ``elen``): a new leaf copies
  its request's keys there, a split cuts the range in two; the pool has two halves, and
  when the current one is full the live ranges are copied to the start of the other
  (:func:`_pool_put`), so it holds about twice the capacity whatever the trace's length,
  and a streamed replay (:mod:`prefixlab.runner.stream`) can hand each chunk's keys and
  drop them;
* children are found through one open-addressing table keyed by (parent, first key)
  (``runner/_pairs.py``);
* node ids come from the same stack of free ids, so every node gets the id it gets there.

The policies' hooks are the functions their classes call (``policies._segments`` for lru
and fifo, ``policies._keyed``, ``policies.sieve``, ``policies._dispatch`` for ARC, S3-FIFO
and LeCaR), driven in the order the cache drives the classes. ``tests/test_fast.py``
checks per-request hits and evictions against the generic path for every policy.
"""

from __future__ import annotations

import numpy as np

from prefixlab._jit import jit
from prefixlab._keytable import kcell, kslot, more_slots, sweep_slots
from prefixlab.cache.view import EntryView
from prefixlab.policies._arrays import (
    ABASE,
    ACCESS,
    EVICT,
    EVICTABLE,
    FS,
    INSERT,
    MISS,
    NOW,
    PINNED,
    REQ,
    SC,
    SPLIT,
    UPDATE,
    grow_state,
    new_state,
)
from prefixlab.policies._dispatch import hook, miss_begin, reserve
from prefixlab.policies._keyed import (
    KeyedPolicy,
    entry_key,
    heap_pop,
    heap_remove,
    heap_set,
    key_columns,
)
from prefixlab.policies._segments import (
    sq_compact,
    sq_insert_after,
    sq_pop,
    sq_push,
    sq_renumber,
)
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import EvictionPolicy
from prefixlab.policies.sieve import (
    sieve_access,
    sieve_evictable,
    sieve_insert,
    sieve_pinned,
    sieve_pop,
    sieve_state,
)
from prefixlab.runner._fast import policy_family
from prefixlab.runner._pairs import pair_find, pair_unmap
from prefixlab.types import B1, F64, I64

#: the tree, what :func:`new_tree` makes: parent, estart, elen, ref, nchild, evictable, the
#: children table (tp, tk, tv), free ids, path, lowers, uppers, st, the key pool, ktab,
#: skey, sfree, note, nup
Tree = tuple[
    I64, I64, I64, I64, I64, B1, I64, I64, I64, I64,
    I64, I64, I64, I64, I64, I64, I64, I64, F64, F64,
]  # fmt: skip
#: the policy's state and arguments as the tree's hooks read them (P, what
#: :func:`radix_policy_args` makes; :func:`_pol` unpacks and names them)
RadixArgs = tuple[
    I64, I64, I64, I64, I64, F64, I64, I64, I64, I64,  # qb .. cols
    F64, F64, I64, I64, F64, B1, I64, I64, I64, I64,  # signs .. after
    I64, I64, I64, I64, I64, F64, int, np.random.Generator, F64, F64, F64,  # order .. nnu
]  # fmt: skip
LRU, FIFO, KEYED, SIEVE, ARRAY = 1, 2, 3, 4, 5
ROOT = 0
# policy hooks the tree drives (besides the _dispatch numbers for ARRAY)
H_INSERT, H_ACCESS, H_EVICTABLE, H_PINNED, H_UPDATE, H_SPLIT = range(6)
_ARRAY_HOOKS = (INSERT, ACCESS, EVICTABLE, PINNED, UPDATE, SPLIT)  # the same, for _dispatch


def radix_code(pol: EvictionPolicy, engine: bool = False) -> int:
    """The kernel's code for a policy on the radix structure, or -1 (generic path);
    ``engine``: under the compiled engine, which feeds the waiting queue to the policies
    that read it (opt-online)."""
    if pol.uses_lookahead and not engine:
        return -1  # the replay has no waiting queue
    codes = {"keyed": KEYED, "sieve": SIEVE, "array": ARRAY, "lru": LRU, "fifo": FIFO}
    return codes.get(policy_family(pol) or "", -1)


# ----------------------------------------------------------------------------- policies
@jit(nrt=False)
def _pol(code: int, h: int, e: int, x: int, P: RadixArgs, ist: I64, fst: F64) -> int:
    """Hook h of the policy for entry e (x: the lower part of a split)."""
    (
        qb,
        qs,
        stamp,
        qstate,
        qfree,
        hk,
        he,
        hpos,
        hn,
        cols,
        signs,
        la,
        nhits,
        depth,
        created,
        primary,
        nkey,
        occ_start,
        occ_req,
        after,
        order,
        link,
        flag,
        sst,
        _ist,
        _fst,
        acode,
        rng,
        aux,
        k,
        nnu,
    ) = P
    if code in (LRU, FIFO):
        if h == H_INSERT or (h == H_ACCESS and code == LRU):
            if qstate[1] == qb.shape[0]:
                sq_compact(qb, qs, stamp, qstate)
            sq_push(qb, qs, stamp, qstate, e)
        elif h == H_SPLIT:
            if qstate[1] == qb.shape[0]:
                sq_compact(qb, qs, stamp, qstate)
            if not sq_insert_after(qb, qs, stamp, qstate, x, e):
                sq_renumber(qb, qs, stamp, qstate)
                sq_insert_after(qb, qs, stamp, qstate, x, e)
        elif h == H_EVICTABLE:
            qfree[e] = 1
        elif h == H_PINNED:
            qfree[e] = 0
    elif code == KEYED:
        if h == H_EVICTABLE or (h in (H_ACCESS, H_UPDATE) and hpos[e] >= 0):
            nu = nnu[nkey[e]] if nnu.shape[0] else np.nan  # a stream's note (see new_tree)
            entry_key(
                cols,
                signs,
                e,
                la,
                nhits,
                depth,
                created,
                primary,
                nkey,
                occ_start,
                occ_req,
                after[0],
                k,
                nu,
            )
            if h == H_EVICTABLE:
                heap_set(hk, he, hpos, hn, e, k[0], k[1], k[2], float(order[0]))
                order[0] += 1
            else:
                heap_set(hk, he, hpos, hn, e, k[0], k[1], k[2], hk[hpos[e], 3])
        elif h == H_PINNED:
            heap_remove(hk, he, hpos, hn, e)
    elif code == SIEVE:
        if h in (H_INSERT, H_SPLIT):
            sieve_insert(link, flag, sst, e)
        elif h == H_ACCESS:
            sieve_access(flag, e)
        elif h == H_EVICTABLE:
            sieve_evictable(flag, sst, e)
        elif h == H_PINNED:
            sieve_pinned(flag, sst, e)
    else:
        hook(acode, ist, fst, _ARRAY_HOOKS[h], e, x, nkey, depth, rng, aux)
    return 0


@jit(nrt=False)
def _pol_evict(code: int, P: RadixArgs, ist: I64, fst: F64) -> int:
    """The policy's next victim (forgotten by the policy), or -1."""
    if code in (LRU, FIFO):
        qfree = P[4]
        e = sq_pop(P[0], P[1], P[2], qfree, False, P[3])
        if e >= 0:
            qfree[e] = 0
        return e
    if code == KEYED:
        return heap_pop(P[5], P[6], P[7], P[8])
    if code == SIEVE:
        return sieve_pop(P[21], P[22], P[23])
    return int(hook(P[26], ist, fst, EVICT, 0, -1, P[16], P[13], P[27], P[28]))


@jit(nrt=False)
def _pol_miss(
    code: int, P: RadixArgs, ist: I64, fst: F64, keys: I64, a: int, b: int, T: Tree
) -> None:
    """on_miss(keys[a:b]): ghost-driven policies adapt before any eviction."""
    if code == ARRAY and b > a:
        acode, nkey, rng = P[26], P[16], P[27]
        miss_begin(acode, ist)
        for j in range(a, b):
            hook(acode, ist, fst, MISS, _slot(keys[j], T), -1, nkey, P[13], rng, P[28])


# ----------------------------------------------------------------------------- the tree
#: the tree's counters, st = T[13]: tree pages, reserved pages, protected (locked) pages,
#: the clock, evicted pages, free ids left, the capacity in pages, the key pool's next
#: free position and the end of its current half, free key slots (a raw-key tree's)
TREE, RESERVED, PROTECTED, CLOCK, EVICTED, NFREE, CAP, PTOP, PEND, NSLOTS = range(10)


def new_tree(capacity: int, slots: int = 0, next_uses: bool = False) -> Tree:
    """An empty tree of ``capacity`` pages: T = (parent, estart, elen, ref, nchild,
    evictable, the (parent, first key) -> child table tp, tk, tv, free ids, path, lowers,
    uppers (a walk's scratch), st (the counters above), the key pool (two halves of
    2 * capacity + 2 keys: the tree holds at most the capacity, so after a copy to the
    other half at least the capacity is free), then what a streamed replay adds:

    * ``slots`` > 0 (raw 64-bit keys, for a policy that keeps state by key: ARC, S3-FIFO,
      LeCaR, OPT): a table of the keys in use -> their slot, the number the policy is
      given for a key (the node's ``key``, a missed key); ``skey`` (slot -> key),
      ``sfree`` (a stack of st[NSLOTS] free slots). A key takes a slot when it misses, a
      node starts with it or (``next_uses``) a request holds it, and gives it back
      (:func:`sweep`, between chunks) once nothing uses it;
    * ``next_uses`` (a keyed policy ranking by next use, OPT): each slot's note (``note``,
      also P's ``nnu``): the next use of its key after the last request that held it, from
      the chunk's next use of every key position (``nup``, which :class:`RadixPrepared`
      hands in; every request notes all its keys before its walk). That is the key's
      first lookup after the current request whenever the policy ranks a node starting
      with it: a request that looks the key up in between would have noted it. A key in
      the tree keeps its slot (its note) wherever it lies in an edge, since a split can
      make it a node's first; the whole replay searches the trace's occurrence lists.

    Otherwise those are one-cell placeholders (so every tree has the same types)."""
    size = capacity + 2  # every node holds >= 1 page, plus the root
    tsize = 1
    while tsize < 2 * size:
        tsize *= 2
    st = np.zeros(10, np.int64)
    st[NFREE], st[CAP] = size - 1, capacity
    half = 2 * capacity + 2
    st[PTOP], st[PEND] = 0, half
    st[NSLOTS] = slots
    return (
        np.full(size, -1, np.int64),
        np.zeros(size, np.int64),
        np.zeros(size, np.int64),
        np.zeros(size, np.int64),
        np.zeros(size, np.int64),
        np.zeros(size, np.bool_),
        np.zeros(tsize, np.int64),
        np.zeros(tsize, np.int64),
        np.full(tsize, -1, np.int64),
        np.arange(size - 1, 0, -1).astype(np.int64),  # pop from the end: 1, 2, ...
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        np.empty(size, np.int64),
        st,
        np.empty(2 * half, np.int64),
        *_key_arrays(slots, next_uses),
    )


def _key_arrays(slots: int, next_uses: bool) -> tuple[I64, I64, I64, F64, F64]:
    """The last arrays of :func:`new_tree`: ktab, skey, sfree (one-cell placeholders
    unless ``slots`` > 0), note (empty unless ``next_uses``) and nup (handed in later)."""
    cells = 1 << int(2 * slots - 1).bit_length() if slots else 1
    return (
        np.full((cells, 2), -1, np.int64),
        np.zeros(max(slots, 1), np.int64),
        np.arange(slots - 1, -1, -1).astype(np.int64),
        np.zeros(max(slots, 1) if next_uses else 0, np.float64),
        np.zeros(0, np.float64),
    )


@jit(inline=True)
def _slot(key: int, T: Tree) -> int:
    """The number the policy knows ``key`` by: its slot in a raw-key tree, else itself."""
    if T[15].shape[0] > 1:
        return kslot(T[15], T[16], T[17], T[13], NSLOTS, key)
    return key


def sweep(
    T: Tree,
    P: RadixArgs,
    ist: I64,
    ghost_rows: I64,
    clear_rows: I64,
    keep_rows: I64,
) -> int:
    """Free the slots of a raw-key tree's keys that no node starts with, no ghost list
    (rows ``ghost_rows`` of the array policy's ``ist``, -1 when absent) names and whose
    rows ``keep_rows`` hold 0; their rows ``clear_rows`` are zeroed for the next key.
    Returns how many slots are free."""
    parent, nkey = T[0], P[16]
    held = np.zeros(T[16].shape[0], np.bool_)
    held[nkey[parent >= 0]] = True  # the live nodes' (the root has no parent)
    if T[18].shape[0]:  # every key in the tree keeps its note
        _hold_tree_keys(T, held)
    return int(
        sweep_slots(T[15], T[17], T[13], NSLOTS, held, ist, ghost_rows, clear_rows, keep_rows)
    )


@jit(nrt=False)
def _hold_tree_keys(T: Tree, held: B1) -> None:
    """Mark the slot of every key the tree holds."""
    parent, estart, elen, pool, ktab = T[0], T[1], T[2], T[14], T[15]
    for node in range(1, parent.shape[0]):
        if parent[node] >= 0:
            for p in range(estart[node], estart[node] + elen[node]):
                slot = ktab[kcell(ktab, pool[p]), 1]
                if slot >= 0:  # (each has one: its request noted it)
                    held[slot] = True


def add_slots(T: Tree, num_slots: int) -> Tree:
    """A raw-key tree with ``num_slots`` key slots (the new ones free)."""
    if num_slots <= T[16].shape[0]:
        return T
    ktab, skey, sfree = more_slots(T[15], T[16], T[17], T[13], NSLOTS, num_slots)
    note = T[18]
    if note.shape[0]:
        note = np.concatenate((note, np.zeros(num_slots - note.shape[0], np.float64)))
    return (*T[:15], ktab, skey, sfree, note, *T[19:])


@jit(nrt=False)
def _pool_put(keys: I64, a: int, n: int, T: Tree) -> int:
    """Copy keys[a:a + n] into the key pool; returns where they start. When the current
    half has no room, every live edge is first copied to the start of the other half (a
    node is live while it has a parent; the root holds no keys)."""
    parent, estart, elen, st, pool = T[0], T[1], T[2], T[13], T[14]
    if st[PTOP] + n > st[PEND]:
        half = pool.shape[0] // 2
        first = st[PEND] > half  # the copies go to the first half
        top = 0 if first else half
        for node in range(1, parent.shape[0]):
            if parent[node] >= 0:
                es, el = estart[node], elen[node]
                for j in range(el):
                    pool[top + j] = pool[es + j]
                estart[node] = top
                top += el
        st[PTOP], st[PEND] = top, (half if first else 2 * half)
    at = st[PTOP]
    for j in range(n):
        pool[at + j] = keys[a + j]
    st[PTOP] = at + n
    return int(at)


@jit()
def _kernel(
    keys: I64,
    key_offsets: I64,
    num_lookup: I64,
    lookup_end: I64,
    held: I64,
    r0: int,
    T: Tree,
    block_tokens: int,
    code: int,
    P: RadixArgs,
    hit_tokens: I64,
    hit_blocks: I64,
    out: I64,
) -> tuple[I64, F64]:
    """Replay requests r0, r0 + 1, ... (the rows of ``key_offsets``) on the tree T.
    out[0] = evicted pages so far, out[1] = the request that could not fit (or -1); returns
    the array policy's state (P[24], P[25] at the start; a policy that allocates may widen
    it).

    The hooks take that state as arguments of their own (ist, fst), not inside P: P is
    never reassigned, so the compiled loops carry no copy of the 30-item tuple (each copy
    an atomic reference count update per array)."""
    after, acode, aux = P[19], P[26], P[28]
    ist, fst = P[24], P[25]
    st, note, nup = T[13], T[18], T[19]
    out[1] = -1
    for i_r in range(key_offsets.shape[0] - 1):
        r = r0 + i_r
        after[0] = r
        k0 = key_offsets[i_r]
        nk = key_offsets[i_r + 1] - k0
        nl = num_lookup[i_r]
        if note.shape[0]:  # a stream's next uses (see new_tree)
            for j in range(nk):
                note[_slot(keys[k0 + j], T)] = nup[k0 + j]
        if code == ARRAY:  # the request and its time (the arrival), room for allocations
            ist, fst = reserve(acode, ist, fst, 2 * nk + 2)
            ist[SC, REQ] = r
            if aux.shape[1] > r - ist[SC, ABASE]:
                fst[FS, NOW] = aux[0, r - ist[SC, ABASE]]
        # ---- match (stamping, splitting), then acquire: lock the path, reserve the rest
        i, npath = rx_walk(keys, k0, nl, T, code, P, ist, fst, 0, 0)
        hit_blocks[i_r] = i
        hit_tokens[i_r] = lookup_end[i_r] if i == nl else i * block_tokens
        need = held[i_r] - i
        if need > rx_room(T, npath):
            out[0] = st[EVICTED]
            out[1] = r
            return ist, fst
        last = rx_acquire(keys, k0, i, nk, npath, need, 0, T, code, P, ist, fst)
        if last < 0:  # the policy found no victim although pages were evictable
            out[0] = st[EVICTED]
            out[1] = -2 - r
            return ist, fst
        # ---- commit every keyed page, resuming the match's walk, then release
        last, reserved = rx_commit(keys, k0, nk, last, need, T, code, P, ist, fst, i, npath)
        rx_release(last, reserved, T, code, P, ist, fst)
    out[0] = st[EVICTED]
    return ist, fst


@jit(nrt=False)
def rx_room(T: Tree, npath: int) -> int:
    """Pages a request can have once it locks the matched path[:npath]: free pages plus
    unlocked tree pages, but not the path's (RadixCache.acquire's test)."""
    elen, ref, path, st = T[2], T[3], T[10], T[13]
    newly = 0
    for j in range(npath):
        if ref[path[j]] == 0:
            newly += elen[path[j]]
    return int(st[CAP] - st[TREE] - st[RESERVED] + st[TREE] - st[PROTECTED] - newly)


@jit(nrt=False)
def rx_grow_room(T: Tree) -> int:
    """Pages a running request can grow by (RadixCache.grow's test)."""
    st = T[13]
    return int(st[CAP] - st[RESERVED] - st[PROTECTED])


@jit(nrt=False, standalone=True)
def rx_acquire(
    keys: I64,
    k0: int,
    h: int,
    nk: int,
    npath: int,
    need: int,
    spare: int,
    T: Tree,
    code: int,
    P: RadixArgs,
    ist: I64,
    fst: F64,
) -> int:
    """RadixCache.acquire after :func:`rx_room` said the request fits: access and lock the
    matched path[:npath] (h pages), announce the misses keys[k0 + h:k0 + nk], reserve
    ``need`` pages. Returns the locked path's end, or -1 if the policy found no victim."""
    nhits, path = P[12], T[10]
    for j in range(npath):
        _pol(code, H_ACCESS, path[j], 0, P, ist, fst)
        nhits[path[j]] += 1
    last = path[npath - 1] if npath else ROOT
    _lock(last, T, code, P, ist, fst)
    _pol_miss(code, P, ist, fst, keys, k0 + h, k0 + nk, T)
    if not rx_reserve(need, spare, T, code, P, ist, fst):
        return -1
    return int(last)


@jit(nrt=False, standalone=True)
def rx_reserve(need: int, spare: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64) -> bool:
    """Evict leaves until ``need`` pages are free and reserve them, then keep ``spare``
    more free (RadixCache._reserve); False if the policy found no victim."""
    st = T[13]
    while st[CAP] - st[TREE] - st[RESERVED] < need:
        v = _pol_evict(code, P, ist, fst)
        if v < 0:
            return False
        _remove_leaf(v, T, code, P, ist, fst)
    st[RESERVED] += need
    if spare:
        rx_keep_free(spare, T, code, P, ist, fst)
    return True


@jit(nrt=False, standalone=True)
def rx_keep_free(num: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64) -> None:
    """Evict unlocked leaves until ``num`` pages are free or none is left
    (RadixCache.keep_free)."""
    st = T[13]
    while st[CAP] - st[TREE] - st[RESERVED] < num and st[TREE] > st[PROTECTED]:
        v = _pol_evict(code, P, ist, fst)
        if v < 0:
            break
        _remove_leaf(v, T, code, P, ist, fst)


@jit(nrt=False, standalone=True)
def rx_commit(
    keys: I64,
    k0: int,
    n: int,
    last: int,
    reserved: int,
    T: Tree,
    code: int,
    P: RadixArgs,
    ist: I64,
    fst: F64,
    i: int,
    npath: int,
) -> tuple[int, int]:
    """RadixCache.commit of keys[k0:k0 + n] for a request holding the path to ``last`` and
    ``reserved`` pages: walk (stamping) from ``path[:npath]``, which matched the first i
    pages (0, 0: from the root), access the path, add the rest as a leaf (as many pages as
    are reserved), move the lock to the new end. Returns (last, reserved).

    The replay resumes its match's walk so: the matched path is locked, so between the
    two nothing on it changed, and a walk from the root would pass it again without a
    split and end where the match did (a node boundary, the match having split there)."""
    parent, path, st = T[0], T[10], T[13]
    i, npath = rx_walk(keys, k0, n, T, code, P, ist, fst, i, npath)
    node = path[npath - 1] if npath else ROOT
    for j in range(npath):
        _pol(code, H_ACCESS, path[j], 0, P, ist, fst)
    if i < n:
        grow = min(n - i, reserved)
        if grow > 0:
            node = _new_node(node, _pool_put(keys, k0 + i, grow, T), grow, T, P)
            st[TREE] += grow
            _refresh(parent[node], T, code, P, ist, fst)
            _pol(code, H_INSERT, node, 0, P, ist, fst)
            _refresh(node, T, code, P, ist, fst)
            reserved -= grow
            st[RESERVED] -= grow
    if node != last:
        _lock(node, T, code, P, ist, fst)
        _unlock(last, T, code, P, ist, fst)
        last = node
    return int(last), int(reserved)


@jit(nrt=False, standalone=True)
def rx_release(
    last: int, reserved: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64
) -> None:
    """Free a request's unused reserved pages and unlock its path (RadixCache.release)."""
    T[13][RESERVED] -= reserved
    _unlock(last, T, code, P, ist, fst)


@jit(nrt=False)
def _refresh(node: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64) -> None:
    """Tell the policy when a node starts or stops being an unlocked leaf."""
    ref, nchild, evictable = T[3], T[4], T[5]
    if node == ROOT:
        return
    now = ref[node] == 0 and nchild[node] == 0
    if now != evictable[node]:
        evictable[node] = now
        _pol(code, H_EVICTABLE if now else H_PINNED, node, 0, P, ist, fst)


@jit(nrt=False)
def _lock(node: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64) -> None:
    parent, elen, ref, st = T[0], T[2], T[3], T[13]
    while node != ROOT:
        if ref[node] == 0:
            st[PROTECTED] += elen[node]
        ref[node] += 1
        _refresh(node, T, code, P, ist, fst)
        node = parent[node]


@jit(nrt=False)
def _unlock(node: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64) -> None:
    parent, elen, ref, st = T[0], T[2], T[3], T[13]
    while node != ROOT:
        ref[node] -= 1
        if ref[node] == 0:
            st[PROTECTED] -= elen[node]
        _refresh(node, T, code, P, ist, fst)
        node = parent[node]


@jit(nrt=False)
def _new_node(par: int, es: int, el: int, T: Tree, P: RadixArgs) -> int:
    """A node for the pool's keys [es, es + el) under ``par``, mapped by its first key
    (replacing the node it splits from, if any), created and accessed now."""
    parent, estart, elen, ref, nchild = T[0], T[1], T[2], T[3], T[4]
    tp, tk, tv, free_ids, st = T[6], T[7], T[8], T[9], T[13]
    la, nhits, depth, created, nkey = P[11], P[12], P[13], P[14], P[16]
    st[NFREE] -= 1
    node = free_ids[st[NFREE]]
    estart[node] = es
    elen[node] = el
    nchild[node] = 0
    parent[node] = par
    first = T[14][es]
    nkey[node] = _slot(first, T)
    depth[node] = depth[par] + el if par != ROOT else el
    st[CLOCK] += 1
    created[node] = st[CLOCK]
    la[node] = st[CLOCK]
    nhits[node] = 0
    ref[node] = 0
    s = pair_find(tp, tk, tv, par, first)
    if tv[s] < 0:
        nchild[par] += 1
    tp[s], tk[s], tv[s] = par, first, node
    return int(node)


@jit(nrt=False, standalone=True)
def rx_walk(
    keys: I64,
    k0: int,
    n: int,
    T: Tree,
    code: int,
    P: RadixArgs,
    ist: I64,
    fst: F64,
    i: int,
    npath: int,
) -> tuple[int, int]:
    """Longest matched prefix of keys[k0:k0 + n] (pages) and its node path (in T's path),
    splitting the edge where the match ends inside it; stamps as RadixCache._walk does.
    The walk starts after ``path[:npath]``, which matched the first i pages (0, 0: from
    the root; see :func:`rx_commit`)."""
    parent, estart, elen, ref, nchild = T[0], T[1], T[2], T[3], T[4]
    tp, tk, tv, path, lowers, uppers, st = T[6], T[7], T[8], T[10], T[11], T[12], T[13]
    pool = T[14]
    la, nhits, created, nkey = P[11], P[12], P[14], P[16]
    node = path[npath - 1] if npath else ROOT
    nsplit = 0
    while i < n:
        s = pair_find(tp, tk, tv, node, keys[k0 + i])
        child = tv[s]
        if child < 0:
            break
        es, el = estart[child], elen[child]
        span = min(el, n - i)
        m = 1
        while m < span and pool[es + m] == keys[k0 + i + m]:
            m += 1
        if m < el:  # split child after m pages: a new upper node takes the first m
            lower = child
            child = _new_node(parent[lower], es, m, T, P)
            ref[child] = ref[lower]
            la[child] = la[lower]
            created[child] = created[lower]
            nhits[child] = nhits[lower]
            estart[lower] = es + m
            elen[lower] = el - m
            nkey[lower] = _slot(pool[es + m], T)
            parent[lower] = child
            s = pair_find(tp, tk, tv, child, pool[es + m])
            tp[s], tk[s], tv[s] = child, pool[es + m], lower
            nchild[child] += 1
            _pol(code, H_SPLIT, child, lower, P, ist, fst)
            _pol(code, H_UPDATE, lower, 0, P, ist, fst)
            lowers[nsplit] = lower
            uppers[nsplit] = child
            nsplit += 1
        path[npath] = child
        npath += 1
        node, i = child, i + m
    st[CLOCK] += 1
    t = st[CLOCK]
    for j in range(npath):
        la[path[j]] = t
    for j in range(nsplit):
        la[lowers[j]] = t
    if nsplit:
        st[CLOCK] += 1
        for j in range(nsplit):
            la[uppers[j]] = st[CLOCK]
            created[uppers[j]] = st[CLOCK]
        for j in range(nsplit):  # their recency changed without an access: re-rank them
            _pol(code, H_UPDATE, lowers[j], 0, P, ist, fst)
    return i, npath


@jit(nrt=False)
def _remove_leaf(leaf: int, T: Tree, code: int, P: RadixArgs, ist: I64, fst: F64) -> None:
    """Evict an unlocked leaf: unmap it, free its id and pages, refresh its parent."""
    parent, estart, elen, nchild, evictable = T[0], T[1], T[2], T[4], T[5]
    tp, tk, tv, free_ids, st = T[6], T[7], T[8], T[9], T[13]
    nkey = P[16]
    par = parent[leaf]
    pair_unmap(tp, tk, tv, par, T[14][estart[leaf]])  # its first key
    nchild[par] -= 1
    st[TREE] -= elen[leaf]
    st[EVICTED] += elen[leaf]
    evictable[leaf] = False
    nkey[leaf] = -1
    parent[leaf] = -1
    free_ids[st[NFREE]] = leaf
    st[NFREE] += 1
    _refresh(par, T, code, P, ist, fst)


def radix_policy_args(
    policy: EvictionPolicy, capacity: int, num_keys: int, next_uses: bool = False
) -> RadixArgs:
    """The policy's state and arguments as the tree's hooks read them (P), for a fresh
    policy (a keyed policy with ``needs_future`` already prepared, or ``next_uses``: it
    ranks nodes by the next uses a streamed tree notes, see :func:`new_tree`), which it
    binds to a view of the tree's size, as the radix cache binds it."""
    code = radix_code(policy, engine=True)
    size = capacity + 2
    view = EntryView(size)
    policy.bind(view)
    queue = _queue_arrays(size, code == KEYED)
    cols, signs = np.full(3, -1, np.int64), np.ones(3, np.float64)
    occ_start, occ_req = np.zeros(1, np.int64), np.zeros(0, np.int64)
    if isinstance(policy, KeyedPolicy):
        cols, signs = key_columns(policy.sort_key)
        if not next_uses:
            occ_start, occ_req = policy.occ_start, policy.occ_req
    link, flag, sst = sieve_state(size if code == SIEVE else 1)
    acode, st, rng = -1, new_state(1, 1, (1, 1)), np.random.default_rng(0)
    aux = np.zeros((1, 0))
    if isinstance(policy, ArrayPolicy) and code == ARRAY:
        st = grow_state(policy.state, size, max(num_keys, 1))
        acode, rng, aux = policy.code, policy.rng, policy.aux
    return (
        *queue,
        cols,
        signs,
        view.last_access,
        view.hits,
        view.depth,
        view.created,
        view.is_primary,
        view.key,
        occ_start,
        occ_req,
        np.zeros(1, np.int64),
        np.zeros(1, np.int64),
        link,
        flag,
        sst,
        st[0],
        st[1],
        acode,
        rng,
        aux,
        np.empty(3, np.float64),
        np.zeros(0, np.float64),  # nnu: a streamed tree's notes (RadixPrepared binds them)
    )


def _queue_arrays(size: int, keyed: bool) -> tuple[I64, I64, I64, I64, I64, F64, I64, I64, I64]:
    """The first arrays of :func:`radix_policy_args`: the queue's (qb, qs, stamp, qstate,
    qfree) and the keyed heap's (hk, he, hpos, hn; ``keyed``: a row per node, else one)."""
    keyed_n = size if keyed else 1
    return (
        np.empty(4 * size + 64, np.int64),
        np.empty(4 * size + 64, np.int64),
        np.full(size, -1, np.int64),
        np.zeros(3, np.int64),
        np.zeros(size, np.int64),
        np.zeros((keyed_n, 4), np.float64),
        np.zeros(keyed_n, np.int64),
        np.full(size, -1, np.int64),
        np.zeros(1, np.int64),
    )


class RadixPrepared:
    """A policy's replay on the compiled tree, resumable: each :meth:`run` replays the
    next requests from the tree and policy state the previous one left (a streamed replay
    hands it a chunk at a time, with raw 64-bit keys: the tree keeps its own copy of the
    keys it holds). ``policy`` is fresh (a keyed policy with ``needs_future`` already
    prepared, unless ``next_uses``); it is bound to a view of the tree's size, as the
    radix cache binds it.

    ``slots`` > 0: a policy that keeps state by key (ARC, S3-FIFO, LeCaR) is given raw
    keys' slots, that many to start with (:meth:`make_slots` adds and frees them between
    runs); ``next_uses``: a keyed policy ranking by next use reads the tree's notes, of
    each run's ``nu_pos`` (the next use of every key position). See :func:`new_tree`."""

    def __init__(
        self,
        policy: EvictionPolicy,
        capacity: int,
        num_keys: int,
        block_tokens: int,
        slots: int = 0,
        next_uses: bool = False,
    ) -> None:
        code = radix_code(policy)
        if code < 0:
            raise ValueError(f"policy '{policy.spec()}' has no compiled radix kernel")
        if next_uses and slots <= 0:
            raise ValueError("a tree that notes next uses needs key slots")
        self.policy, self.code, self.capacity = policy, code, capacity
        self.block_tokens = block_tokens
        self.P = radix_policy_args(policy, capacity, max(num_keys, slots), next_uses)
        self.T = new_tree(capacity, slots, next_uses)
        self.P = (*self.P[:30], self.T[18])  # the policy reads the tree's notes
        self.nu_pos = np.zeros(0, np.float64)

    @property
    def ist(self) -> I64:
        """The array policy's int state (a placeholder for the others)."""
        return self.P[24]

    @property
    def aux(self) -> F64:
        """The per-request columns the array policy's hooks read."""
        return self.P[28]

    @aux.setter
    def aux(self, cols: F64) -> None:
        self.P = (*self.P[:28], cols, *self.P[29:])

    def _set_state(self, st: tuple[I64, F64]) -> None:
        self.P = (*self.P[:24], st[0], st[1], *self.P[26:])
        if isinstance(self.policy, ArrayPolicy):
            self.policy.state = st

    def make_slots(self, num_keys: int, ghost_rows: I64, clear_rows: I64, keep_rows: I64) -> None:
        """At least ``num_keys`` free key slots for the next run (each of its keys may take
        one): first free those nothing uses (:func:`sweep`), then add slots if still
        short, widening the policy's state to match."""
        st = self.T[13]
        if st[NSLOTS] >= num_keys:
            return
        free = sweep(self.T, self.P, self.P[24], ghost_rows, clear_rows, keep_rows)
        if free >= num_keys:
            return
        slots = int(self.T[16].shape[0])
        grown = max(slots + num_keys - free, slots + slots // 2)
        self.T = add_slots(self.T, grown)
        self.P = (*self.P[:30], self.T[18])
        if self.code == ARRAY:
            self._set_state(grow_state((self.P[24], self.P[25]), self.capacity + 2, grown))

    def run(
        self,
        keys: I64,
        key_offsets: I64,
        num_lookup: I64,
        lookup_end: I64,
        held: I64,
        r0: int,
        max_free_blocks: int | None,
        hit_tokens: I64,
        hit_blocks: I64,
        out: I64,
    ) -> None:
        """Replay requests r0, r0 + 1, ... (the rows of ``key_offsets``); out[0] = evicted
        pages so far, out[1] = the request that could not fit (or -1). ``max_free_blocks``
        is the block structure's (the radix tree keeps no pool of free blocks)."""
        if self.T[18].shape[0]:  # the next uses the walks note
            self.T = (*self.T[:19], self.nu_pos)
        P = self.P
        st = _kernel(
            keys,
            key_offsets,
            num_lookup,
            lookup_end,
            held,
            r0,
            self.T,
            self.block_tokens,
            self.code,
            P,
            hit_tokens,
            hit_blocks,
            out,
        )
        if self.code == ARRAY:  # a policy that allocates may have widened its state
            self._set_state(st)
        if out[1] <= -2:
            raise AssertionError(
                f"policy '{self.policy.name}' found no victim (request {-2 - out[1]})"
            )


def replay_radix_fast(
    keys: I64,
    key_offsets: I64,
    num_lookup: I64,
    lookup_end: I64,
    held: I64,
    capacity: int,
    num_keys: int,
    block_tokens: int,
    policy: EvictionPolicy,
) -> tuple[I64, I64, int, int]:
    """Run the kernel; returns (hit_tokens, hit_blocks, evicted pages, failed request).

    ``policy`` is fresh (a keyed policy with ``needs_future`` already prepared); it is
    bound to a view of the tree's size, as the radix cache binds it."""
    prep = RadixPrepared(policy, capacity, num_keys, block_tokens)
    n = int(key_offsets.shape[0]) - 1
    hit_tokens = np.zeros(n, np.int64)
    hit_blocks = np.zeros(n, np.int64)
    out = np.zeros(2, np.int64)
    prep.run(keys, key_offsets, num_lookup, lookup_end, held, 0, None, hit_tokens, hit_blocks, out)
    return hit_tokens, hit_blocks, int(out[0]), int(out[1])
