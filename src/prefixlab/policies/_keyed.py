"""Policies that evict by a sort key over entry metadata, on one indexed heap.

A keyed policy is declared, not programmed: ``sort_key`` names up to three metadata
columns, each ascending (+1) or descending (-1); the evictable entry with the smallest key
goes first, ties to the entry that became evictable first. ``lfu`` is
``(("hits", 1), ("last_access", 1), ("depth", -1))``. The key is computed when an entry
becomes evictable and again when it is accessed or updated while evictable.

The heap, the key columns and the hooks below are the one implementation: the policy
classes call them in batches, and the compiled replay kernel (:mod:`prefixlab.runner._fast`)
calls them entry by entry. They are compiled with numba when it is installed and run
interpreted otherwise (:mod:`prefixlab._jit`)::

    heap rows  (k0, k1, k2, order)   entry   pos[entry] = its row, or -1
    columns    last_access hits depth created next_use primary
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from prefixlab._jit import jit
from prefixlab.cache.view import EntryView
from prefixlab.errors import ConfigError
from prefixlab.policies.base import EvictionPolicy
from prefixlab.types import B1, F64, I64
from prefixlab.workload.trace import BlockLayout

COLUMNS = ("last_access", "hits", "depth", "created", "next_use", "primary")
NEVER = np.inf


# ----------------------------------------------------------------------------- heap
@jit(inline=True)
def _before(hk: F64, i: int, k0: float, k1: float, k2: float, k3: float) -> bool:
    """Row i's key is smaller than (k0, k1, k2, k3)."""
    a = hk[i]
    if a[0] != k0:
        return bool(a[0] < k0)
    if a[1] != k1:
        return bool(a[1] < k1)
    if a[2] != k2:
        return bool(a[2] < k2)
    return bool(a[3] < k3)


@jit(inline=True)
def _move(hk: F64, he: I64, pos: I64, src: int, dst: int) -> None:
    for c in range(4):
        hk[dst, c] = hk[src, c]
    e = he[src]
    he[dst] = e
    pos[e] = dst


@jit(nrt=False)
def _sift(hk: F64, he: I64, pos: I64, n: int, i: int) -> None:
    """Restore heap order around row i (up, then down), moving rows into a hole. The heap
    is 4-ary (row i's children are 4i + 1 .. 4i + 4): half the levels of a binary heap."""
    k0, k1, k2, k3 = hk[i, 0], hk[i, 1], hk[i, 2], hk[i, 3]
    e = he[i]
    start = i
    while i > 0:
        p = (i - 1) >> 2
        if not _before(hk, p, k0, k1, k2, k3):
            _move(hk, he, pos, p, i)
            i = p
        else:
            break
    if i == start:
        while True:
            c = 4 * i + 1
            if c >= n:
                break
            for d in range(c + 1, min(c + 4, n)):
                if _before(hk, d, hk[c, 0], hk[c, 1], hk[c, 2], hk[c, 3]):
                    c = d
            if _before(hk, c, k0, k1, k2, k3):
                _move(hk, he, pos, c, i)
                i = c
            else:
                break
    hk[i, 0] = k0
    hk[i, 1] = k1
    hk[i, 2] = k2
    hk[i, 3] = k3
    he[i] = e
    pos[e] = i


@jit(nrt=False)
def heap_set(
    hk: F64, he: I64, pos: I64, hn: I64, e: int, k0: float, k1: float, k2: float, order: float
) -> None:
    """Insert e with key (k0, k1, k2) and tie order, or re-key it if present."""
    i = pos[e]
    if i < 0:
        i = hn[0]
        hn[0] = i + 1
        he[i] = e
        pos[e] = i
    hk[i, 0] = k0
    hk[i, 1] = k1
    hk[i, 2] = k2
    hk[i, 3] = order
    _sift(hk, he, pos, hn[0], i)


@jit(nrt=False)
def heap_remove(hk: F64, he: I64, pos: I64, hn: I64, e: int) -> None:
    """Take e out of the heap (no-op when absent)."""
    i = pos[e]
    if i < 0:
        return
    last = hn[0] - 1
    hn[0] = last
    pos[e] = -1
    if i != last:
        for c in range(4):
            hk[i, c] = hk[last, c]
        moved = he[last]
        he[i] = moved
        pos[moved] = i
        _sift(hk, he, pos, last, i)


