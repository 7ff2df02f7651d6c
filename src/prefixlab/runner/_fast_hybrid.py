"""Compiled replay of the hybrid (KV + SSM state) cache, for the built-in hybrid policies.

The same tree, clock and counters as :class:`prefixlab.cache.hybrid.HybridCache` (its
docstring has the rules), in arrays, for a range of requests per call:

* a node is a slot: its edge covers positions ``[start, end)`` of the token sequence it was
  stored from, found at ``values[base + p]`` (a split keeps the base, a merge takes the
  child's, whose sequence passed through the merged edge: nothing is ever copied);
* children are found through one open-addressing table keyed by (parent slot, first token)
  (``runner/_pairs.py``);
  ``sseq`` numbers a child's place among its siblings as a Python dict orders its keys
  (a split or a merge puts the new node in the old one's place), which is what the
  depth-first pre-order of Marconi's tie-break reads;
* node ids are the object cache's (one counter, never reused); slots are reused.

Admission (``all-blocks``, ``judicious``, ``none``), the locks, the sizing and the stamps
follow the cache and the policy classes call for call. Eviction runs the policies' own
rules: :func:`prefixlab.policies.hybrid.lru_leaf_key` orders LRU's leaves and
:func:`prefixlab.policies.hybrid.marconi_scores` scores Marconi's candidates (with
:func:`~prefixlab.policies.hybrid.node_efficiency`), the functions the policy classes use
on the object tree.

The kernel stops (``status``) when it needs the caller: the slot arrays are full
(:func:`grow` and call again), or Marconi's tuner must run before the next insertion
(the runner tunes alpha and calls again; the request's lookup is kept in the state).
``tests/test_hybrid_fast.py`` checks every counter and per-request hit against the object
cache for every policy and option.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from prefixlab._jit import jit, objmode
from prefixlab.model.spec import ModelSpec
from prefixlab.policies.admission import CODES, AllBlocks, Judicious, NoAdmission
from prefixlab.policies.base import registered
from prefixlab.policies.hybrid import (
    EFFICIENCIES,
    RECENCIES,
    HybridPolicy,
    Marconi,
    VllmPlus,
    marconi_scores,
    node_efficiency,
)
from prefixlab.runner._pairs import pair_find, pair_unmap
from prefixlab.types import B1, F64, I64

#: the nodes by slot (N): nid, par, base, start, end, ckpt, la, lock, nch, fc, nx, pv, sseq,
#: then the stack of free slots
Nodes = tuple[I64, I64, I64, I64, I64, B1, F64, I64, I64, I64, I64, I64, I64, I64]
#: the (parent, first token) -> child table (T): parents, tokens, children
Children = tuple[I64, I64, I64]
#: the eviction's work arrays (W): Marconi's candidates, recencies, efficiencies, unlocked
#: flags, scores; the LRU heap's keys and ids
Work = tuple[I64, F64, F64, B1, F64, F64, I64]
#: a request's match scratch (mi): path, res, ck, held, heldid, the input's path and res
Scratch = tuple[I64, I64, I64, I64, I64, I64, I64]
#: the engine's hybrid cache (H, see the engine section below)
HybridArrays = tuple[I64, I64, I64, I64, F64, I64, Scratch, I64, F64, Nodes, Children, Work]

# config (cfg) fields
(
    C_ADMISSION,
    C_BLOCK,
    C_PARTIAL,
    C_SIZING,
    C_CHUNK,
    C_BRANCH,
    C_LOCKS,
    C_STATE,
    C_KV,
    C_STATEB,
    C_CAPACITY,
    C_EVICT,
    C_TOUCH,
    C_TOUCH_PARTIAL,
    C_RECENCY,
    C_EFF,
    C_TUNES,
) = range(17)
#: the admission codes (prefixlab.policies.admission.CODES)
ADM_NONE, ADM_BLOCKS, ADM_JUDICIOUS = CODES["none"], CODES["all-blocks"], CODES["judicious"]
#: the admissions the compiled replay carries (a subclass runs on the object tree)
_ADMISSIONS = (NoAdmission, AllBlocks, Judicious)
EV_LRU, EV_MARCONI = 0, 1
T_PATH, T_FULL_BLOCKS, T_REUSED = 0, 1, 2  # path (+partial), vllm+'s full blocks, marconi's node
# scalar state (st) fields
(
    S_USED,
    S_CLOCK,
    S_NEXT_ID,
    S_WRITTEN,
    S_EVICTED,
    S_EVICTED_NODES,
    S_MERGES,
    S_CKPT_WRITTEN,
    S_REJECTED,
    S_EVICT_CALLS,
    S_NFREE,
    S_SSEQ,
    S_NODES,
    S_PEAK,
    S_CKPTS,
    S_NEXT,
    S_PHASE,
    S_TUNE_AT,
    S_PIN_TOKENS,
    S_PIN_CKPTS,
    S_HWM,
) = range(21)
#: S_PIN_TOKENS, S_PIN_CKPTS: the tokens and the checkpoints of the locked nodes (the bytes
#: the engine's budget cannot free), kept as nodes are locked, split, merged, checkpointed;
#: S_HWM: one past the highest slot ever used (an eviction's scans stop there)
ST_DONE, ST_GROW, ST_TUNE = 0, 1, 2
# a match (res) fields: path length, partial slot, partial length, matched, reusable, node
M_NPATH, M_PARTIAL, M_PLEN, M_MATCHED, M_REUSABLE, M_REUSE = range(6)
ROOT = 0


# ----------------------------------------------------------------------------- children
@jit(nrt=False)
def _child(N: Nodes, T: Children, node: int, token: int) -> int:
    tp, tk, tv = T
    return int(tv[pair_find(tp, tk, tv, node, token)])


@jit(nrt=False)
def _set_child(N: Nodes, T: Children, node: int, token: int, child: int) -> None:
    """children[token] = child: a new key joins the sibling list; an existing one is
    replaced in place (its sibling-order number passes to the new child)."""
    tp, tk, tv = T
    par, nch, fc, nx, pv, sseq = N[1], N[8], N[9], N[10], N[11], N[12]
    s = pair_find(tp, tk, tv, node, token)
    old = tv[s]
    tp[s], tk[s], tv[s] = node, token, child
    par[child] = node
    if old >= 0:
        if old == child:
            return
        _link_replace(fc, nx, pv, node, old, child)
        sseq[child] = sseq[old]
        return
    nx[child] = fc[node]
    pv[child] = -1
    if fc[node] >= 0:
        pv[fc[node]] = child
    fc[node] = child
    nch[node] += 1


@jit(nrt=False)
def _link_replace(fc: I64, nx: I64, pv: I64, node: int, old: int, new: int) -> None:
    nx[new], pv[new] = nx[old], pv[old]
    if pv[old] >= 0:
        nx[pv[old]] = new
    else:
        fc[node] = new
    if nx[old] >= 0:
        pv[nx[old]] = new


@jit(nrt=False)
def _del_child(N: Nodes, T: Children, node: int, token: int, child: int) -> None:
    tp, tk, tv = T
    nch, fc, nx, pv = N[8], N[9], N[10], N[11]
    pair_unmap(tp, tk, tv, node, token)
    if pv[child] >= 0:
        nx[pv[child]] = nx[child]
    else:
        fc[node] = nx[child]
    if nx[child] >= 0:
        pv[nx[child]] = pv[child]
    nch[node] -= 1


# ----------------------------------------------------------------------------- nodes
# N = (nid, par, base, start, end, ckpt, la, lock, nch, fc, nx, pv, sseq, free)
@jit(nrt=False)
def _alloc(N: Nodes, st: I64, base: int, start: int, end: int, la: float) -> int:
    nid, free = N[0], N[13]
    st[S_NFREE] -= 1
    s = int(free[st[S_NFREE]])
    if s >= st[S_HWM]:
        st[S_HWM] = s + 1
    nid[s] = st[S_NEXT_ID]
    st[S_NEXT_ID] += 1
    N[2][s], N[3][s], N[4][s] = base, start, end
    N[5][s] = False
    N[6][s] = la
    N[7][s] = 0
    N[8][s] = 0
    N[9][s] = -1
    N[12][s] = st[S_SSEQ]
    st[S_SSEQ] += 1
    st[S_NODES] += 1
    return s


@jit(nrt=False)
def _lock(N: Nodes, st: I64, s: int) -> None:
    if N[7][s] == 0:
        st[S_PIN_TOKENS] += N[4][s] - N[3][s]
        st[S_PIN_CKPTS] += N[5][s]
    N[7][s] += 1


@jit(nrt=False)
def _unlock(N: Nodes, st: I64, s: int) -> None:
    N[7][s] -= 1
    if N[7][s] == 0:
        st[S_PIN_TOKENS] -= N[4][s] - N[3][s]
        st[S_PIN_CKPTS] -= N[5][s]


@jit(nrt=False)
def _release(N: Nodes, st: I64, s: int) -> None:
    N[0][s] = -1
    N[1][s] = -1
    N[13][st[S_NFREE]] = s
    st[S_NFREE] += 1
    st[S_NODES] -= 1


@jit(inline=True)
def _token(values: I64, N: Nodes, s: int, p: int) -> int:
    """The token at position p of node s's edge."""
    return int(values[N[2][s] + p])


