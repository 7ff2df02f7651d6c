"""Compiled sequential replay of the block cache, one kernel for the built-in policies.

The generic path (cache + policy hooks, numpy per request) is the reference; this kernel
fuses match -> acquire -> commit -> release for the whole trace in one call, with the
structures of the generic path: a chain of holders per key (registration order; the head is
the one a lookup takes) and a stack of empty blocks whose top is reused first. vllm, lru
and fifo keep a queue with lazy invalidation; keyed policies (opt, or any sort key) and
SIEVE and the array-state policies (ARC, S3-FIFO, LeCaR, LPC, WA, UniCache; through
``policies._dispatch``, given each request's index and arrival time) call the hook
functions their classes call, so each policy has one source. A keyed policy is defined by
its sort key alone, and in this loop every block a request releases was accessed by that
request, so three sort keys have cheaper
exact orders than the heap: oldest access first (sglang-lru, hashtable) is release order,
vllm's queue; lfu's is one release-ordered list per hit count; mru's one list popped from
the back. Tests check that the kernel gives exactly the generic path's per-request hits
and eviction counts. It runs compiled when numba is installed (the ``fast`` extra) and
interpreted under ``NUMBA_DISABLE_JIT=1``; the replay uses it when it needs no extra
observers or invariant checks.

    queue (vllm: released blocks; lru: inserted or hit; fifo: inserted)
    head -> b7 b3 b7' b9 <- tail    b7's first copy is stale (its stamp moved on);
                                    evict: the first valid copy with ref == 0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from prefixlab._jit import HAVE_NUMBA, jit
from prefixlab.policies._arrays import (
    ACCESS,
    EVICT,
    EVICTABLE,
    FS,
    HIT_FREE,
    INSERT,
    MISS,
    NOW,
    REQ,
    SC,
    UPDATE,
    ArrayPolicy,
    grow_state,
    new_state,
)
from prefixlab.policies._dispatch import hook, miss_begin, reserve
from prefixlab.policies._keyed import (
    KeyedPolicy,
    entry_key,
    heap_pop,
    heap_set,
    is_plain_keyed,
    key_columns,
)
from prefixlab.policies._segments import sq_pop, sq_push
from prefixlab.policies.base import EntryView, EvictionPolicy, registered
from prefixlab.policies.sieve import (
    Sieve,
    sieve_access,
    sieve_evictable,
    sieve_insert,
    sieve_pinned,
    sieve_pop,
    sieve_state,
)

__all__ = [
    "HAVE_NUMBA",
    "Prepared",
    "block_kernel",
    "kernel_code",
    "kernel_state",
    "replay_fast",
    "sweep_slots",
    "warm_up",
    "widen_slots",
    "widen_state",
]

I64 = npt.NDArray[np.int64]
VLLM, LRU, FIFO, KEYED, SIEVE, ARRAY, LFU_LISTS, MRU_STACK = 0, 1, 2, 3, 4, 5, 6, 7
_QUEUE_CODES = {"vllm": VLLM, "lru": LRU, "fifo": FIFO}
_RELEASE_ORDER_KEYS = ((("last_access", 1),), (("last_access", 1), ("depth", -1)))
_LFU_KEY = (("hits", 1), ("last_access", 1), ("depth", -1))
_MRU_KEY = (("last_access", -1), ("depth", -1))


def policy_family(pol: EvictionPolicy) -> str | None:
    """Which compiled hooks run a policy: ``"keyed"`` (any keyed policy, built-in or not,
    whose hooks are KeyedPolicy's own: its behaviour is its sort key), ``"sieve"``,
    ``"array"`` (ARC, S3-FIFO, LeCaR, LPC, WA, UniCache), a queue policy's name (``"vllm"``,
    ``"lru"``, ``"fifo"``), or None: the generic path only (a subclass may have changed a hook)."""
    cls = type(pol)
    if isinstance(pol, KeyedPolicy):
        return "keyed" if is_plain_keyed(pol) else None
    if cls is not registered().get(pol.name) or pol.uses_lookahead:
        return None  # a subclass, or a policy reading the engine's waiting queue
    if cls is Sieve:
        return "sieve"
    if isinstance(pol, ArrayPolicy):
        return "array"
    return pol.name if pol.name in _QUEUE_CODES else None


def kernel_code(pol: EvictionPolicy) -> int:
    """The block kernel's code for a policy, or -1 when it must take the generic path."""
    family = policy_family(pol)
    if family == "keyed":
        assert isinstance(pol, KeyedPolicy)
        # Oldest access first, ties deepest first: in this loop every block a request holds
        # was accessed at its index and is released deepest first, so release order is key
        # order and vllm's queue gives the heap's victims (sglang-lru, hashtable; tested).
        # For the same reason lfu's order is one release-ordered list per hit count (evict
        # from the lowest count's front) and mru's one list evicted from the back, each
        # request's blocks appended shallowest first (tested equal to the heap).
        key = tuple(pol.sort_key)
        if key in _RELEASE_ORDER_KEYS:
            return VLLM
        return LFU_LISTS if key == _LFU_KEY else MRU_STACK if key == _MRU_KEY else KEYED
    codes = {"sieve": SIEVE, "array": ARRAY, **_QUEUE_CODES}
    return codes[family] if family is not None else -1


