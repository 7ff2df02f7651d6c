"""Open-addressing tables of 64-bit keys, compiled (linear probing, no tombstones).

A table is an int64 array of shape (cells, 2), cells a power of two: row j is a cell (key,
value), value -1 when the cell is empty. The block kernel maps a streamed replay's raw
keys to slots through one (:mod:`prefixlab.runner._fast`); the streamed passes over a
whole trace (next uses, WA's profile) keep one entry per distinct key in one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixlab._jit import jit

__all__ = ["kcell", "khash", "rehash", "with_room"]


@jit(inline=True)
def khash(key: int, mask: int) -> int:
    """key's home cell under ``mask`` (cells - 1)."""
    # 31-bit halves: neither product overflows int64 (interpreted numpy would warn)
    h = ((key & 0x7FFFFFFF) * 0x9E3779B1) ^ (((key >> 31) & 0x7FFFFFFF) * 0x85EBCA77)
    return (h ^ (h >> 29)) & mask


@jit(inline=True)
def kcell(ktab: Any, key: int) -> int:
    """The cell holding key, or the empty cell where it would go."""
    mask = ktab.shape[0] - 1
    j = khash(key, mask)
    while ktab[j, 1] >= 0 and ktab[j, 0] != key:
        j = (j + 1) & mask
    return j


@jit()
def rehash(ktab: Any, cells: int) -> Any:
    """ktab's entries in a table of ``cells`` cells."""
    new = np.full((cells, 2), -1, np.int64)
    for i in range(ktab.shape[0]):
        if ktab[i, 1] >= 0:
            j = kcell(new, ktab[i, 0])
            new[j, 0] = ktab[i, 0]
            new[j, 1] = ktab[i, 1]
    return new


def with_room(ktab: Any, need: int) -> Any:
    """ktab, or its entries in a larger table, at most half full with ``need`` entries."""
    if 2 * need <= ktab.shape[0]:
        return ktab
    return rehash(ktab, 1 << int(2 * need - 1).bit_length())
