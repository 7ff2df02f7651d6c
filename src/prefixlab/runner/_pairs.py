"""An open-addressing table keyed by (parent, first key): how the compiled trees find a
node's child. Three int64 arrays of one power-of-two length: parents, keys and values
(-1: empty). Deletion shifts the rest of a probe run back, so there are no tombstones.
"""

from __future__ import annotations

from prefixlab._jit import jit
from prefixlab.types import I64


@jit(inline=True)
def pair_hash(parent: int, key: int, mask: int) -> int:
    # parents stay below 2**31 and the key is cut to 31 bits: no product overflows int64
    h = parent * 0x9E3779B1 + (key & 0x7FFFFFFF) * 0x85EBCA77
    return (h ^ (h >> 29)) & mask


@jit(inline=True)
def pair_find(tp: I64, tk: I64, tv: I64, parent: int, key: int) -> int:
    """The slot holding (parent, key), or the empty slot where it would go."""
    mask = tv.shape[0] - 1
    s = pair_hash(parent, key, mask)
    while tv[s] >= 0 and (tp[s] != parent or tk[s] != key):
        s = (s + 1) & mask
    return s


@jit(nrt=False)
def pair_unmap(tp: I64, tk: I64, tv: I64, parent: int, key: int) -> None:
    """Delete (parent, key), shifting the rest of its probe run back (no tombstones)."""
    mask = tv.shape[0] - 1
    s = pair_find(tp, tk, tv, parent, key)
    if tv[s] < 0:
        return
    tv[s] = -1
    j = s
    while True:
        j = (j + 1) & mask
        if tv[j] < 0:
            return
        k = pair_hash(tp[j], tk[j], mask)
        if (k <= s or k > j) if s <= j else (k <= s and k > j):
            tp[s], tk[s], tv[s] = tp[j], tk[j], tv[j]
            tv[j] = -1
            s = j