@jit(inline=True)
def _list_remove(b: int, prev: Any, nxt: Any, ends: Any) -> None:
    p, q = prev[b], nxt[b]
    if p >= 0:
        nxt[p] = q
    else:
        ends[0] = q
    if q >= 0:
        prev[q] = p
    else:
        ends[1] = p


@jit(inline=True)
def _list_append(b: int, prev: Any, nxt: Any, ends: Any) -> None:
    prev[b] = ends[1]
    nxt[b] = -1
    if ends[1] >= 0:
        nxt[ends[1]] = b
    else:
        ends[0] = b
    ends[1] = b


@jit(inline=True)
def _l_append(bl: Any, bht: Any, f: int, b: int) -> None:
    """Append block b to list f (rows of bl: prev, next, list; of bht: head, tail)."""
    t = bht[1, f]
    bl[0, b] = t
    bl[1, b] = -1
    bl[2, b] = f
    if t >= 0:
        bl[1, t] = b
    else:
        bht[0, f] = b
    bht[1, f] = b


@jit(inline=True)
def _l_unlink(bl: Any, bht: Any, b: int) -> None:
    f = bl[2, b]
    if f < 0:
        return
    p, n = bl[0, b], bl[1, b]
    if p >= 0:
        bl[1, p] = n
    else:
        bht[0, f] = n
    if n >= 0:
        bl[0, n] = p
    else:
        bht[1, f] = p
    bl[2, b] = -1


@jit(inline=True)
def _drop_key(b: int, bkey: Any, chains: Any, primary: Any) -> int:
    """Drop b's key from its holder chain; returns the holder it promotes to primary
    (-1: none, or the new head already was primary)."""
    k = bkey[b]
    # Row k of chains[0:2] is the key's (first, last) holder; rows 2, 3 link the holders.
    _list_remove(b, chains[2], chains[3], chains[0:2, k])
    bkey[b] = -1
    primary[b] = True
    head = chains[0, k]
    if head >= 0 and not primary[head]:
        primary[head] = True
        return int(head)
    return -1


