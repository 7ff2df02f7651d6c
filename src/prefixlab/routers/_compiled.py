"""The routers that read the loads, compiled: what the fleet's kernel
(:mod:`prefixlab.runner.engine._fleet`) calls at each arrival.

A router is a code and its parameters (:meth:`~prefixlab.routers.base.Router.compiled`),
and the functions below do what its :meth:`route` and :meth:`routed` do, over the loads
the fleet keeps (outstanding requests and prefill tokens per replica) and, for
``cache-aware``, one tree per replica: a dict from block key to (last access, depth),
the same dict its Python form keeps, iterated in the same (insertion) order, so its
eviction drops the same keys. What a router draws is drawn ahead
(:meth:`~prefixlab.routers.base.Router.draws`, one row per arrival routed, in the order
its ``route`` draws): ``power-of-two``'s pairs, and ``round-robin``'s and ``random``'s
choices, which depend on nothing else (they run here in a closed loop, where the order of
arrivals waits on the answers). Tests check every choice equals the Python router's.

``kv-aware`` with its events seen at once (``event_delay=0``, its default) and no
temperature knows, at each arrival, exactly what every replica holds: every block stored
or dropped before the arrival, at its instant or earlier. On the block structure that is
the replica's own table of keys (:func:`held_run` reads it as ``match_blocks`` does, a
key being held while any block holds it, as the events' counts say), so the compiled
router reads the replicas' caches instead of a copy built from events; its other state
(prompt tokens awaiting a first token less each one's overlap, the distinct blocks of
unfinished prompts) is the Python router's, in the same floating-point order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixlab._jit import jit
from prefixlab._keytable import kcell
from prefixlab.types import F64, I64

LEAST_REQUESTS, LEAST_TOKENS, POWER_OF_TWO, CACHE_AWARE, DRAWN, KV_AWARE = range(6)
#: cache-aware's parameters in ``par``
CA_THRESHOLD, CA_ABS, CA_REL, CA_INTERVAL, CA_MAX_SIZE = range(5)


@jit()
def route_one(
    code: int,
    par: F64,
    k: int,
    now: float,
    outstanding: I64,
    prefill: I64,
    pairs: I64,
    trees: Any,
    keys: I64,
    k0: int,
    nk: int,
) -> int:
    """The replica for the ``k``-th arrival routed (prompt keys ``keys[k0:k0 + nk]``)."""
    if code == LEAST_REQUESTS:
        return int(np.argmin(outstanding))
    if code == LEAST_TOKENS:
        return int(np.argmin(prefill))
    if code == DRAWN:  # round-robin, random: the k-th choice, made ahead
        return int(pairs[k, 0])
    if code == POWER_OF_TWO:
        if outstanding.shape[0] == 1:
            return 0
        a, b = pairs[k, 0], pairs[k, 1]
        return int(b) if outstanding[b] < outstanding[a] else int(a)
    hi, lo = outstanding.max(), outstanding.min()
    if hi - lo > par[CA_ABS] and hi > lo * par[CA_REL]:
        return int(np.argmin(outstanding))
    best, most = 0, -1
    for i in range(len(trees)):
        tree = trees[i]
        m = 0
        while m < nk and keys[k0 + m] in tree:
            m += 1
        if m > most:
            best, most = i, m
    if nk and most / nk > par[CA_THRESHOLD]:
        return best
    sizes = np.empty(len(trees), np.int64)
    for i in range(len(trees)):
        sizes[i] = len(trees[i])
    return int(np.argmin(sizes))


@jit()
def routed_one(code: int, trees: Any, i: int, keys: I64, k0: int, nk: int, now: float) -> None:
    """``cache-aware``: the prompt joins replica ``i``'s tree."""
    if code == CACHE_AWARE:
        tree = trees[i]
        for depth in range(nk):
            tree[keys[k0 + depth]] = (now, depth)


@jit()
def evict_due(code: int, par: F64, trees: Any, nxt: F64, now: float) -> None:
    """``cache-aware``: the eviction cycle due by ``now``, if any (``nxt[0]``: the next
    cycle's time): each tree drops its least recently used entries (a leaf before its
    parent, then in insertion order) down to the size bound."""
    if code != CACHE_AWARE or now < nxt[0]:
        return
    while nxt[0] <= now:
        nxt[0] += par[CA_INTERVAL]
    bound = int(par[CA_MAX_SIZE])
    for i in range(len(trees)):
        tree = trees[i]
        extra = len(tree) - bound
        if extra <= 0:
            continue
        ks = np.empty(len(tree), np.int64)
        last = np.empty(len(tree), np.float64)
        deep = np.empty(len(tree), np.int64)
        for j, (key, v) in enumerate(tree.items()):
            ks[j], last[j], deep[j] = key, v[0], -v[1]
        by_depth = np.argsort(deep, kind="mergesort")
        order = by_depth[np.argsort(last[by_depth], kind="mergesort")]
        for j in range(extra):
            tree.pop(ks[order[j]])


@jit(inline=True)
def held_run(chains: I64, ktab: I64, keys: I64, k0: int, nk: int) -> int:
    """How many of ``keys[k0:k0 + nk]``, from the first, a replica's block structure holds
    (its key table: ``chains`` and, with raw keys, ``ktab``; ``_fast.match_blocks``)."""
    raw = ktab.shape[0] > 1
    h = 0
    while h < nk:
        s = keys[k0 + h]
        if raw:
            s = ktab[kcell(ktab, s), 1]
            if s < 0:
                break
        if chains[0, s] < 0:
            break
        h += 1
    return h


@jit()
def kv_route(
    weight: float, prefill: F64, active: Any, holds: Any, keys: I64, k0: int, nk: int,
    tokens: int, bt: int, overlap: I64,
) -> int:  # fmt: skip
    """``kv-aware``'s replica: the lowest ``weight * prefill blocks + decode blocks``
    (ties to the lowest index); each replica's overlap into ``overlap``."""
    best, lowest = 0, np.inf
    blocks = -(-tokens // bt)
    for i in range(len(holds)):
        chains, ktab = holds[i]
        overlap[i] = held_run(chains, ktab, keys, k0, nk)
        cost = weight * ((prefill[i] + tokens - float(overlap[i]) * bt) / bt) + (
            float(len(active[i])) + blocks
        )
        if cost < lowest:
            best, lowest = i, cost
    return best


@jit()
def kv_routed(
    prefill: F64, active: Any, uncached: I64, r: int, i: int, keys: I64, k0: int, nk: int,
    tokens: int, bt: int, overlap: I64,
) -> None:  # fmt: skip
    """``kv-aware``: request ``r`` went to replica ``i``: its uncached prompt tokens join
    the replica's prefill load, its prompt's blocks the replica's active ones."""
    uncached[r] = tokens - overlap[i] * bt
    prefill[i] += uncached[r]
    counts = active[i]
    for j in range(k0, k0 + nk):
        counts[keys[j]] = counts.get(keys[j], 0) + 1


@jit()
def kv_finished(active: Any, i: int, keys: I64, k0: int, nk: int) -> None:
    """``kv-aware``: a request of replica ``i`` finished: its prompt's blocks leave the
    active ones."""
    counts = active[i]
    for j in range(k0, k0 + nk):
        c = counts.get(keys[j], 0) - 1
        if c > 0:
            counts[keys[j]] = c
        else:
            counts.pop(keys[j], 0)
