"""Routing JSONL: recorded MoE routing, one JSON object a line per (token, layer).

::

    {"format": "prefixlab-routing", "num_layers": 2, "num_experts": 8, "meta": {...}}  optional
    {"layer": 0, "token_idx": 0, "experts": [3, 1], "gating_probs": [0.6, 0.4]}
    {"layer": 1, "token_idx": 0, "experts": [5, 2], "gating_probs": [0.7, 0.3]}

A line lists a token's top-k experts in one layer, best first: its r-th entry is the token's
rank-r request in that layer (rounds: :mod:`prefixlab.experts.trace`). The list may also be
named ``expert_ids``, ``topk_ids`` or ``indices``; ``gating_probs`` (or ``topk_weights``,
``scores``) is optional, on every line or none. A line whose gates are out of order has its
experts sorted by descending gate (stable: ties keep their order), so rank 0 is the top choice.

Shape: the header (or an argument) gives l and n. Without either, l is the largest layer + 1
and n the largest expert id + 1, so a layer absent from every token, or an expert never chosen,
goes unnoticed; an inferred value above ``2**20`` is refused as a likely typo. Ids are int64:
a layer, token index or expert id must be in ``[0, 2**63)``.

Meta: a header's ``meta`` is the trace's meta as written, so writing a trace and loading it
back gives an equal trace; a file without one gets ``source``, ``format`` and ``top_k``.
Gzip is recognised by content on reading and chosen by a ``.gz`` name on writing.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import IO

import numpy as np

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.experts.trace import ExpertTrace
from prefixlab.types import F64, I64

#: Keys accepted for the expert list of a routing line (first: the canonical one).
EXPERT_KEYS = ("experts", "expert_ids", "topk_ids", "indices")
#: Keys accepted for the gating probabilities of a routing line.
GATE_KEYS = ("gating_probs", "topk_weights", "scores")
JSONL_FORMAT = "prefixlab-routing"
#: Largest num_layers / num_experts inferred from the ids; above, the file must say.
MAX_INFERRED = 2**20
_ID_LIMIT = 2**63  # ids are stored as int64


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < _ID_LIMIT


def _show(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _open_binary(path: Path) -> io.BufferedIOBase:
    """Read handle; gzip is recognised by its magic bytes, whatever the file name."""
    with path.open("rb") as f:
        magic = f.read(2)
    return gzip.GzipFile(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(1-based number, text)`` of each line; bad bytes raise :class:`TraceFormatError`
    (decoded line by line, as no UTF-8 character holds a newline byte, to name the line)."""
    number = 0
    try:
        with _open_binary(path) as f:
            for number, raw in enumerate(f, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    msg = f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)"
                    raise TraceFormatError(str(path), number, None, msg) from None
                yield number, text
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        msg = f"truncated or corrupt gzip data after line {number} ({exc})"
        raise TraceFormatError(str(path), None, None, msg) from None


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