def kernel_state(
    capacity: int, num_keys: int, policy: int, nlists: int, raw_keys: bool = False
) -> tuple[Any, ...]:
    """The block kernel's state for an empty cache: what a replay carries from one call of
    :func:`block_kernel` to the next (a streamed replay calls it once per chunk of requests).

    ``num_keys`` bounds the dense key ids the calls will pass (rows 0-1 of ``chains`` are
    per key); ``nlists`` the hit counts lfu's lists can reach (:func:`widen_state` widens
    it). ``raw_keys``: the calls pass raw 64-bit keys instead, which the kernel maps to
    slots through a table of the keys in use: for a per-block policy the cached keys (at
    most ``capacity``; a key leaves when its last holder is evicted), for an array-state
    policy also those in its ghost lists, which :func:`sweep_slots` frees between calls
    (``num_keys`` slots to start with, :func:`widen_slots` adds more). Nothing in the state
    grows with the trace."""
    keyed = policy == KEYED
    lists = policy in (LFU_LISTS, MRU_STACK)
    link, flag, sst = sieve_state(capacity if policy == SIEVE else 1)
    if raw_keys:
        num_keys = max(num_keys, capacity) if policy == ARRAY else capacity
    cells = 1 << max(int(2 * num_keys - 1).bit_length(), 4) if raw_keys else 1
    slots = num_keys if raw_keys else 0
    return (
        np.full((3, capacity if lists else 1), -1, np.int64),  # bl: lfu / mru list links
        np.full((2, nlists if policy == LFU_LISTS else 1), -1, np.int64),  # bht: list ends
        np.zeros(1, np.int64),  # lo: no list below this one holds a block
        np.zeros(capacity, np.int64),  # ref
        np.full(capacity, -1, np.int64),  # bkey
        np.full((4, max(num_keys, capacity)), -1, np.int64),  # chains
        np.full(capacity, -1, np.int64),  # stamp
        np.empty(4 * capacity + 64, np.int64),  # qb
        np.empty(4 * capacity + 64, np.int64),  # qs
        np.zeros(3, np.int64),  # qstate: head, tail, next stamp
        np.ones(capacity, np.bool_),  # primary
        np.zeros(capacity, np.float64),  # la
        np.zeros(capacity, np.int64),  # nhits
        np.zeros(capacity, np.int64),  # depth
        np.zeros(capacity, np.float64),  # created
        np.zeros((capacity if keyed else 1, 4), np.float64),  # hk
        np.zeros(capacity, np.int64),  # he
        np.full(capacity, -1, np.int64),  # hpos
        np.zeros(1, np.int64),  # hn
        link,
        flag,
        sst,
        np.arange(capacity - 1, -1, -1).astype(np.int64),  # empty: a stack, top last
        # order, empty blocks, cached free, evictions, free slots
        np.array([0, capacity, 0, 0, slots], np.int64),
        np.full((cells, 2), -1, np.int64),  # ktab: raw key -> slot (raw_keys only)
        np.zeros(max(slots, 1), np.int64),  # skey: slot -> raw key
        np.arange(slots - 1, -1, -1).astype(np.int64),  # sfree: a stack, top last
    )


def widen_slots(state: tuple[Any, ...], num_slots: int) -> tuple[Any, ...]:
    """A raw-key ``state`` with ``num_slots`` slots (new ones free, the table rehashed to at
    most half full)."""
    st = list(state)
    chains, ktab, skey, sfree, sc = st[5], st[24], st[25], st[26], st[23]
    old = skey.shape[0]
    if num_slots <= old:
        return state
    if chains.shape[1] < num_slots:
        more = np.full((4, num_slots - chains.shape[1]), -1, np.int64)
        st[5] = np.concatenate((chains, more), axis=1)
    st[25] = np.concatenate((skey, np.zeros(num_slots - old, np.int64)))
    nfree = int(sc[4])
    fresh = np.arange(num_slots - 1, old - 1, -1, dtype=np.int64)
    stack = np.empty(num_slots, np.int64)  # room for every slot to be free
    stack[: fresh.shape[0]] = fresh  # the fresh ones under the old ones
    stack[fresh.shape[0] : fresh.shape[0] + nfree] = sfree[:nfree]
    st[26] = stack
    sc[4] = nfree + fresh.shape[0]
    cells = 1 << int(2 * num_slots - 1).bit_length()
    if cells > ktab.shape[0]:
        st[24] = _rehash(ktab, cells)
    return tuple(st)


@jit()
def _rehash(ktab: Any, cells: int) -> Any:
    """ktab's entries in a table of ``cells`` cells."""
    new = np.full((cells, 2), -1, np.int64)
    for i in range(ktab.shape[0]):
        if ktab[i, 1] >= 0:
            j = _kcell(new, ktab[i, 0])
            new[j, 0] = ktab[i, 0]
            new[j, 1] = ktab[i, 1]
    return new