# ----------------------------------------------------------------------------- match
@jit(nrt=False)
def _match(
    values: I64,
    o: int,
    n: int,
    N: Nodes,
    T: Children,
    has_state: bool,
    path: I64,
    res: I64,
    npath: int,
) -> None:
    """HybridCache.match of values[o:o + n]: the path into ``path``, the rest into ``res``.

    ``path[:npath]`` may hold nodes already known to match (a lookup's path, the tree
    unchanged since): the walk resumes after those of them that end within n tokens."""
    end, ckpt = N[4], N[5]
    while npath and end[path[npath - 1]] > n:
        npath -= 1
    reusable, reuse = 0, -1
    for j in range(npath):
        if ckpt[path[j]] or not has_state:
            reusable, reuse = end[path[j]], path[j]
    node = path[npath - 1] if npath else ROOT
    pos = end[node]
    partial, plen = -1, 0
    while pos < n:
        child = _child(N, T, node, values[o + pos])
        if child < 0:
            break
        b = N[2][child]
        elen = end[child] - N[3][child]
        span = min(elen, n - pos)
        m = 1
        while m < span and values[b + pos + m] == values[o + pos + m]:
            m += 1
        if m < elen:
            partial, plen = child, m
            break
        pos += m
        node = child
        path[npath] = child
        npath += 1
        if ckpt[child] or not has_state:
            reusable, reuse = pos, child
    matched = pos + plen
    if not has_state and plen:
        reusable, reuse = matched, partial
    res[M_NPATH], res[M_PARTIAL], res[M_PLEN] = npath, partial, plen
    res[M_MATCHED], res[M_REUSABLE], res[M_REUSE] = matched, reusable, reuse


@jit(nrt=False)
def _stored_path(values: I64, o: int, n: int, N: Nodes, T: Children, path: I64) -> int:
    """The path of a sequence stored whole (it ends at a node boundary): one child lookup
    per node, no token compared. Its length."""
    end = N[4]
    node, npath = ROOT, 0
    while end[node] < n:
        node = _child(N, T, node, values[o + end[node]])
        path[npath] = node
        npath += 1
    return npath


@jit(nrt=False)
def _touch(cfg: I64, N: Nodes, st: I64, path: I64, res: I64) -> None:
    """A lookup: tick, then stamp what the policy says the match accessed."""
    st[S_CLOCK] += 1
    now = float(st[S_CLOCK])
    la, end = N[6], N[4]
    npath, partial = res[M_NPATH], res[M_PARTIAL]
    kind = cfg[C_TOUCH]
    if kind == T_REUSED:
        if npath:
            la[path[npath - 1]] = now
    elif kind == T_FULL_BLOCKS:
        b = cfg[C_BLOCK]
        for j in range(npath):
            if end[path[j]] % b == 0:
                la[path[j]] = now
    else:
        for j in range(npath):
            la[path[j]] = now
        if partial >= 0 and (cfg[C_TOUCH_PARTIAL] or res[M_REUSE] == partial):
            la[partial] = now


# ----------------------------------------------------------------------------- admission
@jit(nrt=False)
def _checkpoints(cfg: I64, n: int, mres: I64, ck: I64) -> int:
    """HybridCache.checkpoint_positions into ``ck``: how many (ascending). ``mres``: the
    match whose divergence point is the branch (the input's or the sequence's)."""
    if cfg[C_ADMISSION] == ADM_BLOCKS:
        b = cfg[C_BLOCK]
        k = 0
        if n >= b:
            q = b
            while q <= n - n % b:
                ck[k] = q
                k += 1
                q += b
        if cfg[C_PARTIAL] and n % b:
            ck[k] = n
            k += 1
        return k
    k = 0
    if mres[M_PARTIAL] >= 0 and cfg[C_STATE]:
        q = mres[M_MATCHED]
        chunk = cfg[C_CHUNK]
        if chunk:
            q = q - q % chunk
        if q > 0:
            ck[k] = q
            k += 1
    if k == 0 or ck[0] < n:
        ck[k] = n
        k += 1
    elif ck[0] > n:  # sorted(set(...)): n first
        ck[1] = ck[0]
        ck[0] = n
        k = 2
    return k