@jit(nrt=False)
def heap_pop(hk: F64, he: I64, pos: I64, hn: I64) -> int:
    """Remove and return the entry with the smallest key, or -1."""
    if hn[0] == 0:
        return -1
    e = int(he[0])
    heap_remove(hk, he, pos, hn, e)
    return e


# ----------------------------------------------------------------------------- keys
def occurrences(layout: BlockLayout) -> tuple[I64, I64]:
    """Every key's lookups, vectorised: ``occ_req[occ_start[k]:occ_start[k + 1]]`` are the
    requests whose lookup range holds key k, ascending (one stable sort by key)."""
    num_keys = max(layout.num_distinct_keys, 1)
    counts = layout.num_lookup_blocks
    total = int(counts.sum())
    starts = layout.key_offsets[:-1]
    # Position of every lookup block in layout.keys: its request's start plus its index.
    first = np.cumsum(counts) - counts
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - first, counts)
    keys = layout.keys[idx]
    reqs = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    occ_start = np.zeros(num_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=num_keys), out=occ_start[1:])
    return occ_start, _by_key(keys, reqs, occ_start)


@jit()
def _by_key(keys: I64, reqs: I64, occ_start: I64) -> I64:
    """reqs grouped by key, in their order within a key (a counting sort: linear)."""
    fill = occ_start[:-1].copy()
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        out[fill[k]] = reqs[i]
        fill[k] += 1
    return out


@jit(nrt=False)
def next_use(occ_start: I64, occ_req: I64, key: int, after: int) -> float:
    """The first request after ``after`` whose lookup range holds ``key`` (inf: never)."""
    lo, hi = occ_start[key], occ_start[key + 1]
    while lo < hi:  # first occurrence > after
        mid = (lo + hi) // 2
        if occ_req[mid] <= after:
            lo = mid + 1
        else:
            hi = mid
    return float(occ_req[lo]) if lo < occ_start[key + 1] else np.inf


@jit(inline=True)
def entry_key(
    cols: I64,
    signs: F64,
    e: int,
    la: F64,
    hits: I64,
    depth: I64,
    created: F64,
    primary: B1,
    key: I64,
    occ_start: I64,
    occ_req: I64,
    after: int,
    out: F64,
    nu: float = np.nan,
) -> None:
    """Write entry e's sort key (three floats) into out. ``nu``: e's next use when the
    caller knows it already (the replay kernel, from :func:`next_use_at`), else NaN."""
    for c in range(3):
        col = cols[c]
        if col == 0:
            v = float(la[e])
        elif col == 1:
            v = float(hits[e])
        elif col == 2:
            v = float(depth[e])
        elif col == 3:
            v = float(created[e])
        elif col == 4:
            # A duplicate holder serves no lookup while its key's first holder is cached.
            if not primary[e]:
                v = np.inf
            elif nu == nu:
                v = nu
            else:
                v = next_use(occ_start, occ_req, key[e], after)
        elif col == 5:
            v = 1.0 if primary[e] else 0.0
        else:
            v = 0.0
        out[c] = v * signs[c]


# ----------------------------------------------------------------------------- batches
@jit()
def push_batch(
    hk: F64,
    he: I64,
    pos: I64,
    hn: I64,
    entries: I64,
    orders: I64,
    only_present: bool,
    cols: I64,
    signs: F64,
    la: F64,
    hits: I64,
    depth: I64,
    created: F64,
    primary: B1,
    key: I64,
    occ_start: I64,
    occ_req: I64,
    after: int,
) -> None:
    """(Re-)key entries; ``orders[i] < 0`` keeps an entry's tie order. With
    ``only_present`` entries not in the heap are skipped (re-ranking on access)."""
    k = np.empty(3, np.float64)
    for i in range(entries.shape[0]):
        e = entries[i]
        p = pos[e]
        if only_present and p < 0:
            continue
        order = orders[i] if orders[i] >= 0 else hk[p, 3]
        entry_key(
            cols, signs, e, la, hits, depth, created, primary, key, occ_start, occ_req, after, k
        )
        heap_set(hk, he, pos, hn, e, k[0], k[1], k[2], order)


@jit()
def remove_batch(hk: F64, he: I64, pos: I64, hn: I64, entries: I64) -> None:
    for i in range(entries.shape[0]):
        heap_remove(hk, he, pos, hn, entries[i])


@jit()
def pop_batch(hk: F64, he: I64, pos: I64, hn: I64, n: int, out: I64) -> int:
    """Pop up to n entries into out; returns how many."""
    for i in range(n):
        e = heap_pop(hk, he, pos, hn)
        if e < 0:
            return i
        out[i] = e
    return n


