"""Expert traces: the request stream of MoE expert caching, and its two file formats.

A trace is a sequence of *rounds*. A round requests one expert in every layer, in layer
order, so request ``t`` belongs to layer ``t % num_layers``; a token routed to its top-k
experts gives k rounds (round r holds the r-th choice of every layer)::

    one token, top-2 routing, l = 3 layers, n experts per layer
    request t :  0   1   2 | 3   4   5
    layer     :  0   1   2 | 0   1   2
    rank      :  0   0   0 | 1   1   1      round 0: first choices, round 1: second choices
    page      :  layer * n + expert

Formats: ``.npz`` (native, compressed arrays; token index and rank are stored once per round)
and routing JSONL (``.jsonl`` / ``.jsonl.gz``, see :func:`load_routing_jsonl`). Sources given as
``gen:KIND:k=v,...`` run a generator of :mod:`prefixlab.experts.generators`.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError, TraceFormatError

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

#: Keys accepted for the expert list of a routing line (first: the canonical one).
EXPERT_KEYS = ("experts", "expert_ids", "topk_ids", "indices")
#: Keys accepted for the gating probabilities of a routing line.
GATE_KEYS = ("gating_probs", "topk_weights", "scores")
NPZ_FORMAT = "prefixlab-expert-trace"
JSONL_FORMAT = "prefixlab-routing"


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

    def save(self, path: str | Path) -> None:
        """Write ``.npz`` (native) or ``.jsonl`` / ``.jsonl.gz`` (routing format)."""
        if _file_kind(path) == "npz":
            _save_npz(self, Path(path))
        else:
            write_routing_jsonl(self, path)

    @classmethod
    def load(cls, path: str | Path) -> ExpertTrace:
        """Read a trace written by :meth:`save` (or any routing JSONL file)."""
        if not Path(path).is_file():
            raise ConfigError(f"expert trace file not found: {path}")
        return _load_npz(Path(path)) if _file_kind(path) == "npz" else load_routing_jsonl(path)


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


def _file_kind(path: str | Path) -> str:
    name = str(path).lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    raise ConfigError(f"expert trace {path}: expected a .npz, .jsonl or .jsonl.gz file")


def _save_npz(trace: ExpertTrace, path: Path) -> None:
    trace.validate()
    nl = trace.num_layers
    small = np.int16 if trace.num_experts <= np.iinfo(np.int16).max else np.int64
    arrays: dict[str, npt.NDArray[np.generic]] = {
        "format": np.array(NPZ_FORMAT),
        "num_layers": np.array(nl),
        "num_experts": np.array(trace.num_experts),
        "expert": trace.expert.astype(small),
        "round_token_idx": trace.token_idx[::nl],
        "round_rank": trace.rank[::nl],
        "meta": np.array(json.dumps(trace.meta, sort_keys=True)),
    }
    if trace.gate is not None:
        arrays["gate"] = trace.gate
    with path.open("wb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]


def _load_npz(path: Path) -> ExpertTrace:
    name = str(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise TraceFormatError(name, None, None, f"not a readable .npz file ({exc})") from None
    with data:

        def get(key: str) -> npt.NDArray[np.generic]:
            if key not in data.files:
                raise TraceFormatError(name, None, key, "missing (not a prefixlab expert trace?)")
            return np.asarray(data[key])

        if str(get("format")) != NPZ_FORMAT:
            raise TraceFormatError(name, None, "format", f"expected '{NPZ_FORMAT}'")
        nl, n = int(get("num_layers")), int(get("num_experts"))
        expert = get("expert").astype(np.int64)
        rounds_tok, rounds_rank = get("round_token_idx"), get("round_rank")
        if nl < 1 or rounds_tok.size * nl != expert.size or rounds_rank.size != rounds_tok.size:
            msg = f"{rounds_tok.size} rounds of {nl} layers do not match {expert.size} requests"
            raise TraceFormatError(name, None, "round_token_idx", msg)
        gate = data["gate"].astype(np.float64) if "gate" in data.files else None
        meta = json.loads(str(get("meta")))
    if not isinstance(meta, dict):
        raise TraceFormatError(name, None, "meta", "expected a JSON object")
    cols = (expert, np.repeat(rounds_tok, nl), np.repeat(rounds_rank, nl), gate)
    trace = ExpertTrace(nl, n, *cols, meta={str(k): str(v) for k, v in meta.items()})
    found = trace.problem()
    if found is not None:
        raise TraceFormatError(name, None, *found)
    return trace


# ---------------------------------------------------------------------------- routing JSONL


def _open_text(path: str | Path) -> IO[str]:
    """Read handle; gzip is recognised by its magic bytes, whatever the file name."""
    p = Path(path)
    with p.open("rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(p, "rb"), encoding="utf-8")
    return p.open("r", encoding="utf-8")


@contextmanager
def _text_writer(path: str | Path) -> Iterator[IO[str]]:
    """Write handle; gzip when the name ends in ``.gz``, with no name or time in its header
    so the same trace always gives the same bytes."""
    p = Path(path)
    with p.open("wb") as raw:
        if not p.name.endswith(".gz"):
            with io.TextIOWrapper(raw, encoding="utf-8") as f:
                yield f
            return
        gz = gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=raw, mtime=0)
        with gz, io.TextIOWrapper(gz, encoding="utf-8") as f:
            yield f


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _RoutingReader:
    """Checks routing lines one by one and collects them as columns."""

    def __init__(self, path: str, num_layers: int | None, num_experts: int | None) -> None:
        self.path, self.num_layers, self.num_experts = path, num_layers, num_experts
        self.top_k: int | None = None
        self.first_line = 0
        self.has_gate: bool | None = None
        self.max_expert = -1
        self.lines: list[int] = []
        self.layers: list[int] = []
        self.tokens: list[int] = []
        self.experts: list[list[int]] = []
        self.gates: list[list[float]] = []

    def fail(self, line: int | None, key: str | None, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, line, key, message)

    def key(self, line: int, obj: Mapping[str, object], keys: tuple[str, ...]) -> str | None:
        found = [k for k in keys if k in obj]
        if len(found) > 1:
            raise self.fail(line, found[1], f"given together with '{found[0]}'; keep one")
        return found[0] if found else None

    def int_field(self, line: int, obj: Mapping[str, object], key: str, high: int | None) -> int:
        if key not in obj:
            raise self.fail(line, key, "missing")
        value = obj[key]
        if not _is_int(value) or value < 0:  # type: ignore[operator]
            raise self.fail(line, key, f"expected an integer >= 0, got {value!r}")
        if high is not None and value >= high:  # type: ignore[operator]
            raise self.fail(line, key, f"{value} is outside [0, {high}) (num_{key}s={high})")
        return value  # type: ignore[return-value]

    def add(self, line: int, obj: object, cut: int | None) -> None:
        if not isinstance(obj, dict):
            raise self.fail(line, None, f"expected a JSON object, got {type(obj).__name__}")
        layer = self.int_field(line, obj, "layer", self.num_layers)
        token = self.int_field(line, obj, "token_idx", None)
        experts = self.expert_list(line, obj)
        gates = self.gate_list(line, obj, len(experts))
        if cut is not None:
            if len(experts) < cut:
                ek = self.key(line, obj, EXPERT_KEYS)
                raise self.fail(line, ek, f"lists {len(experts)} experts, fewer than top_k={cut}")
            experts, gates = experts[:cut], None if gates is None else gates[:cut]
        elif self.top_k is not None and len(experts) != self.top_k:
            msg = (
                f"lists {len(experts)} experts but line {self.first_line} lists {self.top_k}; "
                "every line needs the same number (or pass top_k to cut)"
            )
            raise self.fail(line, self.key(line, obj, EXPERT_KEYS), msg)
        if self.has_gate is not None and (gates is not None) != self.has_gate:
            given = "given here but not" if gates is not None else "missing here but given"
            msg = f"{given} on line {self.first_line}; give it on every line or on none"
            raise self.fail(line, self.key(line, obj, GATE_KEYS) or GATE_KEYS[0], msg)
        if self.top_k is None:
            self.top_k, self.first_line, self.has_gate = len(experts), line, gates is not None
        self.lines.append(line)
        self.layers.append(layer)
        self.tokens.append(token)
        self.experts.append(experts)
        if gates is not None:
            self.gates.append(gates)

    def expert_list(self, line: int, obj: Mapping[str, object]) -> list[int]:
        key = self.key(line, obj, EXPERT_KEYS)
        if key is None:
            raise self.fail(
                line, EXPERT_KEYS[0], f"missing (accepted keys: {', '.join(EXPERT_KEYS)})"
            )
        value = obj[key]
        if not isinstance(value, list) or not value:
            raise self.fail(line, key, f"expected a non-empty list of expert ids, got {value!r}")
        for e in value:
            if not _is_int(e) or e < 0:
                raise self.fail(line, key, f"expert ids must be integers >= 0, got {e!r}")
            if self.num_experts is not None and e >= self.num_experts:
                n = self.num_experts
                raise self.fail(line, key, f"expert {e} is outside [0, {n}) (num_experts={n})")
        if len(set(value)) != len(value):
            raise self.fail(line, key, f"lists an expert twice: {value}")
        self.max_expert = max(self.max_expert, *value)
        return value

    def gate_list(self, line: int, obj: Mapping[str, object], k: int) -> list[float] | None:
        key = self.key(line, obj, GATE_KEYS)
        if key is None:
            return None
        value = obj[key]
        if not isinstance(value, list) or len(value) != k:
            raise self.fail(line, key, f"expected a list of {k} probabilities (one per expert)")
        for q in value:
            if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 1.0:
                raise self.fail(line, key, f"probabilities must be numbers in [0, 1], got {q!r}")
        return [float(q) for q in value]

    def header(self, line: int, obj: Mapping[str, object]) -> dict[str, str]:
        for key in ("num_layers", "num_experts"):
            value = obj.get(key)
            if value is not None and (not _is_int(value) or value < 1):  # type: ignore[operator]
                raise self.fail(line, key, f"expected a positive integer, got {value!r}")
            if getattr(self, key) is None:
                setattr(self, key, value)
        meta = obj.get("meta", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self.fail(line, "meta", "expected an object of strings")
        return {str(k): v for k, v in meta.items()}

    def build(self, meta: dict[str, str]) -> ExpertTrace:
        if not self.lines:
            raise self.fail(None, None, "no routing lines")
        layer, token, line = (
            np.array(x, dtype=np.int64) for x in (self.layers, self.tokens, self.lines)
        )
        order = np.lexsort((layer, token))
        layer, token, line = layer[order], token[order], line[order]
        nl = self.num_layers or int(layer.max()) + 1
        n = self.num_experts or self.max_expert + 1
        dup = np.flatnonzero((token[1:] == token[:-1]) & (layer[1:] == layer[:-1]))
        if dup.size:
            i = int(dup[0])
            where = f"(lines {line[i]} and {line[i + 1]})"
            msg = f"token {token[i]} has two lines for layer {layer[i]} {where}"
            raise self.fail(int(line[i + 1]), "layer", msg)
        tokens, counts = np.unique(token, return_counts=True)
        short = np.flatnonzero(counts != nl)
        if short.size:
            t = int(tokens[short[0]])
            gap = min(set(range(nl)) - set(layer[token == t].tolist()))
            raise self.fail(
                None, "layer", f"token {t} has no line for layer {gap} (needs 0..{nl - 1})"
            )
        k = self.top_k or 1

        shape = (len(tokens), nl, k)  # lines sorted by (token, layer) -> rounds (token, rank)
        expert = np.array(self.experts, dtype=np.int64)[order].reshape(shape)
        gate = (
            np.array(self.gates, dtype=np.float64)[order].reshape(shape) if self.has_gate else None
        )
        expert = expert.transpose(0, 2, 1).ravel()
        gate = None if gate is None else gate.transpose(0, 2, 1).ravel()
        rank = np.tile(np.repeat(np.arange(k, dtype=np.int64), nl), len(tokens))
        meta = {**meta, "source": self.path, "format": "routing-jsonl", "top_k": str(k)}
        return ExpertTrace(nl, n, expert, np.repeat(tokens, k * nl), rank, gate, meta)


def load_routing_jsonl(
    path: str | Path,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
) -> ExpertTrace:
    """Read recorded routing: one JSON object a line, per (token, layer).

    Each line is ``{"layer": int, "token_idx": int, "experts": [int, ...],
    "gating_probs": [float, ...]}``; ``gating_probs`` is optional (on every line or none),
    lines may come in any order, and every token needs one line per layer 0..l-1. The experts
    list may also be named ``expert_ids``, ``topk_ids`` or ``indices``, the probabilities
    ``topk_weights`` or ``scores``. A first line ``{"format": "prefixlab-routing",
    "num_layers": l, "num_experts": n, "meta": {...}}`` (what :func:`write_routing_jsonl`
    writes) gives the shape; arguments override it. Gzip files are detected by content.

    Args:
        path: the file.
        num_layers: l; default: the header's, else the largest layer + 1.
        num_experts: n; default: the header's, else the largest expert id + 1.
        top_k: use only each line's first ``top_k`` choices; default: all, and every line
            must list the same number.

    Returns:
        Tokens sorted by ``token_idx``; each gives k rounds, round r holding the r-th choice
        of every layer.

    Raises:
        TraceFormatError: naming the file, the 1-based line and the field at fault.
    """
    for key, value in (("num_layers", num_layers), ("num_experts", num_experts), ("top_k", top_k)):
        if value is not None and (not _is_int(value) or value < 1):
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    if not Path(path).is_file():
        raise ConfigError(f"routing file not found: {path}")
    reader = _RoutingReader(str(path), num_layers, num_experts)
    meta: dict[str, str] = {}
    seen_line = False
    with _open_text(path) as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise reader.fail(number, None, f"invalid JSON ({exc.msg})") from None
            if not seen_line and isinstance(obj, dict) and obj.get("format") == JSONL_FORMAT:
                meta = reader.header(number, obj)
            else:
                reader.add(number, obj, top_k)
            seen_line = True
    return reader.build(meta)


def _routing_grid(trace: ExpertTrace) -> tuple[I64, F64 | None, list[int]]:
    """Experts (and gates) as ``(token, rank, layer)`` grids, and each token's index."""
    trace.validate()
    nl = trace.num_layers
    ranks, toks = trace.rank[::nl], trace.token_idx[::nl]
    starts = trace._token_starts()
    sizes = np.diff(np.r_[starts, ranks.size])
    k = int(sizes[0]) if sizes.size else 1
    if (sizes != k).any() or not np.array_equal(ranks, np.tile(np.arange(k), starts.size)):
        raise ConfigError("routing JSONL needs every token to have rounds of rank 0..k-1 in order")
    if (np.diff(toks[starts]) <= 0).any():
        raise ConfigError("routing JSONL needs token_idx to increase from one token to the next")
    gates = None if trace.gate is None else trace.gate.reshape(-1, k, nl)
    return trace.expert.reshape(-1, k, nl), gates, toks[starts].tolist()