@jit()
def sweep_slots(state: Any, ist: Any, ghost_rows: Any, clear_rows: Any) -> int:
    """Free the slots of keys no block holds and no ghost list (rows ``ghost_rows`` of the
    array policy's ``ist``, -1 when absent) names; their rows ``clear_rows`` are zeroed for
    the next key. Returns how many slots are free."""
    chains, sc, ktab, sfree = state[5], state[23], state[24], state[26]
    for i in range(ktab.shape[0]):
        s = ktab[i, 1]
        if s < 0:
            continue
        live = chains[0, s] >= 0
        for g in ghost_rows:
            live = live or ist[g, s] >= 0
        if live:
            continue
        ktab[i, 1] = -1
        for c in clear_rows:
            ist[c, s] = 0
        sfree[sc[4]] = s
        sc[4] += 1
    fresh = _rehash(ktab, ktab.shape[0])
    ktab[:] = fresh
    return int(sc[4])


def widen_state(state: tuple[Any, ...], nlists: int) -> tuple[Any, ...]:
    """``state`` with room for lfu hit counts below ``nlists`` (new lists are empty)."""
    bht = state[1]
    if bht.shape[1] == 1 or bht.shape[1] >= nlists:
        return state
    more = np.full((2, nlists - bht.shape[1]), -1, np.int64)
    return (state[0], np.concatenate((bht, more), axis=1), *state[2:])


# A streamed replay passes raw 64-bit keys (as int64) and the kernel maps them to slots
# itself: an open-addressing table (linear probing, no tombstones) of the keys some block
# holds, at most the capacity. Row j of ktab is a cell (key, slot), slot -1 when empty;
# skey[slot] is the key, sfree a stack of unused slots (sc[4] of them).
@jit(inline=True)
def _khash(key: int, mask: int) -> int:
    # 31-bit halves: neither product overflows int64 (interpreted numpy would warn)
    h = ((key & 0x7FFFFFFF) * 0x9E3779B1) ^ (((key >> 31) & 0x7FFFFFFF) * 0x85EBCA77)
    return (h ^ (h >> 29)) & mask


@jit(inline=True)
def _kcell(ktab: Any, key: int) -> int:
    """The cell holding key, or the empty cell where it would go."""
    mask = ktab.shape[0] - 1
    j = _khash(key, mask)
    while ktab[j, 1] >= 0 and ktab[j, 0] != key:
        j = (j + 1) & mask
    return j


@jit(nrt=False)
def _kslot(ktab: Any, skey: Any, sfree: Any, sc: Any, key: int) -> int:
    """key's slot, given a free one (and a cell) if it has none."""
    j = _kcell(ktab, key)
    if ktab[j, 1] < 0:
        sc[4] -= 1
        s = sfree[sc[4]]
        ktab[j, 0] = key
        ktab[j, 1] = s
        skey[s] = key
    return int(ktab[j, 1])


@jit(nrt=False)
def _kfree(ktab: Any, skey: Any, sfree: Any, sc: Any, s: int) -> None:
    """Give slot s back: delete its key, shifting the rest of its probe run back."""
    mask = ktab.shape[0] - 1
    j = _kcell(ktab, skey[s])
    ktab[j, 1] = -1
    sfree[sc[4]] = s
    sc[4] += 1
    i = j
    while True:
        i = (i + 1) & mask
        if ktab[i, 1] < 0:
            return
        h = _khash(ktab[i, 0], mask)
        if (h <= j or h > i) if j <= i else (h <= j and h > i):
            ktab[j, 0] = ktab[i, 0]
            ktab[j, 1] = ktab[i, 1]
            ktab[i, 1] = -1
            j = i


