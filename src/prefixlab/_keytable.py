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

__all__ = ["kcell", "khash", "kslot", "more_slots", "rehash", "sweep_slots", "with_room"]


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


# A replay given raw 64-bit keys maps each to a small slot number, whose column the
# policies' per-key state rows use: a table (key -> slot) of the keys in use, ``skey[s]``
# slot s's key, ``sfree`` a stack of unused slots (``counts[at]`` of them, top last).
@jit(nrt=False)
def kslot(ktab: Any, skey: Any, sfree: Any, counts: Any, at: int, key: int) -> int:
    """key's slot, given a free one (and a cell) if it has none."""
    j = kcell(ktab, key)
    if ktab[j, 1] < 0:
        counts[at] -= 1
        s = sfree[counts[at]]
        ktab[j, 0] = key
        ktab[j, 1] = s
        skey[s] = key
    return int(ktab[j, 1])


@jit()
def sweep_slots(
    ktab: Any,
    sfree: Any,
    counts: Any,
    at: int,
    held: Any,
    ist: Any,
    ghost_rows: Any,
    clear_rows: Any,
    keep_rows: Any,
) -> int:
    """Free the slots of the keys nothing uses: not ``held`` (by the structure), named by
    no ghost list (rows ``ghost_rows`` of the array policy's ``ist``, -1 when absent), 0 in
    its rows ``keep_rows``. A freed slot's rows ``clear_rows`` are zeroed for its next
    key. Returns how many slots are free; ``ktab`` is rebuilt in place."""
    for i in range(ktab.shape[0]):
        s = ktab[i, 1]
        if s < 0:
            continue
        live = held[s]
        for g in ghost_rows:
            live = live or ist[g, s] >= 0
        for k in keep_rows:
            live = live or ist[k, s] != 0
        if live:
            continue
        ktab[i, 1] = -1
        for c in clear_rows:
            ist[c, s] = 0
        sfree[counts[at]] = s
        counts[at] += 1
    ktab[:] = rehash(ktab, ktab.shape[0])
    return int(counts[at])


def more_slots(
    ktab: Any, skey: Any, sfree: Any, counts: Any, at: int, num_slots: int
) -> tuple[Any, Any, Any]:
    """(ktab, skey, sfree) with ``num_slots`` slots, the new ones free (under the old
    free ones) and the table at most half full; ``counts[at]`` updated."""
    old = skey.shape[0]
    if num_slots <= old:
        return ktab, skey, sfree
    skey = np.concatenate((skey, np.zeros(num_slots - old, np.int64)))
    nfree = int(counts[at])
    fresh = np.arange(num_slots - 1, old - 1, -1, dtype=np.int64)
    stack = np.empty(num_slots, np.int64)  # room for every slot to be free
    stack[: fresh.shape[0]] = fresh
    stack[fresh.shape[0] : fresh.shape[0] + nfree] = sfree[:nfree]
    counts[at] = nfree + fresh.shape[0]
    return with_room(ktab, num_slots), skey, stack