def routing_rows(trace: ExpertTrace) -> Iterator[dict[str, object]]:
    """The routing lines of a trace, token by token, layer by layer.

    Raises:
        ConfigError: when the trace is not whole top-k tokens (every token the same number
            of rounds, ranks 0..k-1 in order) or token indices do not increase.
    """
    return _rows_of(*_routing_grid(trace))


def _rows_of(grid: I64, gates: F64 | None, tokens: list[int]) -> Iterator[dict[str, object]]:
    for i, tok in enumerate(tokens):
        for j in range(grid.shape[2]):
            row: dict[str, object] = {"layer": j, "token_idx": tok}
            row["experts"] = grid[i, :, j].tolist()
            if gates is not None:
                row["gating_probs"] = gates[i, :, j].tolist()
            yield row


def write_routing_jsonl(
    trace_or_rows: ExpertTrace | Iterable[Mapping[str, object]],
    path: str | Path,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
    meta: Mapping[str, str] | None = None,
) -> int:
    """Write routing JSONL (gzip when ``path`` ends in ``.gz``); returns the routing lines.

    A trace is written with a header line giving its shape and meta, so loading it back
    gives the same trace. Rows (from the recorder) are written as given, after a header if
    ``num_layers``, ``num_experts`` or ``meta`` is given.
    """
    if isinstance(trace_or_rows, ExpertTrace):
        trace = trace_or_rows
        num_layers, num_experts, meta = trace.num_layers, trace.num_experts, trace.meta
        rows: Iterable[Mapping[str, object]] = routing_rows(trace)  # checks before writing
    else:
        rows = trace_or_rows
    count = 0
    with _text_writer(path) as f:
        if num_layers is not None or num_experts is not None or meta is not None:
            head = {"format": JSONL_FORMAT, "num_layers": num_layers, "num_experts": num_experts}
            f.write(json.dumps({**head, "meta": dict(meta or {})}) + "\n")
        for row in rows:
            f.write(json.dumps(dict(row)) + "\n")
            count += 1
    return count


def load_expert_trace(
    source: str | Path,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
) -> ExpertTrace:
    """A trace from a file (``.npz``, ``.jsonl``, ``.jsonl.gz``) or ``gen:KIND:k=v,...``.

    ``top_k`` keeps each token's first ``top_k`` choices whatever the source;
    ``num_layers`` / ``num_experts`` apply to routing JSONL (elsewhere they must match).
    """
    text = str(source)
    if text.startswith("gen:"):
        if num_layers is not None or num_experts is not None:
            raise ConfigError(f"give num_layers / num_experts inside the spec: {text}")
        from prefixlab.experts.generators import generate_from_spec

        trace = generate_from_spec(text[4:])
    elif _file_kind(text) == "jsonl":
        if not Path(text).is_file():
            raise ConfigError(f"expert trace file not found: {text}")
        return load_routing_jsonl(text, num_layers=num_layers, num_experts=num_experts, top_k=top_k)
    else:
        trace = ExpertTrace.load(text)
        for key, want in (("num_layers", num_layers), ("num_experts", num_experts)):
            have = getattr(trace, key)
            if want is not None and want != have:
                raise ConfigError(f"{text} has {key}={have}, not {want}")
    return trace if top_k is None else trace.with_top_k(top_k)