@jit(nogil=True)
def block_kernel(
    state: Any,
    keys: Any,
    key_offsets: Any,
    num_lookup: Any,
    lookup_end: Any,
    held: Any,
    r0: int,
    capacity: int,
    block_tokens: int,
    policy: int,
    max_free: int,
    cols: Any,
    signs: Any,
    occ_start: Any,
    occ_req: Any,
    nu_pos: Any,
    ist: Any,
    fst: Any,
    acode: int,
    rng: Any,
    aux: Any,
    hit_tokens: Any,
    hit_blocks: Any,
    out: Any,
) -> tuple[Any, Any]:
    """Replay requests r0, r0 + 1, ... (the rows of ``key_offsets``) from ``state`` (see
    :func:`kernel_state`), which it updates. out[0] = evictions so far, out[1] = the
    request that could not fit (or -1); returns the array policy's state (a policy that
    allocates may have widened it).

    vllm, lru and fifo order blocks in the queue their classes use (``policies._segments``):
    vllm queues a block when it is released and invalidates it when a hit takes it; lru
    queues on insert and on every hit; fifo on insert only. The victim is the oldest valid
    unpinned copy. Keyed policies (``policies._keyed``) and SIEVE run their own hooks,
    the functions their classes call. Victims of one request are chosen before their keys
    are dropped, as the block cache does (a dropped key may promote a duplicate holder,
    which a keyed policy re-ranks).
    """
    (bl, bht, lo, ref, bkey, chains, stamp, qb, qs, qstate, primary, la, nhits, depth,
     created, hk, he, hpos, hn, link, flag, sst, empty, sc, ktab, skey, sfree) = state  # fmt: skip
    raw = ktab.shape[0] > 1  # keys are raw: map them to slots through ktab
    keyed = policy == KEYED
    sieve = policy == SIEVE
    array = policy == ARRAY
    lists = policy in (LFU_LISTS, MRU_STACK)
    kbuf = np.empty(3, np.float64)
    order = sc[0]
    n_empty = sc[1]
    cached_free = sc[2]
    evictions = sc[3]
    blocks = np.empty(max(int(held.max()) if held.shape[0] else 1, 1), np.int64)
    released = np.empty(max(blocks.shape[0], capacity), np.int64)
    victims = np.empty(max(blocks.shape[0], capacity), np.int64)
    out[1] = -1
    for i_r in range(key_offsets.shape[0] - 1):
        r = r0 + i_r
        now = float(r)
        k0 = key_offsets[i_r]
        nk = key_offsets[i_r + 1] - k0
        nl = num_lookup[i_r]
        nh = held[i_r]
        if array:  # the request and its time (the arrival), room for its allocations
            ist, fst = reserve(acode, ist, fst, nh)
            ist[SC, REQ] = r
            if aux.shape[1] > r:
                fst[FS, NOW] = aux[0, r]
        # ---- match: longest run of keys with a holder (the first registered one)
        h = 0
        while h < nl:
            if raw:
                s = ktab[_kcell(ktab, keys[k0 + h]), 1]
                if s < 0:
                    break
                b = chains[0, s]
            else:
                b = chains[0, keys[k0 + h]]
            if b < 0:
                break
            blocks[h] = b
            h += 1
        hit_blocks[i_r] = h
        hit_tokens[i_r] = lookup_end[i_r] if h == nl else h * block_tokens
        # ---- acquire (nothing changes if it cannot fit)
        need = nh - h
        hit_free = 0
        for i in range(h):
            if ref[blocks[i]] == 0:
                hit_free += 1
        if need > n_empty + cached_free - hit_free:
            out[1] = r
            break
        for i in range(h):
            b = blocks[i]
            if policy == LRU:  # a hit is an access
                sq_push(qb, qs, stamp, qstate, b)
            elif sieve:
                sieve_access(flag, b)
            elif array:  # a hit; on an evictable block it pins it too
                hook(acode, ist, fst, HIT_FREE if ref[b] == 0 else ACCESS, b, -1, bkey, depth,
                     rng, aux)  # fmt: skip
            if ref[b] == 0:  # it leaves the evictable pool
                if policy == VLLM:  # touch takes it out of the free queue
                    stamp[b] = -1
                # keyed: the block stays in the heap with its old key; a pop that meets a
                # pinned block drops it, its release re-keys it (one heap step, not two)
                elif sieve:
                    sieve_pinned(flag, sst, b)
                elif lists:
                    _l_unlink(bl, bht, b)
                cached_free -= 1
            ref[b] += 1
            if keyed or lists:
                la[b] = now
                nhits[b] += 1
        if array and nk > h:  # the keys it will cache that it missed, before any eviction
            miss_begin(acode, ist)
            for j in range(h, nk):
                k = _kslot(ktab, skey, sfree, sc, keys[k0 + j]) if raw else keys[k0 + j]
                hook(acode, ist, fst, MISS, k, -1, bkey, depth, rng, aux)
        take = min(need, n_empty)
        for j in range(take):
            n_empty -= 1
            blocks[h + j] = empty[n_empty]
        nv = need - take
        if nv > 0:
            _evict(nv, policy, victims, qb, qs, stamp, ref, qstate, hk, he, hpos, hn, link,
                   flag, sst, bkey, chains, primary, cols, signs, la, nhits, depth, created,
                   occ_start, occ_req, r, ist, fst, acode, rng, aux, bl, bht, lo, ktab, skey,
                   sfree, sc)  # fmt: skip
            for j in range(nv):
                blocks[h + take + j] = victims[j]
            cached_free -= nv
            evictions += nv
        for j in range(need):
            ref[blocks[h + j]] = 1
        # ---- commit: new full blocks get their keys, appended to the key's holders
        for j in range(h, nk):
            b = blocks[j]
            k = _kslot(ktab, skey, sfree, sc, keys[k0 + j]) if raw else keys[k0 + j]
            bkey[b] = k
            primary[b] = chains[0, k] < 0
            _list_append(b, chains[2], chains[3], chains[0:2, k])
            depth[b] = j
            if keyed or lists:
                created[b] = now
                la[b] = now
                nhits[b] = 0
            elif sieve:
                sieve_insert(link, flag, sst, b)
            elif array:
                hook(acode, ist, fst, INSERT, b, -1, bkey, depth, rng, aux)
            elif policy != VLLM:  # lru / fifo: an insertion
                sq_push(qb, qs, stamp, qstate, b)
        # ---- release, tail first; keyless blocks go back on top of the empty stack
        n_rel = 0
        n_mru = 0
        for i in range(nh - 1, -1, -1):
            b = blocks[i]
            ref[b] -= 1
            if ref[b] == 0:
                if bkey[b] >= 0:
                    cached_free += 1
                    if policy == VLLM:
                        sq_push(qb, qs, stamp, qstate, b)
                    elif keyed:
                        nu = nu_pos[k0 + i] if nu_pos.shape[0] else np.nan
                        entry_key(cols, signs, b, la, nhits, depth, created, primary, bkey,
                                  occ_start, occ_req, r, kbuf, nu)  # fmt: skip
                        heap_set(hk, he, hpos, hn, b, kbuf[0], kbuf[1], kbuf[2], float(order))
                        order += 1
                    elif sieve:
                        sieve_evictable(flag, sst, b)
                    elif array:
                        hook(acode, ist, fst, EVICTABLE, b, -1, bkey, depth, rng, aux)
                    elif policy == LFU_LISTS:
                        _l_append(bl, bht, nhits[b], b)
                        lo[0] = min(lo[0], nhits[b])
                    elif policy == MRU_STACK:
                        victims[n_mru] = b  # appended below, shallowest first
                        n_mru += 1
                else:
                    released[n_rel] = b
                    n_rel += 1
        for i in range(n_mru - 1, -1, -1):
            _l_append(bl, bht, 0, victims[i])
        # ---- bound on the cached-free pool: trimmed blocks become empty
        if max_free >= 0 and cached_free > max_free:
            nv = cached_free - max_free
            _evict(nv, policy, victims, qb, qs, stamp, ref, qstate, hk, he, hpos, hn, link,
                   flag, sst, bkey, chains, primary, cols, signs, la, nhits, depth, created,
                   occ_start, occ_req, r, ist, fst, acode, rng, aux, bl, bht, lo, ktab, skey,
                   sfree, sc)  # fmt: skip
            for j in range(nv):
                released[n_rel] = victims[j]
                n_rel += 1
            cached_free -= nv
            evictions += nv
        for i in range(n_rel - 1, -1, -1):  # prepend_n: the first released ends on top
            empty[n_empty] = released[i]
            n_empty += 1
    sc[0] = order
    sc[1] = n_empty
    sc[2] = cached_free
    sc[3] = evictions
    out[0] = evictions
    return ist, fst