@jit(nrt=False)
def _plan_bytes(cfg: I64, N: Nodes, n: int, path: I64, res: I64, ck: I64, nck: int) -> int:
    """HybridCache.plan_bytes: bytes the insertion adds."""
    end, ckpt = N[4], N[5]
    npath = res[M_NPATH]
    new_tokens = n - res[M_MATCHED]
    net = 0
    j = 0
    for i in range(nck):
        q = ck[i]
        while j < npath and end[path[j]] < q:
            j += 1
        if not (j < npath and end[path[j]] == q and ckpt[path[j]]):
            net += 1
    if cfg[C_ADMISSION] == ADM_BLOCKS and cfg[C_PARTIAL]:
        b = cfg[C_BLOCK]
        for j in range(npath):
            s = path[j]
            if ckpt[s] and end[s] % b and end[s] < n:
                net -= 1
    return int(new_tokens * cfg[C_KV] + net * cfg[C_STATEB])


@jit(nrt=False)
def _estimate_bytes(cfg: I64, N: Nodes, n: int, path: I64, res: I64) -> int:
    """vLLM+'s size estimate in Marconi's simulator (HybridCache._estimate_bytes)."""
    b = cfg[C_BLOCK]
    blocks = 1
    for j in range(res[M_NPATH]):
        if N[5][path[j]]:
            blocks += 1
    extra = n - b * blocks
    return int(extra / b * cfg[C_STATEB] + extra * cfg[C_KV])


@jit(nrt=False)
def _split(N: Nodes, T: Children, st: I64, values: I64, child: int, m: int) -> int:
    """Cut child's edge after m tokens; the new upper node (stamped now) is returned."""
    parent = N[1][child]
    start = N[3][child]
    upper = _alloc(N, st, N[2][child], start, start + m, float(st[S_CLOCK]))
    if N[7][child]:  # the upper node (unlocked) takes m of a locked node's tokens
        st[S_PIN_TOKENS] -= m
    _set_child(N, T, parent, _token(values, N, child, start), upper)
    N[3][child] = start + m
    _set_child(N, T, upper, _token(values, N, child, start + m), child)
    N[12][child] = st[S_SSEQ]  # the first key of the upper node's own children
    st[S_SSEQ] += 1
    return upper


@jit(nrt=False)
def _merge(N: Nodes, T: Children, st: I64, values: I64, nd: int) -> int:
    """Fold a one-child node into its child (HybridCache._merge)."""
    child = int(N[9][nd])
    parent = N[1][nd]
    tok_nd = _token(values, N, nd, N[3][nd])
    _del_child(N, T, nd, _token(values, N, child, N[3][child]), child)
    if N[7][child]:
        st[S_PIN_TOKENS] += N[4][nd] - N[3][nd]
    N[3][child] = N[3][nd]  # the child's sequence passed through nd's edge: same base
    if N[6][nd] > N[6][child]:
        N[6][child] = N[6][nd]
    _set_child(N, T, parent, tok_nd, child)
    _release(N, st, nd)
    st[S_MERGES] += 1
    return child


@jit(nrt=False)
def _normalize(cfg: I64, N: Nodes, T: Children, st: I64, values: I64, nd: int) -> int:
    """Merge nd if it has one child and no checkpoint; the child it merged into, or -1."""
    if nd == ROOT or N[7][nd] or N[5][nd] or N[8][nd] != 1 or not cfg[C_STATE]:
        return -1
    return _merge(N, T, st, values, nd)


@jit(inline=True)
def _freed_by(cfg: I64, N: Nodes, nd: int) -> int:
    ckpt = N[5][nd]
    if N[8][nd] == 0:
        return int((N[4][nd] - N[3][nd]) * cfg[C_KV] + (cfg[C_STATEB] if ckpt else 0))
    return int(cfg[C_STATEB]) if ckpt else 0


@jit(nrt=False)
def _remove(cfg: I64, N: Nodes, T: Children, st: I64, values: I64, nd: int) -> int:
    """Evict a candidate (HybridCache.remove); the node whose candidacy may have changed
    (its parent, the child it merged into, or what the parent merged into), or -1."""
    freed = _freed_by(cfg, N, nd)
    st[S_USED] -= freed
    st[S_EVICTED] += freed
    st[S_EVICTED_NODES] += 1
    if N[5][nd]:
        st[S_CKPTS] -= 1
    if N[8][nd] == 0:
        parent = N[1][nd]
        _del_child(N, T, parent, _token(values, N, nd, N[3][nd]), nd)
        _release(N, st, nd)
        if parent == ROOT:
            return -1
        merged = _normalize(cfg, N, T, st, values, parent)
        return merged if merged >= 0 else parent
    return _merge(N, T, st, values, nd)


# ----------------------------------------------------------------------------- eviction
@jit(inline=True)
def _heap_less(hk: F64, hi: I64, a: int, b: int) -> bool:
    if hk[a, 0] != hk[b, 0]:
        return bool(hk[a, 0] < hk[b, 0])
    if hk[a, 1] != hk[b, 1]:
        return bool(hk[a, 1] < hk[b, 1])
    return bool(hi[a, 0] < hi[b, 0])


@jit(nrt=False)
def _heap_push(hk: F64, hi: I64, n: int, la: float, neg_end: float, nid: int, s: int) -> int:
    hk[n, 0], hk[n, 1] = la, neg_end
    hi[n, 0], hi[n, 1] = nid, s
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if not _heap_less(hk, hi, i, p):
            break
        for c in range(2):
            hk[i, c], hk[p, c] = hk[p, c], hk[i, c]
            hi[i, c], hi[p, c] = hi[p, c], hi[i, c]
        i = p
    return n + 1


@jit(nrt=False)
def _heap_pop(hk: F64, hi: I64, n: int) -> int:
    """Move the least entry to row n - 1; the new size."""
    n -= 1
    for c in range(2):
        hk[0, c], hk[n, c] = hk[n, c], hk[0, c]
        hi[0, c], hi[n, c] = hi[n, c], hi[0, c]
    _sift_down(hk, hi, n, 0)
    return n


@jit(nrt=False)
def _sift_down(hk: F64, hi: I64, n: int, i: int) -> None:
    while True:
        a, b = 2 * i + 1, 2 * i + 2
        m = i
        if a < n and _heap_less(hk, hi, a, m):
            m = a
        if b < n and _heap_less(hk, hi, b, m):
            m = b
        if m == i:
            return
        for c in range(2):
            hk[i, c], hk[m, c] = hk[m, c], hk[i, c]
            hi[i, c], hi[m, c] = hi[m, c], hi[i, c]
        i = m


