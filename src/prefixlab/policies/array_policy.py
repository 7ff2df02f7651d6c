"""The base class of the array-state policies (ARC, S3-FIFO, LeCaR, LPC, WA, UniCache,
opt-online): their state is :mod:`prefixlab.policies._arrays`'s two arrays, their hooks
are jit functions (:mod:`prefixlab.policies.hooks`), run in batches through
:mod:`prefixlab.policies._dispatch` by this class and entry by entry by the replay and
engine kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from prefixlab.cache.view import EntryView
from prefixlab.errors import ConfigError
from prefixlab.policies import _dispatch
from prefixlab.policies._arrays import (
    ACCESS,
    EVICT,
    EVICTABLE,
    FS,
    GSEQ0,
    INSERT,
    MEMBER,
    MISS,
    NFREE,
    NOW,
    PINNED,
    POSITION,
    REMOVE,
    REQ,
    SC,
    SPLIT,
    UPDATE,
    ChunkPasses,
    State,
    grow_state,
)
from prefixlab.policies.base import EvictionPolicy
from prefixlab.types import F64, I64
from prefixlab.workload.trace import Trace


class ArrayPolicy(EvictionPolicy):
    """Base of the policies whose hooks are jit functions over :func:`new_state`.

    A subclass sets ``code`` (its number in :mod:`prefixlab.policies._dispatch`) and
    ``init_state``; the hooks below call the dispatcher in batches. ``aux`` holds the
    per-request numbers a policy reads from the trace (row 0: arrival times, then the
    policy's own rows; none for policies without ``needs_trace``)."""

    code: ClassVar[int] = -1
    #: how a streamed replay (:mod:`prefixlab.runner.stream`) serves a ``needs_trace``
    #: policy: "" (it cannot: the trace is loaded whole), "columns" (``chunk_columns`` as the
    #: chunks are read), "two-pass" (those, then ``stream_prepare`` on the spilled chunks
    #: before the replay starts)
    streams: ClassVar[str] = ""
    #: reads the engine's waiting queue through the dispatcher's ``waiting_*`` functions,
    #: which the compiled engine calls too
    compiled_waiting: ClassVar[bool] = False
    reads_access_metadata = False
    aux: F64 = np.zeros((1, 0))

    def init_state(self, num_entries: int) -> State:
        raise NotImplementedError

    # ------------------------------------------------------------------ streamed traces
    def chunk_columns(self, chunk: Trace, r0: int) -> F64:
        """A streamed replay's chunk of the trace (requests r0, r0 + 1, ..., read in order,
        r0 = 0 first): its ``aux`` columns, as :meth:`prepare_trace` would give these
        requests of the whole trace. State carried from chunk to chunk (a session's last
        arrival) lives in the policy."""
        raise NotImplementedError

    def stream_prepare(self, passes: ChunkPasses, num_requests: int) -> None:
        """(``streams == "two-pass"``) What the policy learns from the whole trace before
        the replay. ``passes(forward)`` iterates over the chunks (first request, layout,
        this policy's columns) first to last, or last to first, and may be called several
        times; columns changed in place are kept for the replay."""
        raise NotImplementedError

    def columns_done(self, cols: F64, base: int) -> None:
        """A streamed replay is done with these columns (requests base, base + 1, ...):
        what the hooks wrote in them (UniCache's weights) is kept here if anywhere."""

    def carried_from(self) -> int:
        """The first request whose columns the next chunk's hooks may still read (the
        stream keeps them; default: none before the next chunk)."""
        return 1 << 62

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._batch = _dispatch.batch
        self._reserve = _dispatch.reserve
        self._waiting = _dispatch.waiting
        self.state = self.init_state(view.num_entries)
        self.rng = getattr(self, "rng", np.random.default_rng(0))

    def _room(self, keys: I64) -> None:
        """Grow the state for more entries (a radix tree grew) or larger keys: the ghost
        lists index by key, and an entry's key is announced by on_insert, on_update (a
        radix split moved it) or on_miss before any hook reads it."""
        kmax = int(keys.max()) + 1 if keys.shape[0] else 0
        self.state = grow_state(self.state, self.view.num_entries, kmax)

    def _stamp(self, n: int = 0) -> State:
        """The state, with room for n hook calls, stamped with the request and the time."""
        if 4 * self.view.num_entries + 64 > self.state[0].shape[1]:  # O(1): the view grew
            self.state = grow_state(self.state, self.view.num_entries, 0)
        ist, fst = self._reserve(self.code, *self.state, n)
        self.state = ist, fst
        ist[SC, REQ] = self.view.request_index
        fst[FS, NOW] = self.now()
        return ist, fst

    def _run(self, hook: int, xs: I64, y: int = -1) -> int:
        if self.needs_trace and hook in (INSERT, ACCESS) and not self.aux.shape[1]:
            raise ConfigError(f"policy '{self.name}' needs the trace (run it through a runner)")
        ist, fst = self._stamp(int(xs.shape[0]))
        v = self.view
        n = self._batch(self.code, ist, fst, hook, xs, y, v.key, v.depth, self.rng, self.aux)
        return int(n)

    def on_insert(self, entries: I64) -> None:
        if entries.shape[0]:
            self._room(self.view.key[entries])
            self._run(INSERT, entries)

    def on_update(self, entries: I64) -> None:
        self._room(self.view.key[entries])
        if entries.shape[0]:
            self._run(UPDATE, entries)

    def on_split(self, upper: int, lower: int) -> None:
        one = np.array([upper], dtype=np.int64)
        self._room(self.view.key[one])
        self._run(SPLIT, one, lower)

    def on_access(self, entries: I64) -> None:
        if entries.shape[0]:
            self._run(ACCESS, entries)

    def on_evictable(self, entries: I64) -> None:
        if entries.shape[0]:
            self._run(EVICTABLE, entries)

    def on_pinned(self, entries: I64) -> None:
        if entries.shape[0]:
            self._run(PINNED, entries)

    def on_remove(self, entries: I64) -> None:
        if entries.shape[0]:
            self._run(REMOVE, entries)

    def on_miss(self, keys: I64) -> None:
        self._room(keys)
        self._run(MISS, keys)

    def evict(self, n: int) -> I64:
        out = np.empty(n, np.int64)
        return out[: self._run(EVICT, out)]

    def on_waiting(self, waiting_keys: Sequence[I64]) -> None:
        """For a policy with ``compiled_waiting`` (the engine kernel feeds it the same way):
        the waiting queue's lookup keys with their requests' positions."""
        if not self.compiled_waiting:
            return
        sizes = [k.shape[0] for k in waiting_keys]
        keys = np.concatenate(waiting_keys) if waiting_keys else np.zeros(0, np.int64)
        keys = keys.astype(np.int64, copy=False)
        pos = np.repeat(np.arange(len(waiting_keys), dtype=np.int64), sizes)
        self._room(keys)
        ist, fst = self._stamp()
        self._waiting(self.code, ist, fst, keys, pos, self.view.key, self.view.depth)

    def num_evictable(self) -> int:
        return int(self.state[0][SC, NFREE])

    # For inspection and tests: the queues' members and the ghosts' keys, oldest first.
    def _queue(self, q: int) -> list[int]:
        ist = self.state[0]
        members = np.flatnonzero(ist[MEMBER] == q + 1)
        return members[np.argsort(ist[POSITION][members])].tolist()  # type: ignore[no-any-return]

    def _ghost(self, g: int) -> list[int]:
        gseq = self.state[0][GSEQ0 + g]
        keys = np.flatnonzero(gseq >= 0)
        return keys[np.argsort(gseq[keys])].tolist()  # type: ignore[no-any-return]