@jit()
def _evict(
    n: int, policy: int, victims: Any, qb: Any, qs: Any, stamp: Any, ref: Any, qstate: Any,
    hk: Any, he: Any, hpos: Any, hn: Any, link: Any, flag: Any, sst: Any, bkey: Any,
    chains: Any, primary: Any, cols: Any, signs: Any, la: Any, nhits: Any, depth: Any,
    created: Any, occ_start: Any, occ_req: Any, r: int, ist: Any, fst: Any, acode: int,
    rng: Any, aux: Any, bl: Any, bht: Any, lo: Any, ktab: Any, skey: Any, sfree: Any,
    sc: Any,
) -> None:  # fmt: skip
    """Choose n victims (the caller knows they exist), then drop their keys in order (raw
    keys: a key left with no holder leaves the table and gives its slot back)."""
    for j in range(n):
        if policy == KEYED:
            e = heap_pop(hk, he, hpos, hn)
            while ref[e] > 0:  # pinned by this request: left in the heap by the hit
                e = heap_pop(hk, he, hpos, hn)
            victims[j] = e
        elif policy == SIEVE:
            victims[j] = sieve_pop(link, flag, sst)
        elif policy == ARRAY:
            victims[j] = hook(acode, ist, fst, EVICT, 0, -1, bkey, depth, rng, aux)
        elif policy == LFU_LISTS:
            while bht[0, lo[0]] < 0:
                lo[0] += 1
            victims[j] = bht[0, lo[0]]
            _l_unlink(bl, bht, victims[j])
        elif policy == MRU_STACK:
            victims[j] = bht[1, 0]
            _l_unlink(bl, bht, victims[j])
        else:
            victims[j] = sq_pop(qb, qs, stamp, ref, True, qstate)
    kbuf = np.empty(3, np.float64)
    raw = ktab.shape[0] > 1
    for j in range(n):
        k = bkey[victims[j]]
        up = _drop_key(victims[j], bkey, chains, primary)
        if raw and policy != ARRAY and chains[0, k] < 0:  # (ghosts: sweep_slots frees)
            _kfree(ktab, skey, sfree, sc, k)
        if up >= 0 and policy == KEYED and hpos[up] >= 0 and ref[up] == 0:  # on_update
            entry_key(cols, signs, up, la, nhits, depth, created, primary, bkey, occ_start,
                      occ_req, r, kbuf)  # fmt: skip
            heap_set(hk, he, hpos, hn, up, kbuf[0], kbuf[1], kbuf[2], hk[hpos[up], 3])
        elif up >= 0 and policy == ARRAY:  # a promoted duplicate: re-rank it (on_update)
            hook(acode, ist, fst, UPDATE, up, -1, bkey, depth, rng, aux)


