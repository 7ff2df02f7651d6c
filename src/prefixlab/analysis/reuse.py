"""Reuse analysis: who reuses which blocks, of which phase, at which position, and when.

Everything works on the trace's block layout (:meth:`Trace.block_layout`), in trace order
(the order replay serves requests in), with an **infinite cache**: a key, once stored, stays.

* Request r *stores* all its keyed blocks ``layout.request_keys(r)`` (full blocks of input,
  plus output when the trace has output tokens; hash form: ``j < hashed_tokens // B``).
  The first ``layout.num_lookup_blocks[r]`` of them are its *lookup* blocks (inside the
  input, capped so one token is recomputed, as replay does).
* Block j of request r is a **prefill** block when ``(j + 1) * B <= input_length[r]``
  (``j < input_length // B``, in both forms), else a **decode** block (it holds output)::

      input_length = 7, output = 3, B = 2     tokens: i i | i i | i i | i o | o o
                                              block:   0     1     2     3     4
                                              phase:   P     P     P     D     D
                                              lookup:  0..2 (at most (7 - 1) // 2 = 3)

* A **reuse** is a lookup block of r whose key an earlier request stored. It is attributed
  to the **most recent previous occurrence** of the key: the last request before r whose
  blocks hold it (keys are stored by every request that holds them, hits included, so
  this is the request that last stored or used it). A chat turn that reuses the shared
  system prompt right after another session's turn used it counts as inter-session: the
  attribution says whose copy kept the block warm, not who wrote it first.
  *Intra-session* when that request has the same non-null ``session_id`` (else
  inter-session); *intra-task* when its ``task`` equals r's, a null task counting as the
  task ``"(none)"``. Counts and shares are per task of the reusing request and overall.
  With chained keys the number of reuses equals the hit blocks of an infinite-cache replay.
* **Reused later**: a stored block (one per request and position) is reused later when a
  later request looks its key up. Reported for prefill and decode blocks per task of the
  storing request, and for prefill blocks by position bin (``POSITION_BINS``: 0, 1, 2, 3,
  4-7, 8-15, 16-31, 32-63, 64-127, 128+; powers of two, so a short prompt's first blocks
  and a long context's tail each get a bin).
* **Inter-turn gaps**: for each session, arrival of its (k+1)-th request minus arrival of
  its k-th, sorted by arrival. Traces carry arrivals only, so a gap includes the previous
  turn's service time as well as the user's think time. A gap belongs to the task of the
  later request. The log-normal fit is the MLE on the positive gaps: ``mu`` and ``sigma``
  are the mean and (population) standard deviation of their logarithms; zero gaps are
  counted apart. ``ks_distance`` is the largest distance between the empirical and the
  fitted CDF.
* **Headroom**: the token hit ratio of an infinite cache (as in ``trace stats``) and, at a
  given capacity, of LRU and of offline OPT (Belady, prefix-aware), all by replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from prefixlab.analysis.gaps import (
    NO_TASK,
    GapFit,
    fit_lognormal,
    label_codes,
    session_gaps,
    task_groups,
)
from prefixlab.analysis.stats import infinite_cache_token_hit_ratio
from prefixlab.errors import ConfigError
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.types import B1, I64, Row
from prefixlab.workload.trace import BlockLayout, Trace

V = TypeVar("V")

ALL = "(all)"
#: (first, last) block position of each bin, last None = open
POSITION_BINS: tuple[tuple[int, int | None], ...] = (
    (0, 0),
    (1, 1),
    (2, 2),
    (3, 3),
    (4, 7),
    (8, 15),
    (16, 31),
    (32, 63),
    (64, 127),
    (128, None),
)
POSITION_LABELS = tuple(
    str(lo) if hi == lo else f"{lo}+" if hi is None else f"{lo}-{hi}" for lo, hi in POSITION_BINS
)


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass(slots=True, frozen=True)
class Attribution:
    """Reuses of one group of reusing requests, by where the reused copy came from."""

    num_lookup_blocks: int
    num_reuses: int
    num_intra_session: int
    num_intra_task: int

    def as_dict(self) -> dict[str, int | float | None]:
        n = self.num_reuses
        inter_session, inter_task = n - self.num_intra_session, n - self.num_intra_task
        return {
            "num_lookup_blocks": self.num_lookup_blocks,
            "num_reuses": n,
            "reuse_share_of_lookups": _share(n, self.num_lookup_blocks),
            "num_intra_session": self.num_intra_session,
            "num_inter_session": inter_session,
            "intra_session_share": _share(self.num_intra_session, n),
            "inter_session_share": _share(inter_session, n),
            "num_intra_task": self.num_intra_task,
            "num_inter_task": inter_task,
            "intra_task_share": _share(self.num_intra_task, n),
            "inter_task_share": _share(inter_task, n),
        }


@dataclass(slots=True, frozen=True)
class PhaseReuse:
    """Stored prefill and decode blocks of one group, and how many were reused later."""

    num_prefill_stored: int
    num_prefill_reused: int
    num_decode_stored: int
    num_decode_reused: int

    @property
    def prefill_reuse_fraction(self) -> float | None:
        return _share(self.num_prefill_reused, self.num_prefill_stored)

    @property
    def decode_reuse_fraction(self) -> float | None:
        return _share(self.num_decode_reused, self.num_decode_stored)

    def as_dict(self) -> dict[str, int | float | None]:
        return {
            "num_prefill_stored": self.num_prefill_stored,
            "num_prefill_reused": self.num_prefill_reused,
            "prefill_reuse_fraction": self.prefill_reuse_fraction,
            "num_decode_stored": self.num_decode_stored,
            "num_decode_reused": self.num_decode_reused,
            "decode_reuse_fraction": self.decode_reuse_fraction,
        }


@dataclass(slots=True, frozen=True)
class PositionReuse:
    """Stored prefill blocks of one group per position bin, and how many were reused later."""

    num_stored: tuple[int, ...]
    num_reused: tuple[int, ...]

    @property
    def probability(self) -> tuple[float | None, ...]:
        return tuple(_share(r, s) for r, s in zip(self.num_reused, self.num_stored, strict=True))

    def as_dict(self) -> dict[str, list[int] | list[float | None]]:
        return {
            "num_stored": list(self.num_stored),
            "num_reused": list(self.num_reused),
            "probability": list(self.probability),
        }


@dataclass(slots=True, frozen=True)
class Headroom:
    """Token hit ratios: infinite cache; LRU and OPT at ``capacity_blocks`` when given."""

    infinite_token_hit_ratio: float
    capacity_blocks: int | None = None
    lru_token_hit_ratio: float | None = None
    opt_token_hit_ratio: float | None = None

    def as_dict(self) -> dict[str, int | float | None]:
        lru, opt = self.lru_token_hit_ratio, self.opt_token_hit_ratio
        inf = self.infinite_token_hit_ratio
        return {
            "infinite_token_hit_ratio": inf,
            "capacity_blocks": self.capacity_blocks,
            "lru_token_hit_ratio": lru,
            "opt_token_hit_ratio": opt,
            "opt_minus_lru": None if opt is None or lru is None else opt - lru,
            "infinite_minus_opt": None if opt is None else inf - opt,
        }


@dataclass(slots=True, frozen=True)
class ReuseAnalysis:
    """The whole analysis; maps are keyed by task label, ``ALL`` first."""

    name: str
    num_requests: int
    num_sessions: int
    block_tokens: int
    form: str
    attribution: dict[str, Attribution]
    phase: dict[str, PhaseReuse]
    position: dict[str, PositionReuse]
    gaps: dict[str, GapFit]
    headroom: Headroom

    def groups(self) -> list[str]:
        """The groups worth showing: ``ALL`` and each task, or ``ALL`` alone for one task."""
        groups = list(self.attribution)
        return groups if len(groups) > 2 else [ALL]

    def as_dict(self) -> Row:
        """JSON-ready: plain numbers, lists and None."""
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "num_sessions": self.num_sessions,
            "block_tokens": self.block_tokens,
            "form": self.form,
            "tasks": [t for t in self.attribution if t != ALL],
            "session_task_reuse": {t: a.as_dict() for t, a in self.attribution.items()},
            "phase_reuse": {t: p.as_dict() for t, p in self.phase.items()},
            "position_reuse": {
                "bins": list(POSITION_LABELS),
                "by_task": {t: p.as_dict() for t, p in self.position.items()},
            },
            "gaps": {t: g.as_dict() for t, g in self.gaps.items()},
            "headroom": self.headroom.as_dict(),
        }


# ------------------------------------------------------------------ block-level arrays
@dataclass(slots=True, frozen=True)
class _Blocks:
    """One row per stored block of the layout (flattened, request-major)."""

    request: I64
    position: I64
    key: I64
    is_lookup: B1
    is_prefill: B1


def _blocks(trace: Trace, layout: BlockLayout) -> _Blocks:
    counts = np.diff(layout.key_offsets)
    request = np.repeat(np.arange(len(trace), dtype=np.int64), counts)
    position = np.arange(request.shape[0], dtype=np.int64) - layout.key_offsets[request]
    full_input_blocks = trace.input_length // layout.block_tokens
    return _Blocks(
        request=request,
        position=position,
        key=layout.keys,
        is_lookup=position < layout.num_lookup_blocks[request],
        is_prefill=position < full_input_blocks[request],
    )


def reuse_sources(layout: BlockLayout) -> I64:
    """For each block of ``layout.keys``: the request its reuse is attributed to, else -1.

    -1 when the block is not a lookup block or no earlier request held its key; otherwise
    the most recent earlier request whose blocks hold the key.
    """
    counts = np.diff(layout.key_offsets)
    request = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    # Sort by key, then request: a key's previous occurrence is the row before it (a
    # request holds a key at most once, so that row is an earlier request).
    order = np.lexsort((request, layout.keys))
    keys_sorted, req_sorted = layout.keys[order], request[order]
    prev_sorted = np.full(order.shape[0], -1, dtype=np.int64)
    same = keys_sorted[1:] == keys_sorted[:-1]
    prev_sorted[1:][same] = req_sorted[:-1][same]
    prev = np.empty_like(prev_sorted)
    prev[order] = prev_sorted
    position = np.arange(request.shape[0], dtype=np.int64) - layout.key_offsets[request]
    return np.where(position < layout.num_lookup_blocks[request], prev, -1)


def _reused_later(blocks: _Blocks, num_keys: int) -> B1:
    """For each stored block: does a later request look its key up?"""
    last_lookup = np.full(max(num_keys, 1), -1, dtype=np.int64)
    np.maximum.at(last_lookup, blocks.key[blocks.is_lookup], blocks.request[blocks.is_lookup])
    return last_lookup[blocks.key] > blocks.request


def position_bin(position: I64) -> I64:
    """Bin index of block positions (``POSITION_BINS``): 0-3 alone, then powers of two."""
    pos = np.asarray(position, dtype=np.int64)
    log2 = np.floor(np.log2(np.maximum(pos, 1))).astype(np.int64)
    return np.where(pos < 4, pos, np.minimum(log2 + 2, len(POSITION_BINS) - 1))


def _per_group(codes: I64, num_groups: int, mask: B1) -> list[int]:
    """Counts of ``mask`` per group, then the overall count (index ``num_groups``)."""
    per = np.bincount(codes[mask], minlength=num_groups)
    return [*(int(c) for c in per), int(mask.sum())]


# ------------------------------------------------------------------ the analyses
def _attribution(
    trace: Trace, layout: BlockLayout, blocks: _Blocks, task: I64, names: list[str]
) -> dict[str, Attribution]:
    session, _ = label_codes(trace.session_id, None)
    source = reuse_sources(layout)
    reuse = source >= 0
    src = np.where(reuse, source, 0)
    same_session = reuse & (session[blocks.request] >= 0)
    same_session &= session[src] == session[blocks.request]
    same_task = reuse & (task[src] == task[blocks.request])
    group = task[blocks.request]
    k = len(names)
    lookups = _per_group(group, k, blocks.is_lookup)
    reuses = _per_group(group, k, reuse)
    intra_s = _per_group(group, k, same_session)
    intra_t = _per_group(group, k, same_task)
    labels = [*names, ALL]
    out = {
        labels[i]: Attribution(lookups[i], reuses[i], intra_s[i], intra_t[i]) for i in range(k + 1)
    }
    return _all_first(out)


def _all_first(groups: dict[str, V]) -> dict[str, V]:
    return {ALL: groups[ALL], **{k: v for k, v in groups.items() if k != ALL}}


def _phase_and_position(
    blocks: _Blocks, later: B1, task: I64, names: list[str]
) -> tuple[dict[str, PhaseReuse], dict[str, PositionReuse]]:
    group = task[blocks.request]
    k = len(names)
    pre, dec = blocks.is_prefill, ~blocks.is_prefill
    counts = [_per_group(group, k, m) for m in (pre, pre & later, dec, dec & later)]
    labels = [*names, ALL]
    phase = {labels[i]: PhaseReuse(*(c[i] for c in counts)) for i in range(k + 1)}
    num_bins = len(POSITION_BINS)
    bins = position_bin(blocks.position[pre])
    cell = group[pre] * num_bins + bins
    size = (k + 1) * num_bins
    stored = np.bincount(cell, minlength=size).reshape(k + 1, num_bins)
    reused = np.bincount(cell[later[pre]], minlength=size).reshape(k + 1, num_bins)
    stored[k] = stored[:k].sum(axis=0)
    reused[k] = reused[:k].sum(axis=0)
    position = {
        labels[i]: PositionReuse(tuple(stored[i].tolist()), tuple(reused[i].tolist()))
        for i in range(k + 1)
    }
    return _all_first(phase), _all_first(position)


def _token_hit_ratio(trace: Trace, policy: str, capacity_blocks: int, bt: int | None) -> float:
    res = replay(trace, policy, ReplayConfig(capacity_blocks=capacity_blocks, block_tokens=bt))
    return float(res.metrics["token_hit_ratio"])


def headroom(
    trace: Trace, block_tokens: int | None = None, capacity_blocks: int | None = None
) -> Headroom:
    """Infinite-cache token hit ratio; LRU and OPT at ``capacity_blocks`` when given."""
    layout = trace.block_layout(block_tokens)
    if capacity_blocks is not None:
        _check_capacity(layout, capacity_blocks)
    inf = infinite_cache_token_hit_ratio(trace, block_tokens)  # as ``trace stats``
    if capacity_blocks is None:
        return Headroom(inf)
    lru = _token_hit_ratio(trace, "lru", capacity_blocks, block_tokens)
    opt = _token_hit_ratio(trace, "opt", capacity_blocks, block_tokens)
    return Headroom(inf, capacity_blocks, lru, opt)


def _check_capacity(layout: BlockLayout, capacity_blocks: int) -> None:
    if capacity_blocks <= 0:
        raise ConfigError(f"--capacity-blocks must be positive, got {capacity_blocks}")
    r = int(np.argmax(layout.num_blocks_held))
    need = int(layout.num_blocks_held[r])
    if capacity_blocks < need:
        raise ConfigError(
            f"--capacity-blocks {capacity_blocks} is too small: request {r} holds {need} blocks "
            f"of {layout.block_tokens} tokens while it runs; give at least {need}"
        )


def analyze_reuse(
    trace: Trace, block_tokens: int | None = None, capacity_blocks: int | None = None
) -> ReuseAnalysis:
    """Every reuse analysis of ``trace`` (see the module docstring for the definitions).

    Args:
        trace: the requests, served in trace order.
        block_tokens: tokens per block (token form; hash form uses the trace's own).
        capacity_blocks: a cache size for the LRU and OPT headroom replays (optional).
    """
    layout = trace.block_layout(block_tokens)
    if capacity_blocks is not None:
        _check_capacity(layout, capacity_blocks)
    blocks = _blocks(trace, layout)
    task, names = task_groups(trace)
    later = _reused_later(blocks, layout.num_distinct_keys)
    phase, position = _phase_and_position(blocks, later, task, names)
    return ReuseAnalysis(
        name=trace.name,
        num_requests=len(trace),
        num_sessions=len({s for s in trace.session_id if s is not None}),
        block_tokens=layout.block_tokens,
        form="hash" if trace.is_hash_form else "token",
        attribution=_attribution(trace, layout, blocks, task, names),
        phase=phase,
        position=position,
        gaps={t: fit_lognormal(g) for t, g in session_gaps(trace).items()},
        headroom=headroom(trace, block_tokens, capacity_blocks),
    )


__all__ = [
    "ALL",
    "NO_TASK",
    "POSITION_BINS",
    "POSITION_LABELS",
    "Attribution",
    "Headroom",
    "PhaseReuse",
    "PositionReuse",
    "ReuseAnalysis",
    "analyze_reuse",
    "headroom",
    "position_bin",
    "reuse_sources",
]
