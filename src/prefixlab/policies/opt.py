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

from typing import Any

import numpy as np
import numpy.typing as npt

from prefixlab.policies.base import I64, PriorityPolicy, register
from prefixlab.workload.trace import BlockLayout

NEVER = float("inf")


@register("opt")
class OPT(PriorityPolicy):
    """Belady's offline optimum, prefix-aware: farthest next use first, deepest on ties."""

    needs_future = True

    def prepare(self, future: BlockLayout) -> None:
        lay = future
        num_keys = max(lay.num_distinct_keys, 1)
        counts = lay.num_lookup_blocks
        starts = lay.key_offsets[:-1]
        idx = (
            np.repeat(starts, counts)
            + np.arange(int(counts.sum()))
            - np.repeat(np.cumsum(counts) - counts, counts)
        )
        keys = lay.keys[idx]
        reqs = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
        order = np.lexsort((reqs, keys))
        self._occ_req: I64 = reqs[order]
        self._occ_start: I64 = np.zeros(num_keys + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys, minlength=num_keys), out=self._occ_start[1:])
        # One sorted array of (key, request) pairs answers a whole batch's next uses.
        self._stride = int(counts.shape[0]) + 1
        self._occ_code: I64 = keys[order] * self._stride + self._occ_req

    def next_uses(self, keys: I64, after: int) -> npt.NDArray[np.float64]:
        """Next request (> after) that looks up each key; +inf if none."""
        pos = np.searchsorted(self._occ_code, keys * self._stride + after, side="right")
        found = pos < self._occ_start[keys + 1]
        out = np.full(keys.shape[0], NEVER)
        out[found] = self._occ_req[pos[found]]
        return out

    def next_use(self, key: int, after: int) -> float:
        lo, hi = int(self._occ_start[key]), int(self._occ_start[key + 1])
        pos = lo + int(np.searchsorted(self._occ_req[lo:hi], after, side="right"))
        return float(self._occ_req[pos]) if pos < hi else NEVER

    def priority(self, e: int) -> tuple[float, int, bool]:
        return self.priorities(np.array([e], dtype=np.int64))[0]  # type: ignore[no-any-return]

    def priorities(self, entries: I64) -> list[Any]:
        v = self.view
        nxt = self.next_uses(v.key[entries], v.request_index)
        # A duplicate holder serves no lookup while its key's first holder is cached: it is
        # never used (the structure re-announces it with on_update if it gets promoted).
        nxt[~v.is_primary[entries]] = NEVER
        return list(
            zip(
                (-nxt).tolist(),
                (-v.depth[entries]).tolist(),
                v.is_primary[entries].tolist(),
                strict=True,
            )
        )