@jit(nrt=False)
def _lru_leaves(
    cfg: I64, N: Nodes, T: Children, st: I64, values: I64, need: int, hk: F64, hi: I64, hwm: int
) -> int:
    """LRU over unlocked leaves (policies.hybrid's rule: the least key
    ``lru_leaf_key``), with the stale entries a lazy heap keeps: bytes freed."""
    nid, end, la, lock, nch = N[0], N[4], N[6], N[7], N[8]
    n = 0
    for s in range(1, hwm):
        if nid[s] >= 0 and nch[s] == 0 and lock[s] == 0:
            hk[n, 0], hk[n, 1] = la[s], -float(end[s])
            hi[n, 0], hi[n, 1] = nid[s], s
            n += 1
    # a heap of them, by heapify: the keys are a strict order (a node's id decides), so it
    # pops what pushing them one by one pops (a later copy of a node's entry is the same row)
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(hk, hi, n, i)
    freed = 0
    while freed < need and n > 0:
        n = _heap_pop(hk, hi, n)
        v, s = hi[n, 0], hi[n, 1]
        if nid[s] != v or nch[s] or lock[s]:
            continue
        freed += _freed_by(cfg, N, s)
        ch = _remove(cfg, N, T, st, values, s)
        if ch >= 0 and nch[ch] == 0 and lock[ch] == 0:
            n = _heap_push(hk, hi, n, la[ch], -float(end[ch]), nid[ch], ch)
    return freed


@jit(nrt=False)
def _before(N: Nodes, a: int, b: int) -> bool:
    """a comes before b in the tree's depth-first pre-order (children in the order their
    keys were added): walk both up to their lowest common ancestor."""
    par, end, sseq = N[1], N[4], N[12]
    x, y = a, b
    lx, ly = -1, -1
    while x != y:
        if end[x] >= end[y]:
            lx, x = x, par[x]
        else:
            ly, y = y, par[y]
    if lx < 0:
        return True  # a is b's ancestor
    if ly < 0:
        return False
    return bool(sseq[lx] < sseq[ly])


@jit(nrt=False)
def _marconi_free(
    cfg: I64,
    N: Nodes,
    T: Children,
    st: I64,
    values: I64,
    need: int,
    alpha: float,
    tot: F64,
    cand: I64,
    r: F64,
    f: F64,
    ok: B1,
    score: F64,
    hwm: int,
) -> int:
    """Marconi's eviction: rescore every candidate (every node with at most one child that
    could be evicted, locked ones too), evict the least score among the unlocked ones
    (ties: the first in pre-order), until ``need`` bytes are freed.

    The candidates are gathered once per call; after each victim only the node its
    removal changed (:func:`_remove`) is updated. Every candidate is rescored per victim
    (the scores are normalised over all of them), and the victim does not depend on the
    list's order (the least score, ties to the first in pre-order)."""
    nid, ckpt, nch = N[0], N[5], N[8]
    clock = float(st[S_CLOCK])
    freed = 0
    c = 0
    for s in range(1, hwm):
        if nid[s] >= 0 and (nch[s] == 0 or (ckpt[s] and nch[s] == 1)):
            _candidate(cfg, N, tot, s, c, cand, r, f, ok)
            c += 1
    while freed < need:
        least = marconi_scores(r[:c], f[:c], ok[:c], clock, alpha, cfg[C_RECENCY], score)
        if least < 0:
            break
        at = least
        for j in range(least + 1, c):
            if ok[j] and score[j] == score[least] and _before(N, cand[j], cand[at]):
                at = j
        v = cand[at]
        freed += _freed_by(cfg, N, v)
        ch = _remove(cfg, N, T, st, values, v)
        c -= 1  # the victim leaves the list: the last entry takes its place
        cand[at], r[at], f[at], ok[at] = cand[c], r[c], f[c], ok[c]
        if ch < 0:
            continue
        k = 0
        while k < c and cand[k] != ch:
            k += 1
        if nch[ch] == 0 or (ckpt[ch] and nch[ch] == 1):
            _candidate(cfg, N, tot, ch, k, cand, r, f, ok)
            if k == c:
                c += 1
        elif k < c:
            c -= 1
            cand[k], r[k], f[k], ok[k] = cand[c], r[c], f[c], ok[c]
    return freed


@jit(inline=True)
def _candidate(
    cfg: I64, N: Nodes, tot: F64, s: int, i: int, cand: I64, r: F64, f: F64, ok: B1
) -> None:
    """Entry i of Marconi's candidate list: node s, its last access, efficiency, lock."""
    cand[i] = s
    r[i] = N[6][s]
    f[i] = node_efficiency(tot, N[3][s], N[4][s], N[5][s], cfg[C_KV], cfg[C_STATEB], cfg[C_EFF])
    ok[i] = N[7][s] == 0


# ----------------------------------------------------------------------------- insertion
@jit(nrt=False)
def _place_checkpoints(
    N: Nodes, T: Children, st: I64, values: I64, o: int, ck: I64, nck: int, sb: int
) -> None:
    """Give the nodes ending at each position of ck[:nck] (ascending) a checkpoint, splitting
    edges where needed, in one walk down the stored sequence values[o:]."""
    end, ckpt = N[4], N[5]
    node = ROOT
    for i in range(nck):
        q = ck[i]
        while end[node] < q:
            child = _child(N, T, node, values[o + end[node]])
            if end[child] > q:
                child = _split(N, T, st, values, child, q - N[3][child])
            node = child
        if not ckpt[node]:
            ckpt[node] = True
            if N[7][node]:
                st[S_PIN_CKPTS] += 1
            N[6][node] = float(st[S_CLOCK])
            st[S_USED] += sb
            st[S_WRITTEN] += sb
            st[S_CKPT_WRITTEN] += 1
            st[S_CKPTS] += 1


