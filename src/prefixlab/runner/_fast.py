"""Compiled sequential replay of the block cache for ``vllm``, ``lru`` and ``fifo``.

The generic path (cache + policy hooks, numpy per request) is the reference; this kernel
fuses match -> acquire -> commit -> release for the whole trace in one numba call, with the
structures of the generic path: a queue with lazy invalidation for the policy order, a chain
of holders per key (registration order; the head is the one a lookup takes), and a stack of
empty blocks whose top is reused first. Tests check that it gives exactly the generic
path's per-request hits and eviction counts. It is used only when numba is installed (the
``fast`` extra) and the replay needs no extra observers or invariant checks.

    queue (vllm: released blocks; lru: inserted or hit; fifo: inserted)
    head -> b7 b3 b7' b9 <- tail    b7's first copy is stale (its stamp moved on);
                                    evict: the first valid copy with ref == 0
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import numpy.typing as npt

#: numba is imported (and the kernel compiled or loaded from its cache) on first use only
HAVE_NUMBA = importlib.util.find_spec("numba") is not None

I64 = npt.NDArray[np.int64]
POLICY_CODES = {"vllm": 0, "lru": 1, "fifo": 2}


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


def _list_append(b: int, prev: Any, nxt: Any, ends: Any) -> None:
    prev[b] = ends[1]
    nxt[b] = -1
    if ends[1] >= 0:
        nxt[ends[1]] = b
    else:
        ends[0] = b
    ends[1] = b


def _q_push(b: int, qb: Any, qs: Any, stamp: Any, qstate: Any) -> None:
    """Append b with a fresh stamp; older copies of b become stale."""
    if qstate[1] == qb.shape[0]:
        w = 0  # compact: keep only valid copies, in order
        for i in range(qstate[0], qstate[1]):
            if qs[i] == stamp[qb[i]]:
                qb[w] = qb[i]
                qs[w] = qs[i]
                w += 1
        qstate[0] = 0
        qstate[1] = w
    t = qstate[1]
    qb[t] = b
    qs[t] = qstate[2]
    stamp[b] = qstate[2]
    qstate[1] = t + 1
    qstate[2] += 1


def _q_pop_unpinned(qb: Any, qs: Any, stamp: Any, ref: Any, qstate: Any) -> int:
    """The oldest valid copy of an unpinned block (the caller knows one exists)."""
    i = qstate[0]
    advance = True
    while True:
        b = qb[i]
        if qs[i] == stamp[b]:
            if ref[b] == 0:
                stamp[b] = -1
                if advance:
                    qstate[0] = i + 1
                return int(b)
            advance = False  # a valid pinned copy keeps its place at the front
        elif advance:
            qstate[0] = i + 1
        i += 1


def _evict_one(qb: Any, qs: Any, stamp: Any, ref: Any, qstate: Any, bkey: Any, chains: Any) -> int:
    """Take the policy's victim and drop its key from its holder chain."""
    b = _q_pop_unpinned(qb, qs, stamp, ref, qstate)
    # Row k of chains[0:2] is the key's (first, last) holder; rows 2, 3 link the holders.
    _list_remove(b, chains[2], chains[3], chains[0:2, bkey[b]])
    bkey[b] = -1
    return b


