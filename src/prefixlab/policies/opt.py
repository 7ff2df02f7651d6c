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

from prefixlab._jit import jit
from prefixlab._keytable import kcell, with_room
from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies._keyed import next_use as _next_use
from prefixlab.policies.base import register
from prefixlab.types import F64, I64
from prefixlab.workload.trace import BlockLayout

NEVER = float("inf")


def next_use_at(layout: BlockLayout) -> F64:
    """For every key position of the layout (request r, block j), the first request after r
    that looks that key up (inf: never): one backward pass over the requests."""
    table = with_room(np.full((16, 2), -1, np.int64), max(layout.num_distinct_keys, 1))
    out, _ = next_uses_back(layout.keys, layout.key_offsets, layout.num_lookup_blocks, 0, table)
    return out


@jit(nogil=True)
def next_uses_back(keys: I64, offs: I64, num_lookup: I64, r0: int, table: I64) -> tuple[F64, int]:
    """Next uses of a run of requests r0, r0 + 1, ... (the rows of ``offs``; a whole
    trace, or a streamed one's chunk, walked from the last chunk to the first), walked
    last to first: each key position gets its key's earliest lookup after its request so
    far, then the request's lookups become their keys' earliest. ``table``
    (:mod:`prefixlab._keytable`: key -> earliest lookup so far) carries that from chunk to
    chunk. Returns the next uses and how many keys entered the table (which the caller
    keeps at most half full)."""
    out = np.empty(keys.shape[0], np.float64)
    added = 0
    for r in range(offs.shape[0] - 2, -1, -1):
        k0 = offs[r]
        for j in range(offs[r + 1] - k0):
            c = kcell(table, keys[k0 + j])
            out[k0 + j] = table[c, 1] if table[c, 1] >= 0 else np.inf
        for j in range(num_lookup[r]):
            c = kcell(table, keys[k0 + j])
            if table[c, 1] < 0:
                table[c, 0] = keys[k0 + j]
                added += 1
            table[c, 1] = r0 + r
    return out, added


@register("opt")
class OPT(KeyedPolicy):
    """Belady's offline optimum, prefix-aware: farthest next use first, deepest on ties."""

    sort_key = (("next_use", -1), ("depth", -1), ("primary", 1))

    def prepare(self, future: BlockLayout) -> None:
        super().prepare(future)
        self._future = future
        self._next_use_pos: F64 | None = None

    @property
    def next_use_pos(self) -> F64:
        """Next use of every key position: the replay kernel's key for a block released
        after its request (computed on first use; the engine looks next uses up instead)."""
        if self._next_use_pos is None:
            self._next_use_pos = next_use_at(self._future)
        return self._next_use_pos

    def next_use(self, key: int, after: int) -> float:
        """The first request after ``after`` that looks ``key`` up (inf: never)."""
        return float(_next_use(self.occ_start, self.occ_req, key, after))