class _RoutingReader:
    """Checks routing lines one by one and collects them as columns."""

    def __init__(self, path: str, num_layers: int | None, num_experts: int | None) -> None:
        self.path, self.num_layers, self.num_experts = path, num_layers, num_experts
        self.top_k: int | None = None
        self.first_line = 0
        self.has_gate: bool | None = None
        self.max_expert = -1
        self.max_expert_at = (0, EXPERT_KEYS[0])  # (line, key) of the largest expert id
        self.where: list[tuple[int, int, int]] = []  # (line, layer, token_idx) of each line
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
        if not _is_id(value):
            raise self.fail(line, key, f"expected an integer in [0, 2**63), got {_show(value)}")
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
        if gates is not None and any(a < b for a, b in pairwise(gates)):
            best_first = sorted(range(len(gates)), key=gates.__getitem__, reverse=True)  # stable
            experts, gates = [experts[i] for i in best_first], [gates[i] for i in best_first]
        if cut is not None:
            if len(experts) < cut:
                ek = self.key(line, obj, EXPERT_KEYS)
                raise self.fail(line, ek, f"lists {len(experts)} experts, fewer than top_k={cut}")
            experts, gates = experts[:cut], None if gates is None else gates[:cut]
        self.check_like_first(line, obj, len(experts), gates is not None)
        self.where.append((line, layer, token))
        self.experts.append(experts)
        if gates is not None:
            self.gates.append(gates)

    def check_like_first(self, line: int, obj: Mapping[str, object], k: int, gated: bool) -> None:
        """Every line lists as many experts as the first, and gates on all lines or none."""
        if self.top_k is None:
            self.top_k, self.first_line, self.has_gate = k, line, gated
            return
        if k != self.top_k:
            msg = (
                f"lists {k} experts but line {self.first_line} lists {self.top_k}; "
                "every line needs the same number (or pass top_k to cut)"
            )
            raise self.fail(line, self.key(line, obj, EXPERT_KEYS), msg)
        if gated != self.has_gate:
            given = "given here but not" if gated else "missing here but given"
            msg = f"{given} on line {self.first_line}; give it on every line or on none"
            raise self.fail(line, self.key(line, obj, GATE_KEYS) or GATE_KEYS[0], msg)

    def expert_list(self, line: int, obj: Mapping[str, object]) -> list[int]:
        key = self.key(line, obj, EXPERT_KEYS)
        if key is None:
            raise self.fail(line, EXPERT_KEYS[0], f"missing (accepted: {', '.join(EXPERT_KEYS)})")
        value = obj[key]
        if not isinstance(value, list) or not value:
            msg = f"expected a non-empty list of expert ids, got {_show(value)}"
            raise self.fail(line, key, msg)
        for e in value:
            if not _is_id(e):
                msg = f"expert ids must be integers in [0, 2**63), got {_show(e)}"
                raise self.fail(line, key, msg)
            if self.num_experts is not None and e >= self.num_experts:
                n = self.num_experts
                raise self.fail(line, key, f"expert {e} is outside [0, {n}) (num_experts={n})")
        if len(set(value)) != len(value):
            raise self.fail(line, key, f"lists an expert twice: {_show(value)}")
        if max(value) > self.max_expert:
            self.max_expert, self.max_expert_at = max(value), (line, key)
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

    def header(self, line: int, obj: Mapping[str, object]) -> dict[str, str] | None:
        """Take l and n (unless given as arguments); returns the meta, None if absent."""
        for key in ("num_layers", "num_experts"):
            value = obj.get(key)
            if value is not None and (not _is_id(value) or value < 1):  # type: ignore[operator]
                raise self.fail(line, key, f"expected a positive integer, got {_show(value)}")
            if getattr(self, key) is None:
                setattr(self, key, value)
        if obj.get("meta") is None:
            return None
        meta = obj["meta"]
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self.fail(line, "meta", "expected an object of strings")
        return {str(k): v for k, v in meta.items()}

    def inferred(self, key: str, largest: int, line: int, field: str) -> int:
        """``largest + 1`` as ``key``, unless implausibly large (a typo, not a model)."""
        if largest >= MAX_INFERRED:
            msg = f"{largest} would make {key}={largest + 1}, over {MAX_INFERRED}: pass {key}"
            raise self.fail(line, field, f"{msg} or give it in a header line")
        return largest + 1

    def check_complete(self, layer: I64, token: I64, line: I64, nl: int) -> I64:
        """The distinct tokens, once each has one line for every layer 0..nl-1.

        ``layer``, ``token`` and ``line`` are sorted by (token, layer).
        """
        dup = np.flatnonzero((token[1:] == token[:-1]) & (layer[1:] == layer[:-1]))
        if dup.size:
            i = int(dup[0])
            where = f"(lines {line[i]} and {line[i + 1]})"
            msg = f"token {token[i]} has two lines for layer {layer[i]} {where}"
            raise self.fail(int(line[i + 1]), "layer", msg)
        tokens, starts, counts = np.unique(token, return_index=True, return_counts=True)
        short = np.flatnonzero(counts != nl)
        if short.size:
            i = int(short[0])
            have = layer[starts[i] : starts[i] + counts[i]]  # sorted, distinct, all < nl
            holes = np.flatnonzero(have != np.arange(have.size))
            gap = int(holes[0]) if holes.size else int(have.size)
            msg = f"token {tokens[i]} has no line for layer {gap} (needs 0..{nl - 1})"
            raise self.fail(None, "layer", msg)
        return tokens

    def build(self, meta: dict[str, str] | None) -> ExpertTrace:
        if not self.where:
            raise self.fail(None, None, "no routing lines")
        line, layer, token = np.array(self.where, dtype=np.int64).T
        order = np.lexsort((layer, token))
        layer, token, line = layer[order], token[order], line[order]
        top = int(layer.argmax())
        nl = self.num_layers or self.inferred(
            "num_layers", int(layer[top]), int(line[top]), "layer"
        )
        n = self.num_experts or self.inferred("num_experts", self.max_expert, *self.max_expert_at)
        tokens = self.check_complete(layer, token, line, nl)
        k = self.top_k or 1
        shape = (len(tokens), nl, k)  # lines sorted by (token, layer) -> rounds (token, rank)
        expert = np.array(self.experts, dtype=np.int64)[order].reshape(shape)
        expert = expert.transpose(0, 2, 1).ravel()
        gate = None
        if self.has_gate:
            gates = np.array(self.gates, dtype=np.float64)[order].reshape(shape)
            gate = gates.transpose(0, 2, 1).ravel()
        rank = np.tile(np.repeat(np.arange(k, dtype=np.int64), nl), len(tokens))
        if meta is None:
            meta = {"source": self.path, "format": "routing-jsonl", "top_k": str(k)}
        return ExpertTrace(nl, n, expert, np.repeat(tokens, k * nl), rank, gate, meta)