class Prepared:
    """A policy made ready for :func:`block_kernel`: the state of an empty cache and the
    arguments its policy family reads (a keyed policy's sort key and future columns; an
    array-state policy's state, generator and per-request rows), placeholders for the rest
    (the kernel's argument types never change). The whole replay calls it once, a streamed
    replay once per chunk."""

    def __init__(
        self,
        policy: EvictionPolicy,
        capacity: int,
        block_tokens: int,
        num_keys: int,
        nlists: int,
        raw_keys: bool = False,
    ) -> None:
        code = kernel_code(policy)
        if code < 0:
            raise ValueError(f"policy '{policy.spec()}' has no compiled kernel")
        self.policy, self.code = policy, code
        self.capacity, self.block_tokens = capacity, block_tokens
        self.cols, self.signs = np.full(3, -1, np.int64), np.ones(3, np.float64)
        self.occ_start, self.occ_req = np.zeros(1, np.int64), np.zeros(0, np.int64)
        self.nu_pos = np.zeros(0, np.float64)
        if isinstance(policy, KeyedPolicy):
            self.cols, self.signs = key_columns(policy.sort_key)
            self.occ_start = getattr(policy, "occ_start", self.occ_start)
            self.occ_req = getattr(policy, "occ_req", self.occ_req)
            self.nu_pos = getattr(policy, "next_use_pos", self.nu_pos)
        self.state = kernel_state(capacity, num_keys, code, nlists, raw_keys)
        # ARC, S3-FIFO, LeCaR, LPC, WA, UniCache bring their state and generator; the
        # others get a one-entry placeholder.
        self.acode, st, self.rng = -1, new_state(1, 1, (1, 1)), np.random.default_rng(0)
        self.aux = np.zeros((1, 0))
        if code == ARRAY:
            assert isinstance(policy, ArrayPolicy)
            view = EntryView(capacity)
            view.size[:] = block_tokens  # every block holds block_tokens (UniCache reads it)
            policy.bind(view)
            st = grow_state(policy.state, capacity, max(num_keys, 1))
            self.acode, self.rng, self.aux = policy.code, policy.rng, policy.aux
        self.ist, self.fst = st

    def run(
        self, keys: I64, key_offsets: I64, num_lookup: I64, lookup_end: I64, held: I64,
        r0: int, max_free_blocks: int | None, hit_tokens: I64, hit_blocks: I64, out: I64,
    ) -> None:  # fmt: skip
        """Replay requests r0, r0 + 1, ... (the rows of ``key_offsets``) from the state."""
        st = block_kernel(
            self.state, keys, key_offsets, num_lookup, lookup_end, held, r0, self.capacity,
            self.block_tokens, self.code, -1 if max_free_blocks is None else max_free_blocks,
            self.cols, self.signs, self.occ_start, self.occ_req, self.nu_pos, self.ist,
            self.fst, self.acode, self.rng, self.aux, hit_tokens, hit_blocks, out,
        )  # fmt: skip
        self.ist, self.fst = st  # a policy that allocates may have widened its state
        if self.code == ARRAY:
            assert isinstance(self.policy, ArrayPolicy)
            self.policy.state = st


