"""Requests and traces.

A :class:`Trace` stores its requests column-wise (numpy arrays, variable-length content as
flattened values plus offsets). Two content forms exist:

* **token form**: ``input_tokens`` and optionally ``output_tokens`` (token ids);
* **hash form**: ``hash_ids``, one key per block of the sequence the request leaves behind
  (equal key = equal prefix up to and including that block), ``hashed_tokens`` (tokens the
  ids cover) and a trace-level ``block_tokens``. Block j is full when
  ``(j + 1) * block_tokens <= hashed_tokens``.

Block keys are derived once per (block size, extra key) by :meth:`Trace.block_layout`.
"""

from __future__ import annotations

import copy
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from prefixlab._jit import COMPILED, jit
from prefixlab.errors import ConfigError
from prefixlab.types import B1, F64, I64, U64
from prefixlab.workload.hashing import (
    chained_block_keys,
    request_salts,
    salt_hash_ids,
    salt_per_key,
)

#: token ids or block ids: a list, or a numpy integer array (what generators produce)
Ids = Sequence[int] | npt.NDArray[np.integer[Any]]  # Any: of any bit width
#: an array's element type, kept by a function that takes rows of it
ScalarT = TypeVar("ScalarT", bound=np.generic)


@dataclass(slots=True)
class Request:
    """One LLM call. Either token form (``input_tokens``) or hash form (``hash_ids``)."""

    arrival_s: float
    input_length: int
    output_length: int
    session_id: str | None = None
    turn: int = 0
    task: str | None = None
    input_tokens: Ids | None = None
    output_tokens: Ids | None = None
    hash_ids: Ids | None = None
    hashed_tokens: int | None = None
    prompt_text: str | None = None
    #: the model's reply to this prompt, as text (LPC may read it; text loaders keep it)
    reply_text: str | None = None
    #: LoRA adapter / tenant: requests with different extra keys never share blocks
    extra_key: str | None = None
    #: closed loop: the user's think time before this turn, counted from the completion of
    #: the session's previous response (the engine runner schedules by it; replay ignores it)
    think_s: float | None = None


@dataclass(slots=True, frozen=True)
class BlockLayout:
    """Block keys of every request of a trace for one block size, interned to dense ids.

    ``keys[key_offsets[r]:key_offsets[r+1]]`` are the dense key ids of the blocks request r
    leaves cached (full blocks, plus the trailing partial block when asked for).
    ``num_lookup_blocks[r]`` of them (a prefix) are inside the input and may be hit, already
    capped so at least ``min_recompute_tokens`` of the input is recomputed.
    ``lookup_end_tokens[r]`` is the hit length in tokens when all lookup blocks hit.
    ``num_blocks_held[r]`` = ceil((input + output) / block_tokens): what the request holds
    while it runs.
    """

    block_tokens: int
    keys: I64
    key_offsets: I64
    num_lookup_blocks: I64
    lookup_end_tokens: I64
    num_blocks_held: I64
    num_distinct_keys: int
    raw_keys: U64 = field(repr=False)

    def request_keys(self, r: int) -> I64:
        return self.keys[self.key_offsets[r] : self.key_offsets[r + 1]]


