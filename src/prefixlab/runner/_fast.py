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

import numpy as np

from prefixlab._jit import HAVE_NUMBA, jit
from prefixlab._keytable import kcell, khash, kslot, more_slots
from prefixlab._keytable import sweep_slots as sweep_keys
from prefixlab.cache.view import EntryView
from prefixlab.policies._arrays import (
    ABASE,
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
from prefixlab.policies._segments import sq_pop, sq_pop_parked, sq_push, sq_unpark
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import EvictionPolicy, registered
from prefixlab.policies.hooks.unicache import CODE as UNICACHE
from prefixlab.policies.hooks.unicache import UCOPT, uc_evict_opt
from prefixlab.policies.sieve import (
    Sieve,
    sieve_access,
    sieve_evictable,
    sieve_insert,
    sieve_pinned,
    sieve_pop,
    sieve_state,
)
from prefixlab.types import B1, F64, I64

__all__ = [
    "HAVE_NUMBA",
    "Prepared",
    "block_kernel",
    "engine_code",
    "kernel_code",
    "kernel_state",
    "replay_fast",
    "sweep_slots",
    "warm_up",
    "widen_slots",
    "widen_state",
]

#: the block kernel's state, what :func:`kernel_state` makes (its comments name each array)
BlockState = tuple[
    I64, I64, I64, I64, I64, I64, I64, I64, I64, I64,  # bl, bht, lo, ref, bkey, chains, ..
    B1, F64, I64, I64, F64, F64, I64, I64, I64,  # primary, la, nhits, depth, created, hk, ..
    I64, I64, I64, I64, I64, I64, I64, I64, I64, I64, I64, F64,  # link, .., kbuf
]  # fmt: skip
#: a policy's arguments to the per-operation functions (``pp``, :meth:`Prepared.policy_args`):
#: code, sort-key columns, signs, occ_start, occ_req, array-policy code, generator, aux, park
PolicyArgs = tuple[int, I64, F64, I64, I64, int, np.random.Generator, F64, bool]
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
    if cls is not registered().get(pol.name):
        return None  # a subclass
    if pol.uses_lookahead and not getattr(pol, "compiled_waiting", False):
        return None  # reads the engine's waiting queue, which the kernels do not feed it
    if cls is Sieve:
        return "sieve"
    if isinstance(pol, ArrayPolicy):
        return "array"
    return pol.name if pol.name in _QUEUE_CODES else None


def kernel_code(pol: EvictionPolicy) -> int:
    """The block kernel's code for a policy, or -1 when it must take the generic path."""
    if pol.uses_lookahead:
        return -1  # the replay has no waiting queue
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


def engine_code(pol: EvictionPolicy) -> int:
    """The code a policy runs under the compiled engine, or -1. Keyed policies keep their
    heap there: a request's blocks are accessed when it is admitted and released when it
    finishes, so release order is no longer key order."""
    family = policy_family(pol)
    if family == "keyed":
        return KEYED
    codes = {"sieve": SIEVE, "array": ARRAY, **_QUEUE_CODES}
    return codes[family] if family is not None else -1


# A key's holders: row k of chains[0:2] is its (first, last) holder; rows 2, 3 link the
# holders (previous, next), by block. Indexed in place: a slice per call would cost the
# kernel an array view (two atomic reference-count updates) per block. Row 4, by key: a
# streamed keyed policy's next use of the key as last noted (NOTED_NEVER: none), which a
# promoted duplicate holder is ranked by (see :func:`note_next_uses`).
NOTED_NEVER = -1


@jit(inline=True)
def _noted(nu: float) -> int:
    return int(nu) if nu < np.inf else NOTED_NEVER


@jit(nrt=False)
def note_next_uses(state: BlockState, keys: I64, k0: int, lo_: int, hi: int, nu_pos: F64) -> None:
    """A streamed keyed policy (next uses from a column, no occurrence lists) notes the
    next use of the keys keys[k0 + lo_:k0 + hi] that have holders: the lookups the request
    missed, before its evictions. With the notes its releases make (the next use of every
    key it held), a key's note is then its first lookup after the current request whenever
    an eviction promotes one of its duplicate holders: a key last held by request r* is
    looked up by no request after r* and before its next use, or that request would have
    noted it; and a request that looks the key up but misses it noted it here."""
    chains, ktab = state[5], state[24]
    raw = ktab.shape[0] > 1
    for j in range(lo_, hi):
        s = ktab[kcell(ktab, keys[k0 + j]), 1] if raw else keys[k0 + j]
        if s >= 0:
            chains[4, s] = _noted(nu_pos[k0 + j])


@jit(inline=True)
def _chain_remove(chains: I64, b: int, k: int) -> None:
    p, q = chains[2, b], chains[3, b]
    if p >= 0:
        chains[3, p] = q
    else:
        chains[0, k] = q
    if q >= 0:
        chains[2, q] = p
    else:
        chains[1, k] = p


@jit(inline=True)
def _chain_append(chains: I64, b: int, k: int) -> None:
    t = chains[1, k]
    chains[2, b] = t
    chains[3, b] = -1
    if t >= 0:
        chains[3, t] = b
    else:
        chains[0, k] = b
    chains[1, k] = b


@jit(inline=True)
def _l_append(bl: I64, bht: I64, f: int, b: int) -> None:
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
def _l_unlink(bl: I64, bht: I64, b: int) -> None:
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
def _drop_key(b: int, bkey: I64, chains: I64, primary: B1) -> int:
    """Drop b's key from its holder chain; returns the holder it promotes to primary
    (-1: none, or the new head already was primary)."""
    k = bkey[b]
    _chain_remove(chains, b, k)
    bkey[b] = -1
    primary[b] = True
    head = chains[0, k]
    if head >= 0 and not primary[head]:
        primary[head] = True
        return int(head)
    return -1


def kernel_state(
    capacity: int, num_keys: int, policy: int, nlists: int, raw_keys: bool = False
) -> BlockState:
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
    link, flag, sst = sieve_state(capacity if policy == SIEVE else 1)
    if raw_keys:
        num_keys = max(num_keys, capacity) if policy == ARRAY else capacity
    cells = 1 << max(int(2 * num_keys - 1).bit_length(), 4) if raw_keys else 1
    slots = num_keys if raw_keys else 0
    return (
        *_block_arrays(capacity, num_keys, policy, nlists),
        link,
        flag,
        sst,
        np.arange(capacity - 1, -1, -1).astype(np.int64),  # empty: a stack, top last
        # order, empty blocks, cached free, evictions, free slots
        np.array([0, capacity, 0, 0, slots], np.int64),
        np.full((cells, 2), -1, np.int64),  # ktab: raw key -> slot (raw_keys only)
        np.zeros(max(slots, 1), np.int64),  # skey: slot -> raw key
        np.arange(slots - 1, -1, -1).astype(np.int64),  # sfree: a stack, top last
        np.zeros(capacity, np.int64),  # pk: parked (1), parked with a heap item (2)
        np.empty(2 * capacity + 64, np.int64),  # hst: the parked heap's stamps
        np.empty(2 * capacity + 64, np.int64),  # hid: its entries
        np.empty(3, np.float64),  # kbuf: a keyed policy's sort key (scratch)
    )


def _block_arrays(
    capacity: int, num_keys: int, policy: int, nlists: int
) -> tuple[
    I64, I64, I64, I64, I64, I64, I64, I64, I64, I64,
    B1, F64, I64, I64, F64, F64, I64, I64, I64,
]:  # fmt: skip
    """The first 19 arrays of :func:`kernel_state` (bl .. hn): lists, chains, the queue,
    the per-block columns and the keyed heap."""
    keyed = policy == KEYED
    lists = policy in (LFU_LISTS, MRU_STACK)
    return (
        np.full((3, capacity if lists else 1), -1, np.int64),  # bl: lfu / mru list links
        np.full((2, nlists if policy == LFU_LISTS else 1), -1, np.int64),  # bht: list ends
        np.zeros(1, np.int64),  # lo: no list below this one holds a block
        np.zeros(capacity, np.int64),  # ref
        np.full(capacity, -1, np.int64),  # bkey
        np.full((5, max(num_keys, capacity)), -1, np.int64),  # chains
        np.full(capacity, -1, np.int64),  # stamp
        np.empty(4 * capacity + 64, np.int64),  # qb
        np.empty(4 * capacity + 64, np.int64),  # qs
        np.zeros(4, np.int64),  # qstate: head, tail, next stamp, parked heap size
        np.ones(capacity, np.bool_),  # primary
        np.zeros(capacity, np.float64),  # la
        np.zeros(capacity, np.int64),  # nhits
        np.zeros(capacity, np.int64),  # depth
        np.zeros(capacity, np.float64),  # created
        np.zeros((capacity if keyed else 1, 4), np.float64),  # hk
        np.zeros(capacity, np.int64),  # he
        np.full(capacity, -1, np.int64),  # hpos
        np.zeros(1, np.int64),  # hn
    )


def widen_slots(state: BlockState, num_slots: int) -> BlockState:
    """A raw-key ``state`` with ``num_slots`` slots (new ones free, the table rehashed to at
    most half full)."""
    chains = state[5]
    if num_slots <= state[25].shape[0]:
        return state
    if chains.shape[1] < num_slots:
        more = np.full((chains.shape[0], num_slots - chains.shape[1]), -1, np.int64)
        chains = np.concatenate((chains, more), axis=1)
    ktab, skey, sfree = more_slots(state[24], state[25], state[26], state[23], 4, num_slots)
    return (*state[:5], chains, *state[6:24], ktab, skey, sfree, *state[27:])


def sweep_slots(state: BlockState, ist: I64, ghost_rows: I64, clear_rows: I64) -> int:
    """Free the slots of keys no block holds and no ghost list (rows ``ghost_rows`` of the
    array policy's ``ist``, -1 when absent) names; their rows ``clear_rows`` are zeroed for
    the next key. Returns how many slots are free."""
    chains, sc, ktab, sfree = state[5], state[23], state[24], state[26]
    held = chains[0, : state[25].shape[0]] >= 0
    return sweep_keys(ktab, sfree, sc, 4, held, ist, ghost_rows, clear_rows, _NO_ROWS)


_NO_ROWS = np.zeros(0, np.int64)


def widen_state(state: BlockState, nlists: int) -> BlockState:
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
@jit(nrt=False)
def _kfree(ktab: I64, skey: I64, sfree: I64, sc: I64, s: int) -> None:
    """Give slot s back: delete its key, shifting the rest of its probe run back."""
    mask = ktab.shape[0] - 1
    j = kcell(ktab, skey[s])
    ktab[j, 1] = -1
    sfree[sc[4]] = s
    sc[4] += 1
    i = j
    while True:
        i = (i + 1) & mask
        if ktab[i, 1] < 0:
            return
        h = khash(ktab[i, 0], mask)
        if (h <= j or h > i) if j <= i else (h <= j and h > i):
            ktab[j, 0] = ktab[i, 0]
            ktab[j, 1] = ktab[i, 1]
            ktab[i, 1] = -1
            j = i


# One request's operations on the state, shared by the replay kernel (which runs them in
# sequence per request) and the engine kernel (:mod:`prefixlab.runner.engine._kernel`,
# which interleaves them across running requests). ``pp`` is the policy's arguments:
# (code, sort-key columns, signs, occ_start, occ_req, array-policy code, generator, aux,
# park: the lru / fifo queue parks pinned copies, see ``policies._segments``).
# The counters live in ``sc``: order, empty blocks, cached free, evictions.
@jit(inline=True)
def match_blocks(state: BlockState, keys: I64, k0: int, nl: int, blocks: I64) -> int:
    """Longest run of keys[k0:k0 + nl] with a holder (the first registered one): the
    holders go to blocks[:h]; returns h."""
    chains, ktab = state[5], state[24]
    raw = ktab.shape[0] > 1  # keys are raw: map them to slots through ktab
    h = 0
    while h < nl:
        if raw:
            s = ktab[kcell(ktab, keys[k0 + h]), 1]
            if s < 0:
                break
            b = chains[0, s]
        else:
            b = chains[0, keys[k0 + h]]
        if b < 0:
            break
        blocks[h] = b
        h += 1
    return h


@jit(inline=True)
def num_hit_free(state: BlockState, blocks: I64, h: int) -> int:
    """How many of the hit blocks blocks[:h] are evictable (a hit takes them out)."""
    ref = state[3]
    n = 0
    for i in range(h):
        if ref[blocks[i]] == 0:
            n += 1
    return n


@jit(nrt=False)
def pin_hits(
    state: BlockState, blocks: I64, h: int, now: float, pp: PolicyArgs, ist: I64, fst: F64
) -> None:
    """Pin the hit blocks blocks[:h]: each is an access; an evictable one leaves the pool."""
    bl, bht, ref, bkey, stamp, qb = state[0], state[1], state[3], state[4], state[6], state[7]
    qs, qstate, la, nhits, depth = state[8], state[9], state[11], state[12], state[13]
    flag, sst, sc, pk = state[20], state[21], state[23], state[27]
    policy, acode, rng, aux = pp[0], pp[5], pp[6], pp[7]
    track = policy in (KEYED, LFU_LISTS, MRU_STACK)
    for i in range(h):
        b = blocks[i]
        if policy == LRU:  # a hit is an access
            sq_push(qb, qs, stamp, qstate, b)
            pk[b] = 0
        elif policy == SIEVE:
            sieve_access(flag, b)
        elif policy == ARRAY:  # a hit; on an evictable block it pins it too
            hook(acode, ist, fst, HIT_FREE if ref[b] == 0 else ACCESS, b, -1, bkey, depth, rng, aux)
        if ref[b] == 0:  # it leaves the evictable pool
            if policy == VLLM:  # touch takes it out of the free queue
                stamp[b] = -1
            # keyed: the block stays in the heap with its old key; a pop that meets a
            # pinned block drops it, its release re-keys it (one heap step, not two)
            elif policy == SIEVE:
                sieve_pinned(flag, sst, b)
            elif policy in (LFU_LISTS, MRU_STACK):
                _l_unlink(bl, bht, b)
            sc[2] -= 1
        ref[b] += 1
        if track:
            la[b] = now
            nhits[b] += 1


@jit(nrt=False)
def announce_misses(
    state: BlockState, keys: I64, k0: int, h: int, nk: int, pp: PolicyArgs, ist: I64, fst: F64
) -> None:
    """An array-state policy hears the keys keys[k0 + h:k0 + nk] the request will cache
    but missed, before any eviction (raw keys get their slots here)."""
    bkey, depth, sc, ktab, skey, sfree = (
        state[4],
        state[13],
        state[23],
        state[24],
        state[25],
        state[26],
    )
    if pp[0] != ARRAY or nk <= h:
        return
    raw = ktab.shape[0] > 1
    acode, rng, aux = pp[5], pp[6], pp[7]
    miss_begin(acode, ist)
    for j in range(h, nk):
        k = kslot(ktab, skey, sfree, sc, 4, keys[k0 + j]) if raw else keys[k0 + j]
        hook(acode, ist, fst, MISS, k, -1, bkey, depth, rng, aux)


@jit(nrt=False)
def take_blocks(
    state: BlockState,
    need: int,
    blocks: I64,
    off: int,
    r: int,
    pp: PolicyArgs,
    ist: I64,
    fst: F64,
    victims: I64,
) -> None:
    """Pin ``need`` new blocks into blocks[off:]: empty ones first (the top of the stack),
    then the policy's victims, whose keys are dropped (the caller knows they exist)."""
    ref, empty, sc = state[3], state[22], state[23]
    n_empty = sc[1]
    take = min(need, n_empty)
    for j in range(take):
        n_empty -= 1
        blocks[off + j] = empty[n_empty]
    sc[1] = n_empty
    nv = need - take
    if nv > 0:
        _evict(nv, state, victims, r, pp, ist, fst)
        for j in range(nv):
            blocks[off + take + j] = victims[j]
        sc[2] -= nv
        sc[3] += nv
    for j in range(need):
        ref[blocks[off + j]] = 1


@jit(nrt=False)
def commit_blocks(
    state: BlockState,
    blocks: I64,
    keys: I64,
    k0: int,
    lo_: int,
    hi: int,
    now: float,
    pp: PolicyArgs,
    ist: I64,
    fst: F64,
) -> None:
    """Blocks blocks[lo_:hi] get the keys keys[k0 + lo_:k0 + hi], each appended to its
    key's holders."""
    bkey, chains, stamp, qb, qs, qstate = state[4], state[5], state[6], state[7], state[8], state[9]
    primary, la, nhits, depth, created = state[10], state[11], state[12], state[13], state[14]
    link, flag, sst, sc, ktab, skey, sfree = (
        state[19],
        state[20],
        state[21],
        state[23],
        state[24],
        state[25],
        state[26],
    )
    policy, acode, rng, aux = pp[0], pp[5], pp[6], pp[7]
    raw = ktab.shape[0] > 1
    track = policy in (KEYED, LFU_LISTS, MRU_STACK)
    for j in range(lo_, hi):
        b = blocks[j]
        k = kslot(ktab, skey, sfree, sc, 4, keys[k0 + j]) if raw else keys[k0 + j]
        bkey[b] = k
        primary[b] = chains[0, k] < 0
        _chain_append(chains, b, k)
        depth[b] = j
        if track:
            created[b] = now
            la[b] = now
            nhits[b] = 0
        elif policy == SIEVE:
            sieve_insert(link, flag, sst, b)
        elif policy == ARRAY:
            hook(acode, ist, fst, INSERT, b, -1, bkey, depth, rng, aux)
        elif policy != VLLM:  # lru / fifo: an insertion
            sq_push(qb, qs, stamp, qstate, b)


@jit(nrt=False)
def release_blocks(
    state: BlockState,
    blocks: I64,
    nh: int,
    r: int,
    nu_pos: F64,
    k0: int,
    max_free: int,
    pp: PolicyArgs,
    ist: I64,
    fst: F64,
    released: I64,
    victims: I64,
) -> None:
    """Unpin blocks[:nh], tail first: keyed ones become evictable (``nu_pos[k0 + i]``: a
    keyed policy's next use of position i, when known), keyless ones go back on top of
    the empty stack; then the cached-free pool is trimmed to ``max_free`` (-1: no bound),
    its victims emptied on top of those."""
    bl, bht, lo, ref, bkey, stamp, qb = (
        state[0],
        state[1],
        state[2],
        state[3],
        state[4],
        state[6],
        state[7],
    )
    qs, qstate, primary, la, nhits, depth = (
        state[8],
        state[9],
        state[10],
        state[11],
        state[12],
        state[13],
    )
    created, hk, he, hpos, hn, flag, sst = (
        state[14],
        state[15],
        state[16],
        state[17],
        state[18],
        state[20],
        state[21],
    )
    empty, sc, pk, hst, hid, kbuf = state[22], state[23], state[27], state[28], state[29], state[30]
    policy, cols, signs, occ_start, occ_req, acode, rng, aux, park = pp
    n_rel = 0
    n_mru = 0
    for i in range(nh - 1, -1, -1):
        b = blocks[i]
        ref[b] -= 1
        if ref[b] != 0:
            continue
        if bkey[b] < 0:
            released[n_rel] = b
            n_rel += 1
            continue
        sc[2] += 1
        if policy == VLLM:
            sq_push(qb, qs, stamp, qstate, b)
        elif policy == KEYED:
            nu = nu_pos[k0 + i] if nu_pos.shape[0] else np.nan
            if nu == nu and occ_start.shape[0] <= 1:  # streamed: note the key's next use
                state[5][4, bkey[b]] = _noted(nu)
            entry_key(
                cols,
                signs,
                b,
                la,
                nhits,
                depth,
                created,
                primary,
                bkey,
                occ_start,
                occ_req,
                r,
                kbuf,
                nu,
            )
            heap_set(hk, he, hpos, hn, b, kbuf[0], kbuf[1], kbuf[2], float(sc[0]))
            sc[0] += 1
        elif policy == SIEVE:
            sieve_evictable(flag, sst, b)
        elif policy == ARRAY:
            hook(acode, ist, fst, EVICTABLE, b, -1, bkey, depth, rng, aux)
        elif policy == LFU_LISTS:
            _l_append(bl, bht, nhits[b], b)
            lo[0] = min(lo[0], nhits[b])
        elif policy == MRU_STACK:
            victims[n_mru] = b  # appended below, shallowest first
            n_mru += 1
        elif park:  # lru / fifo under the engine: a parked block competes again
            sq_unpark(stamp, pk, hst, hid, qstate, b)
    for i in range(n_mru - 1, -1, -1):
        _l_append(bl, bht, 0, victims[i])
    _push_empty(empty, sc, released, n_rel)  # prepend_n: the first released ends on top
    # ---- bound on the cached-free pool: trimmed blocks become empty, on top
    if max_free >= 0 and sc[2] > max_free:
        nv = sc[2] - max_free
        _evict(nv, state, victims, r, pp, ist, fst)
        sc[2] -= nv
        sc[3] += nv
        _push_empty(empty, sc, victims, nv)


@jit(inline=True)
def _push_empty(empty: I64, sc: I64, blocks: I64, n: int) -> None:
    """Put blocks[:n] on the empty stack, blocks[0] on top (vLLM's prepend_n)."""
    for i in range(n - 1, -1, -1):
        empty[sc[1]] = blocks[i]
        sc[1] += 1


@jit(nogil=True)
def block_kernel(
    state: BlockState,
    keys: I64,
    key_offsets: I64,
    num_lookup: I64,
    lookup_end: I64,
    held: I64,
    r0: int,
    capacity: int,
    block_tokens: int,
    policy: int,
    max_free: int,
    cols: I64,
    signs: F64,
    occ_start: I64,
    occ_req: I64,
    nu_pos: F64,
    ist: I64,
    fst: F64,
    acode: int,
    rng: np.random.Generator,
    aux: F64,
    hit_tokens: I64,
    hit_blocks: I64,
    out: I64,
) -> tuple[I64, F64]:
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
    sc = state[23]
    array = policy == ARRAY
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
            if aux.shape[1] > r - ist[SC, ABASE]:
                fst[FS, NOW] = aux[0, r - ist[SC, ABASE]]
        pp = (policy, cols, signs, occ_start, occ_req, acode, rng, aux, False)
        h = match_blocks(state, keys, k0, nl, blocks)
        hit_blocks[i_r] = h
        hit_tokens[i_r] = lookup_end[i_r] if h == nl else h * block_tokens
        # ---- acquire (nothing changes if it cannot fit)
        need = nh - h
        if need > sc[1] + sc[2] - num_hit_free(state, blocks, h):
            out[1] = r
            break
        pin_hits(state, blocks, h, now, pp, ist, fst)
        announce_misses(state, keys, k0, h, nk, pp, ist, fst)
        if policy == KEYED and nu_pos.shape[0] and occ_start.shape[0] <= 1:
            note_next_uses(state, keys, k0, h, nl, nu_pos)
        take_blocks(state, need, blocks, h, r, pp, ist, fst, victims)
        commit_blocks(state, blocks, keys, k0, h, nk, now, pp, ist, fst)
        release_blocks(state, blocks, nh, r, nu_pos, k0, max_free, pp, ist, fst, released, victims)
    out[0] = sc[3]
    return ist, fst


@jit(nrt=False)
def _evict(
    n: int, state: BlockState, victims: I64, r: int, pp: PolicyArgs, ist: I64, fst: F64
) -> None:
    """Choose n victims (the caller knows they exist), then drop their keys in order (raw
    keys: a key left with no holder leaves the table and gives its slot back)."""
    (
        bl,
        bht,
        lo,
        ref,
        bkey,
        chains,
        stamp,
        qb,
        qs,
        qstate,
        primary,
        la,
        nhits,
        depth,
        created,
        hk,
        he,
        hpos,
        hn,
        link,
        flag,
        sst,
        _empty,
        sc,
        ktab,
        skey,
        sfree,
        pk,
        hst,
        hid,
        kbuf,
    ) = state
    policy, cols, signs, occ_start, occ_req, acode, rng, aux, park = pp
    batch = policy == ARRAY and acode == UNICACHE and ist[SC, UCOPT] == 1
    if batch:  # unicache-opt chooses its n victims together (its set-aside blocks)
        uc_evict_opt(ist, fst, depth, bkey, victims, n)
    for j in range(0 if batch else n):
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
        elif park:
            victims[j] = sq_pop_parked(qb, qs, stamp, ref, True, qstate, pk, hst, hid)
        else:  # under replay only the request's own hits are pinned: walk past them
            victims[j] = sq_pop(qb, qs, stamp, ref, True, qstate)
    raw = ktab.shape[0] > 1
    for j in range(n):
        k = bkey[victims[j]]
        up = _drop_key(victims[j], bkey, chains, primary)
        if raw and policy != ARRAY and chains[0, k] < 0:  # (ghosts: sweep_slots frees)
            _kfree(ktab, skey, sfree, sc, k)
        if up >= 0 and policy == KEYED and hpos[up] >= 0 and ref[up] == 0:  # on_update
            nu = np.nan  # next use after r: from the occurrence lists, or streamed, noted
            if occ_start.shape[0] <= 1:
                nu = np.inf if chains[4, k] == NOTED_NEVER else float(chains[4, k])
            entry_key(
                cols,
                signs,
                up,
                la,
                nhits,
                depth,
                created,
                primary,
                bkey,
                occ_start,
                occ_req,
                r,
                kbuf,
                nu,
            )
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
        engine: bool = False,
    ) -> None:
        code = engine_code(policy) if engine else kernel_code(policy)
        #: park pinned queue copies (the engine pins much of the cache; see _segments)
        self.engine = engine
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

    def policy_args(self) -> PolicyArgs:
        """The policy's arguments to the per-operation functions (``pp``)."""
        return (
            self.code,
            self.cols,
            self.signs,
            self.occ_start,
            self.occ_req,
            self.acode,
            self.rng,
            self.aux,
            self.engine,
        )

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
        """Replay requests r0, r0 + 1, ... (the rows of ``key_offsets``) from the state."""
        st = block_kernel(
            self.state,
            keys,
            key_offsets,
            num_lookup,
            lookup_end,
            held,
            r0,
            self.capacity,
            self.block_tokens,
            self.code,
            -1 if max_free_blocks is None else max_free_blocks,
            self.cols,
            self.signs,
            self.occ_start,
            self.occ_req,
            self.nu_pos,
            self.ist,
            self.fst,
            self.acode,
            self.rng,
            self.aux,
            hit_tokens,
            hit_blocks,
            out,
        )
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
    prep.run(
        keys,
        key_offsets,
        num_lookup,
        lookup_end,
        held,
        0,
        max_free_blocks,
        hit_tokens,
        hit_blocks,
        out,
    )
    return hit_tokens, hit_blocks, int(out[0]), int(out[1])


def warm_up() -> None:
    """Compile (or load the cached compilation) outside any timed region."""
    from prefixlab.policies.vllm import VLLM as VLLMPolicy

    one = np.zeros(1, np.int64)
    offs = np.array([0, 1], np.int64)
    replay_fast(one, offs, one, one, np.ones(1, np.int64), 2, 1, 16, VLLMPolicy(), None)