def load_routing_jsonl(
    path: str | Path,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
) -> ExpertTrace:
    """Read recorded routing (the format is described in this module's docstring).

    Lines may come in any order; every token needs one line per layer 0..l-1 and every line
    the same number of experts (unless ``top_k`` cuts them). A line whose ``gating_probs``
    are not in descending order has its experts sorted by descending gate (stable), so rank
    0 is the top choice. Gzip files are detected by content.

    Args:
        path: the file.
        num_layers: l; default: the header's, else the largest layer + 1 (a last layer
            missing from every token then goes unnoticed; any other gap is an error).
        num_experts: n; default: the header's, else the largest expert id + 1.
        top_k: keep each line's first ``top_k`` choices (after the sort by gate).

    Returns:
        Tokens sorted by ``token_idx``; each gives k rounds, round r holding the r-th choice
        of every layer. Meta: the header's, else ``source``, ``format`` and ``top_k``.

    Raises:
        ConfigError: the file is missing or an argument is not a positive integer.
        TraceFormatError: naming the file, the 1-based line (when one is at fault) and the
            field; also for bytes that are not UTF-8 and for gzip data cut short.
    """
    for key, value in (("num_layers", num_layers), ("num_experts", num_experts), ("top_k", top_k)):
        if value is not None and (not _is_id(value) or value < 1):
            raise ConfigError(f"{key} must be a positive integer, got {_show(value)}")
    if not Path(path).is_file():
        raise ConfigError(f"routing file not found: {path}")
    reader = _RoutingReader(str(path), num_layers, num_experts)
    return reader.build(_read_lines(reader, Path(path), top_k))


def _read_lines(reader: _RoutingReader, path: Path, top_k: int | None) -> dict[str, str] | None:
    """Feed every line of ``path`` to ``reader``; returns the header's meta, if any."""
    meta = None
    first = True
    for number, text in _numbered_lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:  # a JSONDecodeError, or an integer of over 4300 digits
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise reader.fail(number, None, f"invalid JSON ({msg})") from None
        if first and isinstance(obj, dict) and obj.get("format") == JSONL_FORMAT:
            meta = reader.header(number, obj)
        else:
            reader.add(number, obj, top_k)
        first = False
    return meta


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
    if gates is not None and (np.diff(gates, axis=1) > 0).any():
        # the loader sorts a line by gate, so such a trace would not load back the same
        raise ConfigError("routing JSONL needs gates that do not grow with the rank")
    return trace.expert.reshape(-1, k, nl), gates, toks[starts].tolist()


def routing_rows(trace: ExpertTrace) -> Iterator[dict[str, object]]:
    """The routing lines of a trace, token by token, layer by layer.

    Raises:
        ConfigError: when the trace is not whole top-k tokens (every token the same number
            of rounds, ranks 0..k-1 in order), token indices do not increase, or a gate of
            rank r + 1 is larger than that of rank r in the same (token, layer).
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

    A trace is written with a header line giving its shape and meta, so loading the file
    gives an equal trace (``load_routing_jsonl(path).equals(trace)``). Rows (from the
    recorder) are written as given, after a header if ``num_layers``, ``num_experts`` or
    ``meta`` is given.

    Raises:
        ConfigError: for a trace :func:`routing_rows` cannot write.
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
            extra = {} if meta is None else {"meta": dict(meta)}  # none: loader adds the source
            f.write(json.dumps({**head, **extra}) + "\n")
        for row in rows:
            f.write(json.dumps(dict(row)) + "\n")
            count += 1
    return count