def key_columns(sort_key: tuple[tuple[str, int], ...]) -> tuple[I64, F64]:
    """``(("hits", 1), ("depth", -1))`` -> column codes and signs, padded to three."""
    if not 1 <= len(sort_key) <= 3:
        raise ConfigError(f"a sort key has 1 to 3 columns, got {len(sort_key)}")
    cols = np.full(3, -1, np.int64)
    signs = np.ones(3, np.float64)
    for i, (name, sign) in enumerate(sort_key):
        if name not in COLUMNS or sign not in (1, -1):
            raise ConfigError(f"bad sort-key column ({name!r}, {sign}); columns: {COLUMNS}")
        cols[i] = COLUMNS.index(name)
        signs[i] = sign
    return cols, signs


_HOOKS = (
    "on_insert",
    "on_access",
    "on_pinned",
    "on_evictable",
    "on_remove",
    "on_update",
    "on_miss",
    "on_split",
    "evict",
    "bind",
)


def is_plain_keyed(pol: EvictionPolicy) -> bool:
    """A keyed policy whose behaviour is its sort key alone (no hook overridden): the
    compiled kernels can run it, built-in or not."""
    cls = type(pol)
    return isinstance(pol, KeyedPolicy) and all(
        getattr(cls, h) is getattr(KeyedPolicy, h) for h in _HOOKS
    )


class KeyedPolicy(EvictionPolicy):
    """Base of the keyed policies: evict the smallest ``sort_key``, ties by evictable order."""

    sort_key: ClassVar[tuple[tuple[str, int], ...]] = (("last_access", 1),)
    #: every key's lookups (``prepare``; placeholders when the sort key has no next use)
    occ_start: I64
    occ_req: I64

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if any(c == "next_use" for c, _ in cls.sort_key):
            cls.needs_future = True  # the runners hand it the trace's layout (prepare)

    def prepare(self, future: BlockLayout) -> None:
        """Ranking by ``next_use``: every key's lookups, from the trace's block layout."""
        if any(c == "next_use" for c, _ in self.sort_key):
            self.occ_start, self.occ_req = occurrences(future)

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.cols, self.signs = key_columns(self.sort_key)
        if not hasattr(self, "occ_start"):
            self.occ_start = np.zeros(1, np.int64)
            self.occ_req = np.zeros(0, np.int64)
        n = view.num_entries
        self._hk = np.zeros((n, 4), np.float64)
        self._he = np.zeros(n, np.int64)
        self._pos = np.full(n, -1, np.int64)
        self._hn = np.zeros(1, np.int64)
        self._next_order = 0

    def _grow(self) -> None:
        n = self.view.num_entries
        if self._pos.shape[0] < n:
            old = self._pos.shape[0]
            self._hk = np.concatenate([self._hk, np.zeros((n - old, 4))])
            self._he = np.concatenate([self._he, np.zeros(n - old, np.int64)])
            self._pos = np.concatenate([self._pos, np.full(n - old, -1, np.int64)])

    def _push(self, entries: I64, orders: I64, only_present: bool) -> None:
        v = self.view
        push_batch(
            self._hk,
            self._he,
            self._pos,
            self._hn,
            entries,
            orders,
            only_present,
            self.cols,
            self.signs,
            v.last_access,
            v.hits,
            v.depth,
            v.created,
            v.is_primary,
            v.key,
            self.occ_start,
            self.occ_req,
            v.request_index,
        )

    def on_evictable(self, entries: I64) -> None:
        self._grow()
        n = int(entries.shape[0])
        orders = np.arange(self._next_order, self._next_order + n, dtype=np.int64)
        self._next_order += n
        self._push(entries, orders, False)

    def on_access(self, entries: I64) -> None:
        # The key may read access metadata: re-rank entries that stay evictable.
        if self._hn[0]:
            self._push(entries, np.full(entries.shape[0], -1, np.int64), True)

    on_update = on_access

    def on_pinned(self, entries: I64) -> None:
        if self._hn[0]:
            remove_batch(self._hk, self._he, self._pos, self._hn, entries)

    on_remove = on_pinned

    def evict(self, n: int) -> I64:
        out = np.empty(n, np.int64)
        k = pop_batch(self._hk, self._he, self._pos, self._hn, n, out)
        return out[:k]

    def num_evictable(self) -> int:
        return int(self._hn[0])
