"""Hash ids name prefixes: an id must follow the same parent id in every request.

A hash-form trace gives each block an id standing for the whole prefix up to it (a chained
hash). If id 2 follows id 1 in one request and opens another (``[1, 2, 3]`` then
``[2, 3]``), the trace contradicts itself: the block structure keys blocks by id and hits
16 tokens, the radix structure walks the path and hits none. Loads refuse such a trace
(:class:`IdConflicts` names the first place), or, asked to, count the conflicting uses.

The check remembers each distinct id with the id before it (the first id of a request
notes itself), in an open-addressing table that doubles at 60% full: 28-57 bytes per
distinct id (a 2M-request streamed replay of ``benchmarks/load_replay.py``'s trace, about
6M distinct ids, peaks at 760 MB where it peaked at 387 MB unchecked). ``ignore`` skips it,
for a trace known to be sound whose streamed replay must keep flat memory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from prefixlab._jit import jit
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.types import B1, I64, U64
from prefixlab.workload.hashing import request_salts, salt_per_key
from prefixlab.workload.trace import Trace

#: what a load does with ids reused under another parent: refuse the trace, count them, or
#: not look (no table: a streamed replay's memory stays flat)
IdConflictMode = Literal["error", "warn", "ignore"]
ID_CONFLICT_MODES: tuple[str, ...] = ("error", "warn", "ignore")


@dataclass(frozen=True, slots=True)
class IdConflicts:
    """Uses of a hash id after a parent other than the one it first followed."""

    #: how many uses (an id at a place in a request) follow another parent
    count: int
    #: the first: its request (0-based, counted from the first request checked), id, the
    #: id it follows there (None: it opens the request) and the one it first followed
    request: int
    block_id: int
    parent: int | None
    first_parent: int | None

    def describe(self) -> str:
        def name(p: int | None) -> str:
            return "opening a request" if p is None else f"after id {p}"

        uses = "use" if self.count == 1 else "uses"
        return (
            f"{self.count:,} {uses} of a hash id under another parent than its first (an id "
            f"names a whole prefix); first: request {self.request}, id {self.block_id} "
            f"{name(self.parent)}, first seen {name(self.first_parent)}"
        )


@jit(nogil=True)
def _note(
    values: U64, raw: U64, offsets: I64, keys: U64, parents: U64, used: B1, state: I64
) -> int:
    """Note the parents of rows ``state[0]..`` of a ragged id array in the table (keyed by
    ``values``, the ids as the caches key them; the parent noted as given, ``raw``: one key
    has one salt, so raw parents compare alike); stops
    before a row that could fill it past 60% and returns that row (the caller grows the
    table and calls again), or the number of rows. ``state``: [next row, distinct ids,
    conflicts, first conflict's position, its noted parent]."""
    size = keys.shape[0]
    mask = np.uint64(size - 1)
    for r in range(state[0], offsets.shape[0] - 1):
        a, b = offsets[r], offsets[r + 1]
        if 5 * (state[1] + b - a) > 3 * size:
            state[0] = r
            return r
        for i in range(a, b):
            key = values[i]
            par = raw[i - 1] if i > a else raw[i]  # an opening id notes itself
            j = ((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)) & mask
            while used[j] and keys[j] != key:
                j = (j + np.uint64(1)) & mask
            if not used[j]:
                used[j] = True
                keys[j] = key
                parents[j] = par
                state[1] += 1
            elif parents[j] != par:
                if state[2] == 0:
                    state[3] = i
                    state[4] = np.int64(parents[j])
                state[2] += 1
    state[0] = offsets.shape[0] - 1
    return int(offsets.shape[0] - 1)


@jit(nogil=True)
def _rehash(keys: U64, parents: U64, used: B1, size: int) -> tuple[U64, U64, B1]:
    """The table's entries in a table of ``size`` slots."""
    new_keys = np.zeros(size, np.uint64)
    new_parents = np.zeros(size, np.uint64)
    new_used = np.zeros(size, np.bool_)
    mask = np.uint64(size - 1)
    for s in range(keys.shape[0]):
        if used[s]:
            key = keys[s]
            j = ((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)) & mask
            while new_used[j]:
                j = (j + np.uint64(1)) & mask
            new_used[j] = True
            new_keys[j] = key
            new_parents[j] = parents[s]
    return new_keys, new_parents, new_used


class ParentCheck:
    """Checks requests' hash ids, chunk after chunk, against every id seen before."""

    def __init__(self) -> None:
        self._keys: U64 = np.zeros(1 << 12, np.uint64)
        self._parents: U64 = np.zeros(1 << 12, np.uint64)
        self._used = np.zeros(1 << 12, np.bool_)
        self._distinct = 0
        self._requests = 0
        self._first: IdConflicts | None = None
        self._count = 0

    def add(self, values: U64, offsets: I64, raw: U64 | None = None) -> None:
        """Check the next requests (ids ``values[offsets[r]:offsets[r + 1]]`` for row r;
        ``raw``: the ids as the trace gives them, when ``values`` are salted)."""
        values = np.ascontiguousarray(values, dtype=np.uint64)
        raw = values if raw is None else np.ascontiguousarray(raw, dtype=np.uint64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        rows = offsets.shape[0] - 1
        state = np.array([0, self._distinct, 0, -1, 0], dtype=np.int64)
        table = (self._keys, self._parents, self._used)
        while _note(values, raw, offsets, *table, state) < rows:
            need = 5 * (int(state[1]) + int(offsets[state[0] + 1] - offsets[state[0]]))
            size = self._keys.shape[0]
            while 3 * size < need:
                size *= 2
            table = _rehash(*table, size)
        self._keys, self._parents, self._used = table
        self._distinct = int(state[1])
        if state[2] and self._first is None:
            self._first = self._describe(raw, offsets, int(state[3]), int(state[4]))
        self._count += int(state[2])
        self._requests += rows

    def _describe(self, values: U64, offsets: I64, pos: int, noted: int) -> IdConflicts:
        row = int(np.searchsorted(offsets, pos, side="right")) - 1
        key = int(values[pos])
        return IdConflicts(
            count=0,
            request=self._requests + row,
            block_id=key,
            parent=None if pos == offsets[row] else int(values[pos - 1]),
            first_parent=None if noted == _as_i64(key) else noted & (2**64 - 1),
        )

    @property
    def conflicts(self) -> IdConflicts | None:
        """The conflicts so far (None: none)."""
        if self._first is None:
            return None
        f = self._first
        return IdConflicts(self._count, f.request, f.block_id, f.parent, f.first_parent)


def _as_i64(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


def check_id_parents(values: U64, offsets: I64) -> IdConflicts | None:
    """The conflicts of a whole hash-id array (None: every id keeps its parent)."""
    check = ParentCheck()
    check.add(values, offsets)
    return check.conflicts


class IdConflictWarning(UserWarning):
    """A trace loaded with ``id_conflicts="warn"`` reuses hash ids under other parents."""

    def __init__(self, path: str, conflicts: IdConflicts) -> None:
        why = "the block and radix structures will disagree on them"
        super().__init__(f"{path}: {conflicts.describe()}; {why}")
        self.conflicts = conflicts


def settle(check: ParentCheck, path: str, mode: IdConflictMode) -> None:
    """What a load does with the conflicts found so far: raise the first (``error``), or
    warn with their count (``warn``; call once, at the end)."""
    found = check.conflicts
    if found is None:
        return
    if mode == "error":
        raise TraceFormatError(
            path, None, "hash_ids", f"{found.describe()}; --id-conflicts warn loads it anyway"
        )
    warnings.warn(IdConflictWarning(path, found), stacklevel=3)


def id_conflict_mode(mode: str) -> IdConflictMode:
    """A validated mode (``error`` or ``warn``)."""
    if mode not in ID_CONFLICT_MODES:
        known = ", ".join(ID_CONFLICT_MODES)
        raise ConfigError(f"id_conflicts must be one of {known}, got {mode!r}")
    return mode  # type: ignore[return-value]


def trace_keys(trace: Trace) -> tuple[U64, I64, U64]:
    """A hash-form trace's ids as its caches key them (salted by each request's extra key,
    so one id under two extra keys is two blocks), their offsets, and the ids as given."""
    assert trace.hash_ids is not None
    raw, offsets = trace.hash_ids
    salts = request_salts(trace.extra_key)
    if salts is None:
        return raw, offsets, raw
    return salt_per_key(raw, np.repeat(salts, np.diff(offsets))), offsets, raw