class Trace:
    """An ordered, column-wise collection of requests."""

    def __init__(
        self,
        *,
        arrival_s: F64,
        input_length: I64,
        output_length: I64,
        session_id: list[str | None],
        turn: I64,
        task: list[str | None],
        prompt_text: list[str | None] | None = None,
        input_tokens: tuple[I64, I64] | None = None,
        output_tokens: tuple[I64, I64, B1] | None = None,
        hash_ids: tuple[U64, I64] | None = None,
        hashed_tokens: I64 | None = None,
        block_tokens: int | None = None,
        name: str = "trace",
        extra_key: list[str | None] | None = None,
        think_s: F64 | None = None,
        reply_text: list[str | None] | None = None,
    ) -> None:
        n = int(arrival_s.shape[0])
        if (input_tokens is None) == (hash_ids is None):
            raise ConfigError("a trace holds exactly one content form: token ids or hash_ids")
        if hash_ids is not None and (block_tokens is None or block_tokens <= 0):
            raise ConfigError("a hash-form trace needs a positive trace-level block_tokens")
        self.arrival_s = arrival_s
        self.input_length = input_length
        self.output_length = output_length
        self.session_id = session_id
        self.turn = turn
        self.task = task
        self.prompt_text: list[str | None] = prompt_text if prompt_text is not None else [None] * n
        self.reply_text: list[str | None] = reply_text if reply_text is not None else [None] * n
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.hash_ids = hash_ids
        self.hashed_tokens = hashed_tokens
        self.block_tokens = block_tokens
        self.name = name
        self.extra_key: list[str | None] = extra_key if extra_key is not None else [None] * n
        #: per-request think time (NaN: none, the request arrives at ``arrival_s``)
        self.think_s: F64 = think_s if think_s is not None else np.full(n, np.nan)
        self._layouts: dict[tuple[int, str, bool, int, bool], BlockLayout] = {}
        self._sequence: tuple[I64, I64] | None = None
        self._check_consistent()

    def _check_consistent(self) -> None:
        """Lengths must agree with the content (the caches index by them)."""
        n = len(self)
        for name in ("input_length", "output_length", "turn"):
            col = getattr(self, name)
            if col.shape[0] != n:
                raise ConfigError(f"column {name} has {col.shape[0]} rows, not {n}")
            if n and int(col.min()) < 0:
                raise ConfigError(f"request {int(np.argmin(col))}: {name} is negative")
        for name in ("session_id", "task", "prompt_text", "reply_text", "extra_key", "think_s"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"column {name} has {len(getattr(self, name))} rows, not {n}")
        bad_think = np.flatnonzero(self.think_s < 0)
        if bad_think.size:
            raise ConfigError(f"request {int(bad_think[0])}: think_s is negative")
        content: list[tuple[str, I64, B1 | None]] = []
        if self.input_tokens is not None:
            content.append(("input", self.input_tokens[1], None))
        if self.output_tokens is not None:
            content.append(("output", self.output_tokens[1], self.output_tokens[2]))
        for part, offs, present in content:
            counts = np.diff(offs)
            lengths = getattr(self, f"{part}_length")
            wrong = counts != lengths
            bad = np.flatnonzero(wrong if present is None else wrong & present)
            if bad.size:
                r = int(bad[0])
                raise ConfigError(
                    f"request {r}: {part}_length={int(lengths[r])} but it has "
                    f"{int(counts[r])} {part} tokens"
                )
        if self.hashed_tokens is not None:
            over = np.flatnonzero(self.hashed_tokens > self.input_length + self.output_length)
            if over.size:
                r = int(over[0])
                raise ConfigError(
                    f"request {r}: hashed_tokens={int(self.hashed_tokens[r])} exceeds input + "
                    "output tokens"
                )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_requests(
        cls, requests: Iterable[Request], block_tokens: int | None = None, name: str = "trace"
    ) -> Trace:
        """Build a trace from request objects (all of one content form)."""
        builder = TraceBuilder(block_tokens=block_tokens, name=name)
        for r in requests:
            builder.append(r)
        return builder.build()

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def is_hash_form(self) -> bool:
        return self.hash_ids is not None

    def __getitem__(self, i: int) -> Request:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        inp = out = hid = None
        if self.input_tokens is not None:
            v, o = self.input_tokens
            inp = v[o[i] : o[i + 1]].tolist()
        if self.output_tokens is not None and self.output_tokens[2][i]:
            v, o, _ = self.output_tokens
            out = v[o[i] : o[i + 1]].tolist()
        if self.hash_ids is not None:
            hv, ho = self.hash_ids
            hid = hv[ho[i] : ho[i + 1]].tolist()
        return Request(
            arrival_s=float(self.arrival_s[i]),
            input_length=int(self.input_length[i]),
            output_length=int(self.output_length[i]),
            session_id=self.session_id[i],
            turn=int(self.turn[i]),
            task=self.task[i],
            input_tokens=inp,
            output_tokens=out,
            hash_ids=hid,
            hashed_tokens=None if self.hashed_tokens is None else int(self.hashed_tokens[i]),
            prompt_text=self.prompt_text[i],
            reply_text=self.reply_text[i],
            extra_key=self.extra_key[i],
            think_s=None if np.isnan(self.think_s[i]) else float(self.think_s[i]),
        )

    def __iter__(self) -> Iterator[Request]:
        for i in range(len(self)):
            yield self[i]

    def take(self, rows: npt.ArrayLike, name: str | None = None) -> Trace:
        """A new trace of the given rows, in the given order (vectorised)."""
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"row out of range for a trace of {n} requests")
        idx %= max(n, 1)
        kw: dict[str, object] = {}
        if self.input_tokens is not None:
            kw["input_tokens"] = _take_ragged(*self.input_tokens, idx)
        if self.output_tokens is not None:
            vals, offs = _take_ragged(self.output_tokens[0], self.output_tokens[1], idx)
            kw["output_tokens"] = (vals, offs, self.output_tokens[2][idx])
        if self.hash_ids is not None:
            hv, ho = self.hash_ids
            kw["hash_ids"] = _take_ragged(hv, ho, idx)
            assert self.hashed_tokens is not None
            kw["hashed_tokens"] = self.hashed_tokens[idx]
            kw["block_tokens"] = self.block_tokens
        rows_list = idx.tolist()
        return Trace(
            arrival_s=self.arrival_s[idx],
            input_length=self.input_length[idx],
            output_length=self.output_length[idx],
            session_id=[self.session_id[i] for i in rows_list],
            turn=self.turn[idx],
            task=[self.task[i] for i in rows_list],
            prompt_text=[self.prompt_text[i] for i in rows_list],
            reply_text=[self.reply_text[i] for i in rows_list],
            extra_key=[self.extra_key[i] for i in rows_list],
            think_s=self.think_s[idx],
            name=self.name if name is None else name,
            **kw,  # type: ignore[arg-type]
        )

    def time_scaled(self, factor: float) -> Trace:
        """The same requests with the time between arrivals multiplied by ``factor``
        (0.5: twice the request rate), counted from the first arrival; think times scale
        too. Content, and so every block key, is unchanged: any form of trace rescales."""
        if not math.isfinite(factor) or factor <= 0:
            raise ConfigError(f"time_scale must be a positive number, got {factor!r}")
        out = copy.copy(self)
        t0 = float(self.arrival_s.min()) if len(self) else 0.0
        out.arrival_s = t0 + (self.arrival_s - t0) * factor
        out.think_s = self.think_s * factor
        out._layouts = {}
        return out

    def request_rate(self) -> float:
        """Requests per second over the trace's span (first to last arrival): (n - 1) /
        span; NaN when the trace has under two requests or they arrive at one instant."""
        n = len(self)
        span = float(self.arrival_s.max() - self.arrival_s.min()) if n else 0.0
        return (n - 1) / span if n >= 2 and span > 0 else float("nan")

    def sorted_by_arrival(self) -> Trace:
        """The same requests in arrival order (stable: ties keep their order)."""
        order = np.argsort(self.arrival_s, kind="stable")
        if np.array_equal(order, np.arange(len(self))):
            return self
        return self.take(order)

    # ------------------------------------------------------------------ blocks
    def sequence_tokens(self) -> tuple[I64, I64]:
        """Token ids each request leaves behind (input, then output when known), ragged."""
        if self.input_tokens is None:
            raise ConfigError("a hash-form trace has no token ids")
        in_vals, in_offs = self.input_tokens
        if self.output_tokens is None:
            return in_vals, in_offs
        if self._sequence is None:  # computed once: the runners ask for it per request
            vals, offs = _concat_ragged(in_vals, in_offs, *self.output_tokens)
            vals.setflags(write=False)
            offs.setflags(write=False)
            self._sequence = vals, offs
        return self._sequence

    def block_layout(
        self,
        block_tokens: int | None = None,
        extra_key: int | str | None = None,
        cache_partial: bool = False,
        min_recompute_tokens: int = 1,
        intern: bool = True,
    ) -> BlockLayout:
        """Block keys of every request, computed once (vectorised) and memoised.

        ``intern=False`` skips numbering the keys (``keys`` is then empty and
        ``num_distinct_keys`` 0; ``raw_keys`` holds them): for a caller that maps raw keys
        itself, such as a streamed replay, which sees one chunk of the trace at a time."""
        bt = self._resolve_block_tokens(block_tokens)
        if min_recompute_tokens < 0:
            raise ConfigError(f"min_recompute_tokens must be >= 0, got {min_recompute_tokens}")
        memo = (bt, repr(extra_key), cache_partial, min_recompute_tokens, intern)
        if memo not in self._layouts:
            self._layouts[memo] = self._build_layout(
                bt, extra_key, cache_partial, min_recompute_tokens, intern
            )
        return self._layouts[memo]

    def _resolve_block_tokens(self, block_tokens: int | None) -> int:
        if self.is_hash_form:
            if block_tokens is not None and block_tokens != self.block_tokens:
                raise ConfigError(
                    f"block_tokens={block_tokens} does not match this hash-form trace, whose "
                    f"ids cover {self.block_tokens}-token blocks"
                )
            assert self.block_tokens is not None
            return self.block_tokens
        if block_tokens is None:
            raise ConfigError("a token-form trace needs block_tokens to form blocks")
        if block_tokens <= 0:
            raise ConfigError(f"block_tokens must be positive, got {block_tokens}")
        return block_tokens

    def _sequence_keys(
        self, bt: int, extra_key: int | str | None, cache_partial: bool
    ) -> tuple[U64, I64, I64]:
        """Raw keys of the blocks each request leaves behind, and its number of input keys."""
        if self.hash_ids is not None:
            assert self.hashed_tokens is not None
            values, offsets = self.hash_ids
            keyed = self.hashed_tokens // bt
            short = np.flatnonzero(keyed > np.diff(offsets))
            if short.size:
                r = int(short[0])
                raise ConfigError(
                    f"request {r}: hash_ids has {int(np.diff(offsets)[r])} ids but "
                    f"hashed_tokens={int(self.hashed_tokens[r])} claims {int(keyed[r])} full blocks"
                )
            if cache_partial:
                keyed = np.minimum(-(-self.hashed_tokens // bt), np.diff(offsets))
            starts = offsets[:-1]
            take = np.repeat(starts - _starts(keyed)[:-1], keyed) + np.arange(int(keyed.sum()))
            raw = salt_hash_ids(values[take], extra_key)
            salts = request_salts(self.extra_key)
            if salts is not None:
                raw = salt_per_key(raw, np.repeat(salts, keyed))
            in_full = np.minimum(self.input_length // bt, keyed)
            partial_ok = cache_partial & (self.hashed_tokens == self.input_length)
            partial_ok &= (self.input_length % bt > 0) & (keyed > in_full)
            return raw, _starts(keyed), in_full + partial_ok
        seq_vals, seq_offs = self.sequence_tokens()
        raw, key_offs = chained_block_keys(
            seq_vals, seq_offs, bt, extra_key, cache_partial, request_salts(self.extra_key)
        )
        in_full = self.input_length // bt
        lookable = in_full.copy()
        if cache_partial:
            # The input's trailing partial block can only match a cached sequence that ended
            # at the same token, i.e. the same key: it is key number in_full when the
            # request's own sequence ends there (no output tokens given).
            seq_len = np.diff(seq_offs)
            lookable += (self.input_length % bt > 0) & (seq_len == self.input_length)
        return raw, key_offs, lookable

    def _build_layout(
        self,
        bt: int,
        extra_key: int | str | None,
        cache_partial: bool,
        min_recompute: int,
        intern: bool,
    ) -> BlockLayout:
        raw, key_offs, lookable = self._sequence_keys(bt, extra_key, cache_partial)
        if intern:
            dense, num_distinct = _dense_keys(raw, key_offs)
        else:
            dense, num_distinct = np.zeros(0, dtype=np.int64), 0
        # Cap: hit tokens <= input_length - min_recompute_tokens, block-aligned, except a
        # cached trailing partial block which hits as a whole (ends at input_length).
        cap_full = np.maximum(self.input_length - min_recompute, 0) // bt
        in_full = np.minimum(self.input_length // bt, lookable)
        num_lookup = np.minimum(in_full, cap_full)
        partial_hit = (lookable > in_full) & (min_recompute == 0) & (num_lookup == in_full)
        num_lookup = num_lookup + partial_hit
        lookup_end = np.where(partial_hit, self.input_length, num_lookup * bt)
        held = -(-(self.input_length + self.output_length) // bt)
        return BlockLayout(
            block_tokens=bt,
            keys=dense,
            key_offsets=key_offs,
            num_lookup_blocks=num_lookup.astype(np.int64),
            lookup_end_tokens=lookup_end.astype(np.int64),
            num_blocks_held=held.astype(np.int64),
            num_distinct_keys=num_distinct,
            raw_keys=raw,
        )


@jit()
def _table(distinct: U64, k: int, size: int) -> tuple[U64, I64]:
    """An open-addressing table of ``size`` slots holding distinct[:k] (id = position)."""
    mask = np.uint64(size - 1)
    slot_key = np.empty(size, np.uint64)
    slot_id = np.full(size, -1, np.int64)
    for d in range(k):
        key = distinct[d]
        j = ((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)) & mask
        while slot_id[j] >= 0:
            j = (j + np.uint64(1)) & mask
        slot_key[j] = key
        slot_id[j] = d
    return slot_key, slot_id


@jit()
def _intern(raw: U64, key_offs: I64, first_id: I64) -> U64 | None:
    """First-appearance ids of the raw keys through an open-addressing hash table (the
    distinct keys come back in that order), or None when a sequence holds a key twice.
    The table doubles when it is 60% full, so memory follows the distinct keys."""
    size = 1 << 16
    slot_key, slot_id = _table(np.empty(0, np.uint64), 0, size)
    mask = np.uint64(size - 1)
    distinct = np.empty(1 << 15, np.uint64)
    last_req = np.empty(1 << 15, np.int64)
    k = 0
    for r in range(key_offs.shape[0] - 1):
        for i in range(key_offs[r], key_offs[r + 1]):
            key = raw[i]
            j = ((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)) & mask
            while slot_id[j] >= 0 and slot_key[j] != key:
                j = (j + np.uint64(1)) & mask
            d = slot_id[j]
            if d < 0:
                if k == distinct.shape[0]:
                    distinct = np.concatenate((distinct, np.empty(k, np.uint64)))
                    last_req = np.concatenate((last_req, np.empty(k, np.int64)))
                d = k
                distinct[d] = key
                last_req[d] = r
                k += 1
                slot_key[j] = key
                slot_id[j] = d
                if 5 * k > 3 * size:
                    size *= 2
                    slot_key, slot_id = _table(distinct, k, size)
                    mask = np.uint64(size - 1)
            elif last_req[d] == r:
                return None
            else:
                last_req[d] = r
            first_id[i] = d
    return distinct[:k].copy()  # type: ignore[no-any-return]  # (mypy, under @jit)


def _dense_keys(raw: U64, key_offs: I64) -> tuple[I64, int]:
    """Dense ids of the raw keys (their rank among the distinct keys, as ``np.unique``
    numbers them) and how many there are, checking that no sequence holds a key twice (a
    key names a whole prefix). Compiled: one hash-table pass, then a sort of the distinct
    keys only; else (and to report a repeat) one stable sort of them all."""
    n = raw.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    if COMPILED:
        first = np.empty(n, dtype=np.int64)
        distinct = _intern(raw, key_offs, first)
        if distinct is not None:
            rank = np.empty(distinct.shape[0], dtype=np.int64)
            rank[np.argsort(distinct)] = np.arange(distinct.shape[0], dtype=np.int64)
            return rank[first], int(distinct.shape[0])
    order = np.argsort(raw, kind="stable")
    ranked = raw[order]
    new = np.empty(n, dtype=np.bool_)
    new[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
    # Equal keys sit together in position order, so a repeat within one sequence is an
    # equal neighbour from the same request.
    req = np.repeat(np.arange(key_offs.shape[0] - 1), np.diff(key_offs))[order]
    same = ~new[1:] & (req[1:] == req[:-1])
    if same.any():
        dup = np.flatnonzero(same) + 1  # report the first request's smallest repeated key
        i = int(dup[np.lexsort((ranked[dup], req[dup]))[0]])
        raise ConfigError(
            f"request {int(req[i])}: block id {int(ranked[i])} appears twice in one sequence"
        )
    dense = np.empty(n, dtype=np.int64)
    dense[order] = np.cumsum(new) - 1
    return dense, int(np.count_nonzero(new))


def _starts(counts: I64) -> I64:
    out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _take_ragged(
    vals: npt.NDArray[ScalarT], offs: I64, idx: I64
) -> tuple[npt.NDArray[ScalarT], I64]:
    """Rows ``idx`` of a ragged array, as a new ragged array."""
    lengths = np.diff(offs)[idx]
    new_offs = _starts(lengths)
    src = np.repeat(offs[:-1][idx] - new_offs[:-1], lengths) + np.arange(int(new_offs[-1]))
    return vals[src], new_offs


def _concat_ragged(
    a_vals: I64, a_offs: I64, b_vals: I64, b_offs: I64, b_present: B1
) -> tuple[I64, I64]:
    """Per-row concatenation of two ragged arrays (rows of b absent where not present)."""
    a_len = np.diff(a_offs)
    b_len = np.where(b_present, np.diff(b_offs), 0)
    offs = _starts(a_len + b_len)
    out = np.empty(int(offs[-1]), dtype=np.int64)
    rows = np.arange(a_len.shape[0])
    a_dst = (
        np.repeat(offs[:-1], a_len)
        + np.arange(int(a_len.sum()))
        - np.repeat(_starts(a_len)[:-1], a_len)
    )
    out[a_dst] = a_vals
    b_src_rows = np.repeat(rows, b_len)
    b_rel = np.arange(int(b_len.sum())) - np.repeat(_starts(b_len)[:-1], b_len)
    out[offs[b_src_rows] + a_len[b_src_rows] + b_rel] = b_vals[b_offs[b_src_rows] + b_rel]
    return out, offs


def to_hash_form(trace: Trace, block_tokens: int, extra_key: int | str | None = None) -> Trace:
    """Convert a token-form trace to hash form: ids = chained keys of each sequence's blocks.

    Every block of the sequence (input, plus output when the trace has output tokens) gets
    an id, the trailing partial one included; ``hashed_tokens`` is the sequence length. A
    replay of the result equals a replay of the original (tested).
    """
    if trace.is_hash_form:
        raise ConfigError("trace is already in hash form")
    seq_vals, seq_offs = trace.sequence_tokens()
    raw, key_offs = chained_block_keys(
        seq_vals, seq_offs, block_tokens, extra_key, True, request_salts(trace.extra_key)
    )
    return Trace(
        arrival_s=trace.arrival_s,
        input_length=trace.input_length,
        output_length=trace.output_length,
        session_id=trace.session_id,
        turn=trace.turn,
        task=trace.task,
        prompt_text=trace.prompt_text,
        reply_text=trace.reply_text,
        think_s=trace.think_s,
        # The per-request salts are already in the ids: do not apply them twice.
        hash_ids=(raw, key_offs),
        hashed_tokens=np.diff(seq_offs),
        block_tokens=block_tokens,
        name=trace.name,
    )


class TraceBuilder:
    """Accumulates requests column by column, compactly (8 bytes per token id).

    Loaders stream a file through a builder, so memory holds the columns, never the file
    or one Python object per token. All requests must share one content form.
    """

    def __init__(
        self, block_tokens: int | None = None, name: str = "trace", sort_by_arrival: bool = False
    ) -> None:
        self.block_tokens = block_tokens
        self.name = name
        #: rows arrive session by session (generated times): sort them when building
        self.sort_by_arrival = sort_by_arrival
        self._token_form: bool | None = None
        self._arrival = array("d")
        self._inp_len = array("q")
        self._out_len = array("q")
        self._turn = array("q")
        self._think = array("d")
        self._hashed = array("q")
        self._session: list[str | None] = []
        self._task: list[str | None] = []
        self._text: list[str | None] = []
        self._reply: list[str | None] = []
        self._extra: list[str | None] = []
        self._content = array("q")  # input tokens (token form)
        self._content_offs = array("q", [0])
        self._out = array("q")
        self._out_offs = array("q", [0])
        self._out_present = array("b")
        self._ids = array("Q")  # hash ids (hash form)
        self._ids_offs = array("q", [0])

    def __len__(self) -> int:
        return len(self._arrival)

    def append(self, r: Request) -> None:
        """Add one request; a request of the other content form is a ConfigError."""
        i = len(self)
        token_form = r.hash_ids is None
        if self._token_form is None:
            self._token_form = token_form
        elif token_form != self._token_form:
            raise ConfigError(f"request {i}: all requests of a trace need the same form")
        if token_form:
            if r.input_tokens is None:
                raise ConfigError(f"request {i}: neither input_tokens nor hash_ids given")
            _extend(self._content, r.input_tokens)
            self._content_offs.append(len(self._content))
            self._out_present.append(r.output_tokens is not None)
            if r.output_tokens is not None:
                _extend(self._out, r.output_tokens)
            self._out_offs.append(len(self._out))
        else:
            assert r.hash_ids is not None
            _extend(self._ids, r.hash_ids)
            self._ids_offs.append(len(self._ids))
            self._hashed.append(r.input_length if r.hashed_tokens is None else r.hashed_tokens)
        self._arrival.append(r.arrival_s)
        self._inp_len.append(r.input_length)
        self._out_len.append(r.output_length)
        self._turn.append(r.turn)
        self._think.append(np.nan if r.think_s is None else r.think_s)
        self._session.append(r.session_id)
        self._task.append(r.task)
        self._text.append(r.prompt_text)
        self._reply.append(r.reply_text)
        self._extra.append(r.extra_key)

    def build(self) -> Trace:
        if not len(self):
            raise ConfigError("a trace needs at least one request")
        kw: dict[str, object] = {}
        if self._token_form:
            kw["input_tokens"] = (_np(self._content), _np(self._content_offs))
            present = np.frombuffer(self._out_present, dtype=np.int8).astype(bool)
            if present.any():
                kw["output_tokens"] = (_np(self._out), _np(self._out_offs), present)
        else:
            ids = np.frombuffer(self._ids, dtype=np.uint64).copy()
            kw["hash_ids"] = (ids, _np(self._ids_offs))
            kw["hashed_tokens"] = _np(self._hashed)
            kw["block_tokens"] = self.block_tokens
        trace = Trace(
            arrival_s=np.frombuffer(self._arrival, dtype=np.float64).copy(),
            input_length=_np(self._inp_len),
            output_length=_np(self._out_len),
            session_id=self._session,
            turn=_np(self._turn),
            task=self._task,
            prompt_text=self._text,
            reply_text=self._reply,
            extra_key=self._extra,
            think_s=np.frombuffer(self._think, dtype=np.float64).copy(),
            name=self.name,
            **kw,  # type: ignore[arg-type]
        )
        return trace.sorted_by_arrival() if self.sort_by_arrival else trace


def _extend(buf: array[int], values: Ids) -> None:
    if isinstance(values, np.ndarray):
        dtype = np.uint64 if buf.typecode == "Q" else np.int64
        if values.size and dtype is np.int64 and int(values.min()) < 0:
            raise ConfigError(f"negative token id {int(values.min())}")
        buf.frombytes(np.ascontiguousarray(values, dtype=dtype).tobytes())
    else:
        buf.extend(values)


def _np(a: array[int]) -> I64:
    return np.frombuffer(a, dtype=np.int64).copy() if len(a) else np.zeros(0, dtype=np.int64)