@jit(nrt=False)
def _insert(
    cfg: I64,
    N: Nodes,
    T: Children,
    st: I64,
    values: I64,
    o: int,
    n: int,
    ck: I64,
    nck: int,
    path: I64,
    npath: int,
) -> None:
    """HybridCache._insert; the walk starts after path[:npath] (the sequence's matched
    nodes, kept by their locks: none of them changed)."""
    node = path[npath - 1] if npath else ROOT
    pos = N[4][node]
    while pos < n:
        child = _child(N, T, node, values[o + pos])
        if child < 0:
            leaf = _alloc(N, st, o, pos, n, float(st[S_CLOCK]))
            _set_child(N, T, node, values[o + pos], leaf)
            b = (n - pos) * cfg[C_KV]
            st[S_USED] += b
            st[S_WRITTEN] += b
            break
        b0 = N[2][child]
        elen = N[4][child] - N[3][child]
        span = min(elen, n - pos)
        m = 1
        while m < span and values[b0 + pos + m] == values[o + pos + m]:
            m += 1
        if m < elen:
            child = _split(N, T, st, values, child, m)
        pos += m
        node = child
    _place_checkpoints(N, T, st, values, o, ck, nck, cfg[C_STATEB])
    if cfg[C_TOUCH] != T_REUSED:  # a path refresh stamps every node the insertion walked
        now = float(st[S_CLOCK])
        for j in range(_stored_path(values, o, n, N, T, path)):
            N[6][path[j]] = now


@jit(nrt=False)
def _fill_partial_blocks(
    cfg: I64, N: Nodes, T: Children, st: I64, values: I64, o: int, n: int, path: I64
) -> None:
    """vLLM+ with partial blocks: a stored partial block the sequence extends loses its
    state (HybridCache._fill_partial_blocks)."""
    b, sb = cfg[C_BLOCK], cfg[C_STATEB]
    for j in range(_stored_path(values, o, n, N, T, path)):
        nd = path[j]
        if N[5][nd] and N[4][nd] % b and N[4][nd] < n:
            N[5][nd] = False
            if N[7][nd]:
                st[S_PIN_CKPTS] -= 1
            st[S_CKPTS] -= 1
            st[S_USED] -= sb
            st[S_EVICTED] += sb
            if N[8][nd] == 1 and not N[7][nd]:
                _merge(N, T, st, values, nd)


@jit(nrt=False)
def _evict(
    cfg: I64,
    N: Nodes,
    T: Children,
    st: I64,
    values: I64,
    need: int,
    alpha: float,
    tot: F64,
    W: Work,
) -> None:
    """One eviction call (one tick): the policy frees ``need`` bytes if it can."""
    st[S_CLOCK] += 1
    st[S_EVICT_CALLS] += 1
    hwm = st[S_HWM]
    if cfg[C_EVICT] == EV_MARCONI and cfg[C_STATE]:
        _marconi_free(cfg, N, T, st, values, need, alpha, tot, W[0], W[1], W[2], W[3], W[4], hwm)
    else:
        _lru_leaves(cfg, N, T, st, values, need, W[5], W[6], hwm)


@jit(nrt=False)
def _admit(
    cfg: I64,
    N: Nodes,
    T: Children,
    st: I64,
    values: I64,
    o: int,
    n: int,
    alpha: float,
    tot: F64,
    W: Work,
    mi_path: I64,
    mi_res: I64,
    path: I64,
    res: I64,
    ck: I64,
    held: I64,
    heldid: I64,
) -> None:
    """HybridCache.admit of values[o:o + n] (input + output); mi_path, mi_res: the
    input's match."""
    if cfg[C_ADMISSION] == ADM_NONE:
        return
    if cfg[C_ADMISSION] == ADM_BLOCKS and not cfg[C_PARTIAL]:
        n = n - n % cfg[C_BLOCK]
    if n == 0:
        return
    has_state = cfg[C_STATE]
    st[S_CLOCK] += 1
    # the tree has not changed since the input's lookup: resume after its path
    ipath, npath = mi_path, mi_res[M_NPATH]
    for j in range(npath):
        path[j] = ipath[j]
    _match(values, o, n, N, T, has_state, path, res, npath)
    _touch(cfg, N, st, path, res)
    branch = mi_res if cfg[C_BRANCH] == 1 else res
    nck = _checkpoints(cfg, n, branch, ck)
    need = _plan_bytes(cfg, N, n, path, res, ck, nck)
    estimate = cfg[C_SIZING] == 1
    overflow = estimate or cfg[C_LOCKS] == 1
    capacity = cfg[C_CAPACITY]
    if estimate:
        need = _estimate_bytes(cfg, N, n, path, res)
    elif need > capacity:
        st[S_REJECTED] += 1
        return
    # the sequence's matched nodes: kept (locked) while it is inserted unless locks=none
    nheld = res[M_NPATH]
    for j in range(nheld):
        held[j] = path[j]
    if res[M_PARTIAL] >= 0:
        held[nheld] = res[M_PARTIAL]
        nheld += 1
    for j in range(nheld):
        heldid[j] = N[0][held[j]]
        if cfg[C_LOCKS] == 0:
            _lock(N, st, held[j])
    rejected = False
    if st[S_USED] + need > capacity:
        _evict(cfg, N, T, st, values, st[S_USED] + need - capacity, alpha, tot, W)
        if cfg[C_LOCKS] == 1 and cfg[C_BRANCH] == 0:
            # nothing was kept: the branch state goes where the sequence leaves the tree now
            _match(values, o, n, N, T, has_state, path, res, 0)
            nck = _checkpoints(cfg, n, res, ck)
    if st[S_USED] + need > capacity and not overflow:
        st[S_REJECTED] += 1
        rejected = True
    else:
        # with locks the matched path stands; without, the walk starts at the root
        _insert(
            cfg, N, T, st, values, o, n, ck, nck, path, res[M_NPATH] if cfg[C_LOCKS] == 0 else 0
        )
    for j in range(nheld):
        if cfg[C_LOCKS] == 0 and N[0][held[j]] == heldid[j]:
            _unlock(N, st, held[j])
    for j in range(nheld - 1, -1, -1):
        if N[0][held[j]] == heldid[j]:
            _normalize(cfg, N, T, st, values, held[j])
    if not rejected and cfg[C_ADMISSION] == ADM_BLOCKS and cfg[C_PARTIAL]:
        _fill_partial_blocks(cfg, N, T, st, values, o, n, path)


# ----------------------------------------------------------------------------- lookup
@jit(nrt=False)
def _reuse(
    cfg: I64, N: Nodes, T: Children, values: I64, o: int, inp: int, ipath: I64, ires: I64
) -> int:
    """HybridCache.reuse of the input values[o:o + inp] into ipath, ires (nothing stamped):
    the tokens it can reuse."""
    _match(values, o, inp, N, T, cfg[C_STATE], ipath, ires, 0)
    if not cfg[C_STATE] and cfg[C_ADMISSION] == ADM_BLOCKS:
        # vLLM+ on a Transformer: KV is reused in whole blocks
        ires[M_REUSABLE] -= ires[M_REUSABLE] % cfg[C_BLOCK]
        if ires[M_PARTIAL] >= 0 and ires[M_REUSABLE] <= ires[M_MATCHED] - ires[M_PLEN]:
            npath = ires[M_NPATH]
            ires[M_REUSE] = ipath[npath - 1] if npath and ires[M_REUSABLE] else -1
    return int(min(ires[M_REUSABLE], inp))