def _kernel(
    keys: Any,
    key_offsets: Any,
    num_lookup: Any,
    lookup_end: Any,
    held: Any,
    capacity: int,
    num_keys: int,
    block_tokens: int,
    policy: int,
    max_free: int,
    hit_tokens: Any,
    hit_blocks: Any,
    out: Any,
) -> None:
    """out[0] = evictions, out[1] = the request that could not fit (or -1).

    The policy order is a queue with lazy invalidation (as ``SegmentQueue``): vllm queues a
    block when it is released and invalidates it when a hit takes it; lru queues on insert
    and on every hit; fifo on insert only. The victim is the oldest valid unpinned copy.
    """
    ref = np.zeros(capacity, np.int64)
    bkey = np.full(capacity, -1, np.int64)
    chains = np.full((4, max(num_keys, capacity)), -1, np.int64)
    stamp = np.full(capacity, -1, np.int64)
    qb = np.empty(4 * capacity + 64, np.int64)
    qs = np.empty(4 * capacity + 64, np.int64)
    qstate = np.zeros(3, np.int64)  # head, tail, next stamp
    empty = np.arange(capacity - 1, -1, -1).astype(np.int64)
    n_empty = capacity
    cached_free = 0
    evictions = 0
    blocks = np.empty(max(int(held.max()), 1), np.int64)
    released = np.empty(blocks.shape[0], np.int64)
    out[1] = -1
    for r in range(key_offsets.shape[0] - 1):
        k0 = key_offsets[r]
        nk = key_offsets[r + 1] - k0
        nl = num_lookup[r]
        nh = held[r]
        # ---- match: longest run of keys with a holder (the first registered one)
        h = 0
        while h < nl:
            b = chains[0, keys[k0 + h]]
            if b < 0:
                break
            blocks[h] = b
            h += 1
        hit_blocks[r] = h
        hit_tokens[r] = lookup_end[r] if h == nl else h * block_tokens
        # ---- acquire (nothing changes if it cannot fit)
        need = nh - h
        hit_free = 0
        for i in range(h):
            if ref[blocks[i]] == 0:
                hit_free += 1
        if need > n_empty + cached_free - hit_free:
            out[0] = evictions
            out[1] = r
            return
        for i in range(h):
            b = blocks[i]
            if policy == 1:  # lru: a hit is an access
                _q_push(b, qb, qs, stamp, qstate)
            elif policy == 0 and ref[b] == 0:  # vllm: touch takes it out of the free queue
                stamp[b] = -1
            if ref[b] == 0:
                cached_free -= 1
            ref[b] += 1
        for j in range(need):
            if n_empty > 0:
                n_empty -= 1
                b = empty[n_empty]
            else:
                b = _evict_one(qb, qs, stamp, ref, qstate, bkey, chains)
                cached_free -= 1
                evictions += 1
            ref[b] = 1
            blocks[h + j] = b
        # ---- commit: new full blocks get their keys, appended to the key's holders
        for j in range(h, nk):
            b = blocks[j]
            k = keys[k0 + j]
            bkey[b] = k
            _list_append(b, chains[2], chains[3], chains[0:2, k])
            if policy != 0:  # lru / fifo: an insertion
                _q_push(b, qb, qs, stamp, qstate)
        # ---- release, tail first; keyless blocks go back on top of the empty stack
        n_rel = 0
        for i in range(nh - 1, -1, -1):
            b = blocks[i]
            ref[b] -= 1
            if ref[b] == 0:
                if bkey[b] >= 0:
                    cached_free += 1
                    if policy == 0:
                        _q_push(b, qb, qs, stamp, qstate)
                else:
                    released[n_rel] = b
                    n_rel += 1
        # ---- bound on the cached-free pool: trimmed blocks become empty
        while max_free >= 0 and cached_free > max_free:
            released[n_rel] = _evict_one(qb, qs, stamp, ref, qstate, bkey, chains)
            n_rel += 1
            cached_free -= 1
            evictions += 1
        for i in range(n_rel - 1, -1, -1):  # prepend_n: the first released ends on top
            empty[n_empty] = released[i]
            n_empty += 1
    out[0] = evictions


_compiled: Any = None


def _kernel_compiled() -> Any:
    """The jitted kernel. Its helpers are jitted in place first: numba resolves the
    kernel's globals when it compiles, on the first call."""
    global _compiled
    if _compiled is None:
        from numba import njit

        g = globals()
        for name in ("_list_remove", "_list_append", "_q_push", "_q_pop_unpinned", "_evict_one"):
            g[name] = njit(cache=True, inline="always")(g[name])
        _compiled = njit(cache=True)(_kernel)
    return _compiled


def replay_fast(
    keys: I64,
    key_offsets: I64,
    num_lookup: I64,
    lookup_end: I64,
    held: I64,
    capacity: int,
    num_keys: int,
    block_tokens: int,
    policy: str,
    max_free_blocks: int | None,
) -> tuple[I64, I64, int, int]:
    """Run the kernel; returns (hit_tokens, hit_blocks, num_evictions, failed_request)."""
    kernel = _kernel_compiled()
    n = int(key_offsets.shape[0]) - 1
    hit_tokens = np.zeros(n, np.int64)
    hit_blocks = np.zeros(n, np.int64)
    out = np.zeros(2, np.int64)
    kernel(
        keys, key_offsets, num_lookup, lookup_end, held, capacity, max(num_keys, 1),
        block_tokens, POLICY_CODES[policy], -1 if max_free_blocks is None else max_free_blocks,
        hit_tokens, hit_blocks, out,
    )  # fmt: skip
    return hit_tokens, hit_blocks, int(out[0]), int(out[1])


def warm_up() -> None:
    """Compile (or load the cached compilation) outside any timed region."""
    one = np.zeros(1, np.int64)
    offs = np.array([0, 1], np.int64)
    replay_fast(one, offs, one, one, np.ones(1, np.int64), 2, 1, 16, "vllm", None)
