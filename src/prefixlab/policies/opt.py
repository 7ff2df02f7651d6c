"""Offline OPT (Belady): evict the evictable block whose next use is farthest.

A first pass over the trace lists, for every key, the requests whose lookup range contains
it. When a block becomes evictable after request r, its next use is the first such request
after r (never = +inf).

Prefix-aware: a request that can hit a block also looks up every ancestor of it (keys are
chained), so next_use(parent) <= next_use(child), and ties go to the deepest block, so OPT
never evicts a prefix while keeping an evictable extension of it. A duplicate holder of a
key (not the one lookups take) is never used, so it goes first; when the block cache
promotes it, ``on_update`` re-ranks it.

This is Belady's rule applied block by block. With prefix hits and multi-block requests it
is not a proven upper bound: tests check that it is never below any online policy on the
bundled traces, and rare tiny adversarial traces can beat it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies._keyed import next_use as _next_use
from prefixlab.policies.base import I64, register
from prefixlab.workload.trace import BlockLayout

NEVER = float("inf")


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
    order = np.argsort(keys, kind="stable")  # requests stay ascending within a key
    occ_start = np.zeros(num_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=num_keys), out=occ_start[1:])
    return occ_start, reqs[order]


def next_use_at(layout: BlockLayout) -> npt.NDArray[np.float64]:
    """For every key position of the layout (request r, block j), the first request after r
    that looks that key up (inf: never), vectorised: one stable sort by key, then the next
    lookup position of the same key through a reversed running minimum."""
    n = int(layout.keys.shape[0])
    out = np.full(n, np.inf)
    if n == 0:
        return out
    counts = np.diff(layout.key_offsets)
    req = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    j = np.arange(n, dtype=np.int64) - np.repeat(layout.key_offsets[:-1], counts)
    lookup = j < np.repeat(layout.num_lookup_blocks, counts)
    order = np.argsort(layout.keys, kind="stable")  # by key, then position (= request)
    ks, flags = layout.keys[order], lookup[order]
    idx = np.where(flags, np.arange(n, dtype=np.int64), n)
    nxt = np.minimum.accumulate(idx[::-1])[::-1]  # first lookup at or after each place
    after = np.empty(n, dtype=np.int64)
    after[:-1] = nxt[1:]
    after[-1] = n
    ok = after < n
    ok[ok] = ks[after[ok]] == ks[ok]
    out[order[ok]] = req[order][after[ok]]
    return out


@register("opt")
class OPT(KeyedPolicy):
    """Belady's offline optimum, prefix-aware: farthest next use first, deepest on ties."""

    needs_future = True
    sort_key = (("next_use", -1), ("depth", -1), ("primary", 1))

    def prepare(self, future: BlockLayout) -> None:
        self.occ_start, self.occ_req = occurrences(future)
        #: next use of every key position: the replay kernel's key for a released block
        self.next_use_pos = next_use_at(future)

    def next_use(self, key: int, after: int) -> float:
        """The first request after ``after`` that looks ``key`` up (inf: never)."""
        return float(_next_use(self.occ_start, self.occ_req, key, after))