# ----------------------------------------------------------------------------- the loop
@jit(nogil=True)
def _kernel(
    values: I64,
    offsets: I64,
    inputs: I64,
    r_end: int,
    cfg: I64,
    alpha: float,
    mult: float,
    tot: F64,
    N: Nodes,
    T: Children,
    W: Work,
    st: I64,
    mi: Scratch,
    hits: I64,
) -> int:
    """Replay requests st[S_NEXT] .. r_end - 1 (resuming an admission when st[S_PHASE] is
    1); a status: ST_DONE, ST_GROW (too few free slots for the next request) or ST_TUNE
    (the tuner runs before request st[S_NEXT]'s insertion)."""
    path, res, ck, held, heldid = mi[0], mi[1], mi[2], mi[3], mi[4]
    ipath, ires = mi[5], mi[6]
    b = cfg[C_BLOCK]
    tlen = T[2].shape[0]
    while st[S_NEXT] < r_end:
        r = st[S_NEXT]
        o = offsets[r]
        n = offsets[r + 1] - o
        inp = inputs[r]
        if st[S_PHASE] == 0:
            # room for what one insertion can create: a leaf, a split, one per checkpoint
            bound = n // b + 4 if cfg[C_ADMISSION] == ADM_BLOCKS else 4
            if st[S_NFREE] < bound or 2 * (st[S_NODES] + bound) > tlen:
                return ST_GROW
            hits[r] = _reuse(cfg, N, T, values, o, inp, ipath, ires)
            _touch(cfg, N, st, ipath, ires)
            st[S_PHASE] = 1
            if st[S_TUNE_AT] == r + 1:
                return ST_TUNE
        _admit(cfg, N, T, st, values, o, n, alpha, tot, W, ipath, ires, path, res, ck, held, heldid)
        window_set(cfg, st, mult, r + 1)
        if st[S_USED] > st[S_PEAK]:
            st[S_PEAK] = st[S_USED]
        st[S_PHASE] = 0
        st[S_NEXT] = r + 1
    return ST_DONE


# ----------------------------------------------------------------------------- the engine's
# The engine runner's hybrid cache (runner/engine/hybrid.py's HybridEngineCache, op for op):
# the tree and the running requests' reservations under one byte budget. Its arrays, ``H``:
# (values, offsets, inputs, cfg, tot, st, mi, E, alpha, N, T, W); E's fields:
E_TOTAL, E_RESERVED, E_LOOKED, E_NEED, E_TUNER, E_EVERY = range(6)
#: hf (the float fields): the current alpha, the bootstrap multiplier
F_ALPHA, F_MULT = 0, 1


@jit(nrt=False)
def window_set(cfg: I64, st: I64, mult: float, lookups: int) -> None:
    """Tuned Marconi's bootstrap window, set once the first eviction call has happened:
    ``mult`` times the lookups made so far (the replay's requests, the engine's lookups)."""
    if cfg[C_TUNES] and st[S_TUNE_AT] < 0 and st[S_EVICT_CALLS] > 0:
        st[S_TUNE_AT] = math.ceil(mult * lookups)


@jit(nrt=False, standalone=True)
def hy_make_room(H: HybridArrays, extra: int) -> bool:
    """Evict until ``extra`` more reserved bytes fit next to the tree; if they cannot fit
    even with every unlocked node gone, evict nothing and say so."""
    values, cfg, tot, st, E, hf, N, T, W = H[0], H[3], H[4], H[5], H[7], H[8], H[9], H[10], H[11]
    over = st[S_USED] + E[E_RESERVED] + extra - E[E_TOTAL]
    if over <= 0:
        return True
    # the locked nodes' bytes: every other node lies in a lock-free subtree
    pinned = st[S_PIN_TOKENS] * cfg[C_KV] + st[S_PIN_CKPTS] * cfg[C_STATEB]
    if pinned + E[E_RESERVED] + extra > E[E_TOTAL]:
        return False
    _evict(cfg, N, T, st, values, over, hf[F_ALPHA], tot, W)
    window_set(cfg, st, hf[F_MULT], E[E_LOOKED])
    return bool(st[S_USED] + E[E_RESERVED] + extra <= E[E_TOTAL])


@jit(nrt=False)
def hy_reuse(H: HybridArrays, r: int) -> int:
    """What request r's input can reuse (HybridEngineCache.match): its hit tokens; the
    match stays in mi[5], mi[6] for :func:`hy_acquire`."""
    offsets, inputs, mi, N, T = H[1], H[2], H[6], H[9], H[10]
    return _reuse(H[3], N, T, H[0], offsets[r], inputs[r], mi[5], mi[6])


@jit(nrt=False, standalone=True)
def hy_acquire(
    H: HybridArrays, hit: int, num_blocks: int, bt: int, lk: I64, lkid: I64, at: int
) -> int:
    """HybridEngineCache._try_acquire: lock the hit's path (its nodes ending within the hit,
    and the reused node) into lk[at:], lkid[at:], make room for the blocks beyond the hit
    and a live state, stamp the match. How many nodes it locked, or -1: refused (nothing
    locked). E[E_NEED] is then the bytes reserved."""
    cfg, st, mi, E, N = H[3], H[5], H[6], H[7], H[9]
    ipath, ires = mi[5], mi[6]
    end = N[4]
    need = max(0, num_blocks * bt - hit) * cfg[C_KV] + cfg[C_STATEB]
    k = 0
    for j in range(ires[M_NPATH]):
        if end[ipath[j]] <= hit:
            lk[at + k] = ipath[j]
            k += 1
    reuse = ires[M_REUSE]
    if reuse >= 0:
        for j in range(k):
            if lk[at + j] == reuse:
                reuse = -1
                break
        if reuse >= 0:
            lk[at + k] = reuse
            k += 1
    for j in range(k):
        _lock(N, st, lk[at + j])
    if not hy_make_room(H, need):
        for j in range(k):
            _unlock(N, st, lk[at + j])
        return -1
    for j in range(k):
        lkid[at + j] = N[0][lk[at + j]]
    E[E_RESERVED] += need
    E[E_NEED] = need
    _touch(cfg, N, st, ipath, ires)
    E[E_LOOKED] += 1
    return k


@jit(nrt=False)
def hy_drop_hit(H: HybridArrays) -> None:
    """Take the match as a miss (HybridEngineCache.acquire's last resort): no path, nothing
    reusable; the partial edge stays (a lookup may still stamp it)."""
    ires = H[6][6]
    ires[M_NPATH], ires[M_REUSABLE], ires[M_REUSE] = 0, 0, -1