def replay_fast(
    keys: I64,
    key_offsets: I64,
    num_lookup: I64,
    lookup_end: I64,
    held: I64,
    capacity: int,
    num_keys: int,
    block_tokens: int,
    policy: EvictionPolicy,
    max_free_blocks: int | None,
) -> tuple[I64, I64, int, int]:
    """Run the kernel; returns (hit_tokens, hit_blocks, num_evictions, failed_request).

    ``policy`` is fresh (a keyed policy with ``needs_future`` already prepared)."""
    n = int(key_offsets.shape[0]) - 1
    prep = Prepared(policy, capacity, block_tokens, max(num_keys, 1), n + 1)
    hit_tokens = np.zeros(n, np.int64)
    hit_blocks = np.zeros(n, np.int64)
    out = np.zeros(2, np.int64)
    prep.run(keys, key_offsets, num_lookup, lookup_end, held, 0, max_free_blocks, hit_tokens,
             hit_blocks, out)  # fmt: skip
    return hit_tokens, hit_blocks, int(out[0]), int(out[1])


def warm_up() -> None:
    """Compile (or load the cached compilation) outside any timed region."""
    from prefixlab.policies.vllm import VLLM as VLLMPolicy

    one = np.zeros(1, np.int64)
    offs = np.array([0, 1], np.int64)
    replay_fast(one, offs, one, one, np.ones(1, np.int64), 2, 1, 16, VLLMPolicy(), None)
