"""Expert traces: the request stream of MoE expert caching, as one value object.

A trace is a sequence of *rounds*. A round requests one expert in every layer, in layer
order, so request ``t`` belongs to layer ``t % num_layers``; a token routed to its top-k
experts gives k rounds (round r holds the r-th choice of every layer)::

    one token, top-2 routing, l = 3 layers, n experts per layer
    request t :  0   1   2 | 3   4   5
    layer     :  0   1   2 | 0   1   2
    rank      :  0   0   0 | 1   1   1      round 0: first choices, round 1: second choices
    page      :  layer * n + expert

Files live elsewhere: :mod:`prefixlab.experts.trace_io` reads and writes ``.npz`` (native) and
runs ``gen:KIND:k=v,...`` specs (:func:`load_expert_trace`); :mod:`prefixlab.experts.routing_jsonl`
reads and writes routing JSONL (both import :class:`ExpertTrace` from this module, which
imports neither); :mod:`prefixlab.experts` gathers their public names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.types import F64, I64

__all__ = ["F64", "I64", "ExpertTrace", "TraceSummary"]

#: Page ids are int64: ``num_layers * num_experts`` must stay below this.
_PAGE_LIMIT = 2**63


def _int_column(name: str, values: object) -> I64:
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise ConfigError(f"ExpertTrace.{name}: expected integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class ExpertTrace:
    """Expert requests of a MoE model, one page per layer per round, layer order enforced.

    Attributes:
        num_layers: l, the MoE layers; request t belongs to layer t % l.
        num_experts: n, experts per layer; page id = layer * n + expert.
        expert: expert id of each request (length a multiple of l).
        token_idx: token each request serves (the same for a whole round).
        rank: 0 for a first choice, 1 for a second choice... (the same for a whole round).
        gate: gating probability of each choice, if known.
        meta: where the trace comes from (source, generator and params, model id...).
    """

    num_layers: int
    num_experts: int
    expert: I64
    token_idx: I64
    rank: I64
    gate: F64 | None = None
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("expert", "token_idx", "rank"):
            object.__setattr__(self, name, _int_column(name, getattr(self, name)))
        if self.gate is not None:
            object.__setattr__(self, "gate", np.ascontiguousarray(self.gate, dtype=np.float64))

    @property
    def num_requests(self) -> int:
        return int(self.expert.shape[0])

    @property
    def num_rounds(self) -> int:
        return self.num_requests // self.num_layers

    @property
    def layer(self) -> I64:
        """The layer of each request: ``t % num_layers``."""
        return np.arange(self.num_requests, dtype=np.int64) % self.num_layers

    @property
    def pages(self) -> I64:
        """Page id of each request: ``layer * num_experts + expert``."""
        out: I64 = self.layer * self.num_experts + self.expert
        return out

    @property
    def top_k(self) -> int:
        """Rounds per token at most (1 + the largest rank; 0 for an empty trace)."""
        return int(self.rank.max()) + 1 if self.num_requests else 0

    @property
    def num_tokens(self) -> int:
        return int(self._token_starts().size)

    def _token_starts(self) -> I64:
        """Index of each token's first round (a token's rounds are consecutive)."""
        rounds = self.token_idx[:: self.num_layers]
        if not rounds.size:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.r_[True, rounds[1:] != rounds[:-1]]).astype(np.int64)

    def slice_rounds(self, start: int, stop: int) -> ExpertTrace:
        """Rounds ``start`` (inclusive) to ``stop`` (exclusive), as a new trace."""
        a, b = start * self.num_layers, stop * self.num_layers
        gate = None if self.gate is None else self.gate[a:b]
        cut = (self.expert[a:b], self.token_idx[a:b], self.rank[a:b], gate)
        return ExpertTrace(self.num_layers, self.num_experts, *cut, meta=dict(self.meta))

    def take_rounds(self, num_rounds: int) -> ExpertTrace:
        """The first ``num_rounds`` rounds."""
        return self.slice_rounds(0, num_rounds)

    def take_tokens(self, num_tokens: int) -> ExpertTrace:
        """All rounds of the first ``num_tokens`` tokens."""
        starts = self._token_starts()
        stop = int(starts[num_tokens]) if num_tokens < starts.size else self.num_rounds
        return self.slice_rounds(0, stop)

    def with_top_k(self, top_k: int) -> ExpertTrace:
        """Keep only the rounds of rank < ``top_k`` (each token's first ``top_k`` choices)."""
        if top_k < 1 or top_k > self.top_k:
            raise ConfigError(f"top_k must be in [1, {self.top_k}] for this trace, got {top_k}")
        keep = self.rank < top_k
        gate = None if self.gate is None else self.gate[keep]
        cut = (self.expert[keep], self.token_idx[keep], self.rank[keep], gate)
        return ExpertTrace(self.num_layers, self.num_experts, *cut, meta=dict(self.meta))

    def problem(self) -> tuple[str, str] | None:
        """The first broken invariant as ``(field, message)``, or None for a valid trace."""
        nl, n = self.num_layers, self.num_experts
        for name, value in (("num_layers", nl), ("num_experts", n)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                return name, f"must be a positive integer, got {value!r}"
        if int(nl) * int(n) >= _PAGE_LIMIT:
            return "num_experts", f"{nl} layers * {n} experts overflow int64 page ids"
        size = self.num_requests
        for name in ("expert", "token_idx", "rank"):
            arr = getattr(self, name)
            if arr.ndim != 1 or arr.shape[0] != size:
                return name, f"shape {arr.shape} does not match the {size} requests"
        if self.gate is not None and self.gate.shape != (size,):
            return "gate", f"shape {self.gate.shape} does not match the {size} requests"
        if size % nl:
            return "expert", f"{size} requests are not whole rounds of {nl} layers"
        bad = np.flatnonzero((self.expert < 0) | (self.expert >= n))
        if bad.size:
            t = int(bad[0])
            return (
                "expert",
                f"request {t} (layer {t % nl}) has expert {self.expert[t]}, not in [0, {n})",
            )
        if size and int(self.rank.min()) < 0:
            return "rank", f"ranks must be >= 0, got {int(self.rank.min())}"
        for name in ("rank", "token_idx"):
            grid = getattr(self, name).reshape(-1, nl)
            mixed = np.flatnonzero((grid != grid[:, :1]).any(axis=1))
            if mixed.size:
                r = int(mixed[0])
                return name, f"round {r} mixes values {sorted(set(grid[r].tolist()))}"
        if self.gate is not None:
            off = np.flatnonzero(~((self.gate >= 0.0) & (self.gate <= 1.0)))
            if off.size:
                return "gate", f"request {int(off[0])} has gate {self.gate[off[0]]}, not in [0, 1]"
        return None

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the field of the first broken invariant."""
        found = self.problem()
        if found is not None:
            raise ConfigError(f"ExpertTrace.{found[0]}: {found[1]}")

    def equals(self, other: ExpertTrace) -> bool:
        """Same shape, arrays and meta (arrays compared exactly)."""
        mine = (self.num_layers, self.num_experts, self.meta, self.gate is None)
        if mine != (other.num_layers, other.num_experts, other.meta, other.gate is None):
            return False
        same_gate = self.gate is None or np.array_equal(self.gate, other.gate)  # type: ignore[arg-type]
        cols = ("expert", "token_idx", "rank")
        return same_gate and all(np.array_equal(getattr(self, c), getattr(other, c)) for c in cols)

    def summary(self) -> TraceSummary:
        """Counts and per-layer popularity entropy (bits; log2(n) means uniform)."""
        nl, n = self.num_layers, self.num_experts
        counts = np.bincount(self.pages, minlength=nl * n).reshape(nl, n).astype(np.float64)
        totals = counts.sum(axis=1, keepdims=True)
        p = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        logs = np.log2(p, out=np.zeros_like(p), where=p > 0)
        entropy = -(p * logs).sum(axis=1)
        return TraceSummary(
            num_layers=nl,
            num_experts=n,
            num_requests=self.num_requests,
            num_rounds=self.num_rounds,
            num_tokens=self.num_tokens,
            top_k=self.top_k,
            num_distinct_pages=int(np.count_nonzero(counts)),
            layer_entropy_bits=tuple(float(x) for x in entropy),
        )


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a trace holds, for ``experts generate`` / ``inspect`` output."""

    num_layers: int
    num_experts: int
    num_requests: int
    num_rounds: int
    num_tokens: int
    top_k: int
    num_distinct_pages: int
    layer_entropy_bits: tuple[float, ...]

    @property
    def mean_entropy_bits(self) -> float:
        e = self.layer_entropy_bits
        return sum(e) / len(e) if e else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "num_requests": self.num_requests,
            "num_rounds": self.num_rounds,
            "num_tokens": self.num_tokens,
            "top_k": self.top_k,
            "num_distinct_pages": self.num_distinct_pages,
            "mean_entropy_bits": self.mean_entropy_bits,
            "max_entropy_bits": math.log2(self.num_experts),
        }