@jit(nrt=False)
def hy_close(H: HybridArrays, lk: I64, lkid: I64, at: int, k: int, reserved: int) -> None:
    """HybridEngineCache._close: return a request's reservation, unlock its path (merging
    what may merge now)."""
    values, cfg, st, E, N, T = H[0], H[3], H[5], H[7], H[9], H[10]
    E[E_RESERVED] -= reserved
    for j in range(k):
        s = lk[at + j]
        if N[0][s] == lkid[at + j]:
            _unlock(N, st, s)
            _normalize(cfg, N, T, st, values, s)


@jit(nrt=False)
def hy_slots_for(H: HybridArrays, r: int) -> int:
    """Free slots request r's admission may need, if the tree has too few (else 0)."""
    offsets, cfg, st, T = H[1], H[3], H[5], H[10]
    n = offsets[r + 1] - offsets[r]
    bound = n // cfg[C_BLOCK] + 4 if cfg[C_ADMISSION] == ADM_BLOCKS else 4
    if st[S_NFREE] < bound or 2 * (st[S_NODES] + bound) > T[2].shape[0]:
        return int(n // cfg[C_BLOCK] + 8)
    return 0


@jit(nrt=False, standalone=True)
def hy_admit(H: HybridArrays, r: int) -> None:
    """HybridEngineCache.commit's admission: request r's input + output into the tree, with
    the bytes the running requests reserve out of reach."""
    values, offsets, inputs, cfg, tot, st, mi, E, hf, N, T, W = H
    o = offsets[r]
    total = cfg[C_CAPACITY]
    cfg[C_CAPACITY] = E[E_TOTAL] - E[E_RESERVED]
    _match(values, o, inputs[r], N, T, cfg[C_STATE], mi[5], mi[6], 0)
    _admit(
        cfg,
        N,
        T,
        st,
        values,
        o,
        offsets[r + 1] - o,
        hf[F_ALPHA],
        tot,
        W,
        mi[5],
        mi[6],
        mi[0],
        mi[1],
        mi[2],
        mi[3],
        mi[4],
    )
    cfg[C_CAPACITY] = total
    window_set(cfg, st, hf[F_MULT], E[E_LOOKED])


@jit()
def hy_grown(H: HybridArrays, need: int) -> HybridArrays:
    """H with at least ``need`` more free slots in its tree."""
    N, T, W = grow_nodes(H[9], H[10], H[11], H[5], need)
    return (H[0], H[1], H[2], H[3], H[4], H[5], H[6], H[7], H[8], N, T, W)


#: Marconi's tuners of running engine simulations, by E[E_TUNER]: each takes the requests
#: of the bootstrap window (in lookup order) and the lookups so far, and returns the alpha
TUNERS: dict[int, Callable[[I64, int], float]] = {}


def call_tuner(tuner: int, window: I64, lookups: int) -> float:
    """A tuner's alpha. The kernel calls this function, never TUNERS itself: numba compiles
    the objects an object-mode block names into the kernel (pickled, and cached with it), so
    the block must name a module-level function, which is pickled by reference."""
    return float(TUNERS[tuner](window, lookups))


@jit()
def hy_tune(H: HybridArrays, looked: I64) -> None:
    """HybridEngineCache._maybe_tune: when the window is full, its tuner (Python: the
    replays of the window, one per alpha) sets the alpha."""
    st, E, hf = H[5], H[7], H[8]
    if st[S_TUNE_AT] < 0 or E[E_LOOKED] < st[S_TUNE_AT]:
        return
    tuner, upto, nlooked = E[E_TUNER], st[S_TUNE_AT], E[E_LOOKED]
    with objmode(alpha="float64"):
        alpha = call_tuner(tuner, looked[:upto], nlooked)
    hf[F_ALPHA] = alpha
    st[S_TUNE_AT] = nlooked + E[E_EVERY] if E[E_EVERY] else 1 << 62


# ----------------------------------------------------------------------------- slots
@jit()
def _tables(size: int) -> tuple[Children, Work]:
    """The children table (at most a quarter full) and the eviction's work arrays for
    ``size`` slots."""
    tsize = 1
    while tsize < 4 * size:
        tsize *= 2
    T = (np.zeros(tsize, np.int64), np.zeros(tsize, np.int64), np.full(tsize, -1, np.int64))
    W = (
        np.zeros(size, np.int64),
        np.zeros(size, np.float64),
        np.zeros(size, np.float64),
        np.zeros(size, np.bool_),
        np.zeros(size, np.float64),
        np.zeros((2 * size + 8, 2), np.float64),
        np.zeros((2 * size + 8, 2), np.int64),
    )
    return T, W


@jit()
def new_nodes(st: I64) -> tuple[Nodes, Children, Work]:
    """A tree of one slot, the root (id 0, an empty edge at position 0), none free:
    :func:`grow_nodes` adds the rest."""
    N = (
        np.zeros(1, np.int64),
        np.full(1, -1, np.int64),
        np.zeros(1, np.int64),
        np.zeros(1, np.int64),
        np.zeros(1, np.int64),
        np.zeros(1, np.bool_),
        np.zeros(1, np.float64),
        np.zeros(1, np.int64),
        np.zeros(1, np.int64),
        np.full(1, -1, np.int64),
        np.full(1, -1, np.int64),
        np.full(1, -1, np.int64),
        np.full(1, -1, np.int64),
        np.zeros(1, np.int64),
    )
    st[S_NFREE] = 0
    T, W = _tables(1)
    return N, T, W


@jit()
def widened(a: I64, size: int) -> I64:
    """An int64 copy of ``a`` in ``size`` places, the new ones -1."""
    b = np.full(size, -1, np.int64)
    b[: a.shape[0]] = a
    return b


@jit()
def grow_nodes(N: Nodes, T: Children, W: Work, st: I64, need: int) -> tuple[Nodes, Children, Work]:
    """The tree in arrays of at least ``need`` more free slots: new slots are taken lowest
    first, after the free ones (the free list is popped from its end)."""
    old = N[0].shape[0]
    size = max(2 * old, old + need, 64)
    ckpt = np.zeros(size, np.bool_)
    ckpt[:old] = N[5]
    la = np.zeros(size, np.float64)
    la[:old] = N[6]
    nfree = st[S_NFREE]
    free = np.empty(size, np.int64)
    k = 0
    for s in range(size - 1, old - 1, -1):
        free[k] = s
        k += 1
    for j in range(nfree):
        free[k + j] = N[13][j]
    st[S_NFREE] = nfree + size - old
    N2 = (
        widened(N[0], size),
        widened(N[1], size),
        widened(N[2], size),
        widened(N[3], size),
        widened(N[4], size),
        ckpt,
        la,
        widened(N[7], size),
        widened(N[8], size),
        widened(N[9], size),
        widened(N[10], size),
        widened(N[11], size),
        widened(N[12], size),
        free,
    )
    T2, W2 = _tables(size)
    _rehash(T[0], T[1], T[2], T2[0], T2[1], T2[2])
    return N2, T2, W2


# ----------------------------------------------------------------------------- Python side
def hybrid_code(pol: HybridPolicy) -> int:
    """The compiled eviction for a policy (EV_LRU, EV_MARCONI), or -1: the object path (a
    subclass or a third-party policy may have changed any hook)."""
    cls = type(pol)
    if cls is not registered().get(pol.name) or type(pol.admission) not in _ADMISSIONS:
        return -1
    return EV_MARCONI if isinstance(pol, Marconi) else EV_LRU


def _config(pol: HybridPolicy, spec: ModelSpec, capacity: int, locks: str) -> I64:
    has_state = spec.num_ssm_layers > 0
    cfg = np.zeros(17, np.int64)
    adm = pol.admission
    cfg[C_ADMISSION] = adm.code
    cfg[C_BLOCK] = adm.block_tokens if isinstance(adm, AllBlocks) else pol.block_tokens
    cfg[C_PARTIAL] = adm.fills_partial_blocks
    cfg[C_SIZING] = pol.sizing == "estimate"
    cfg[C_CHUNK] = adm.chunk_tokens if isinstance(adm, Judicious) else 0
    cfg[C_BRANCH] = adm.branch_match() == "input"
    cfg[C_LOCKS] = locks == "none"
    cfg[C_STATE] = has_state
    cfg[C_KV] = spec.kv_bytes_per_token
    cfg[C_STATEB] = spec.state_bytes_per_checkpoint if has_state else 0
    cfg[C_CAPACITY] = capacity
    cfg[C_EVICT] = EV_MARCONI if isinstance(pol, Marconi) else EV_LRU
    if isinstance(pol, Marconi):
        cfg[C_TOUCH] = T_REUSED if has_state else T_PATH
        cfg[C_RECENCY] = RECENCIES.index(pol.recency)
        cfg[C_EFF] = EFFICIENCIES.index(pol.efficiency_of)
        cfg[C_TUNES] = pol.tunes
    else:
        cfg[C_TOUCH] = T_FULL_BLOCKS if isinstance(pol, VllmPlus) else T_PATH
        cfg[C_TOUCH_PARTIAL] = pol.touch_partial
    return cfg


def _frozen(a: I64) -> I64:
    view: I64 = np.asarray(a, dtype=np.int64).view()
    view.flags.writeable = False
    return view


class HybridKernel:
    """The compiled tree's arrays for one replay, resumable between kernel calls."""

    def __init__(
        self,
        values: I64,
        offsets: I64,
        inputs: I64,
        pol: HybridPolicy,
        spec: ModelSpec,
        capacity: int,
        locks: str,
    ) -> None:
        # read-only views, whatever the trace gives: one compiled signature, no copy
        self.values, self.offsets = _frozen(values), _frozen(offsets)
        self.inputs = inputs
        self.pol = pol
        self.cfg = _config(pol, spec, capacity, locks)
        lengths = np.diff(offsets)
        maxlen = int(lengths.max()) if lengths.shape[0] else 0
        self.tot = (
            spec.prefill_flops_table(maxlen)
            if isinstance(pol, Marconi)
            else np.zeros(1, np.float64)
        )
        m = maxlen + 4
        self.mi = (
            np.zeros(m, np.int64),
            np.zeros(6, np.int64),
            np.zeros(m, np.int64),
            np.zeros(m, np.int64),
            np.zeros(m, np.int64),
            np.zeros(m, np.int64),
            np.zeros(6, np.int64),
        )
        self.st = np.zeros(21, np.int64)
        self.st[S_NEXT_ID] = 1
        self.st[S_TUNE_AT] = -1
        self.hits = np.zeros(lengths.shape[0], np.int64)
        self.N, self.T, self.W = new_nodes(self.st)
        self._grow(63)

    def _grow(self, need: int) -> None:
        """At least ``need`` more free slots (and a children table at most half full)."""
        self.N, self.T, self.W = grow_nodes(self.N, self.T, self.W, self.st, need)

    def run(self, r_end: int, alpha: float) -> int:
        """Replay up to request ``r_end`` (exclusive); ST_DONE or ST_TUNE."""
        mult = float(getattr(self.pol, "bootstrap_multiplier", 1.0))
        while True:
            status = int(
                _kernel(
                    self.values,
                    self.offsets,
                    self.inputs,
                    r_end,
                    self.cfg,
                    alpha,
                    mult,
                    self.tot,
                    self.N,
                    self.T,
                    self.W,
                    self.st,
                    self.mi,
                    self.hits,
                )
            )
            if status != ST_GROW:
                return status
            r = int(self.st[S_NEXT])
            n = int(self.offsets[r + 1] - self.offsets[r])
            self._grow(n // int(self.cfg[C_BLOCK]) + 8)

    # what HybridCache reports
    @property
    def next_request(self) -> int:
        return int(self.st[S_NEXT])

    @property
    def tune_at(self) -> int:
        return int(self.st[S_TUNE_AT])

    @tune_at.setter
    def tune_at(self, value: int) -> None:
        self.st[S_TUNE_AT] = value

    def counters(self) -> dict[str, int]:
        st = self.st
        return {
            "bytes_used": int(st[S_USED]),
            "peak_bytes": int(st[S_PEAK]),
            "bytes_written": int(st[S_WRITTEN]),
            "bytes_evicted": int(st[S_EVICTED]),
            "num_nodes": int(st[S_NODES]),
            "num_checkpoints": int(st[S_CKPTS]),
            "num_checkpoints_written": int(st[S_CKPT_WRITTEN]),
            "num_evicted_nodes": int(st[S_EVICTED_NODES]),
            "num_merges": int(st[S_MERGES]),
            "num_rejected": int(st[S_REJECTED]),
        }

    @property
    def num_evict_calls(self) -> int:
        return int(self.st[S_EVICT_CALLS])


@jit(nrt=False)
def _rehash(op: I64, ok: I64, ov: I64, tp: I64, tk: I64, tv: I64) -> None:
    for s in range(ov.shape[0]):
        if ov[s] >= 0:
            j = pair_find(tp, tk, tv, op[s], ok[s])
            tp[j], tk[j], tv[j] = op[s], ok[s], ov[s]
