"""Expert trace files: the native ``.npz`` format, and :func:`load_expert_trace` for any source.

A ``.npz`` trace holds compressed arrays; token index and rank are stored once per round::

    format                       "prefixlab-expert-trace"
    num_layers, num_experts      scalars
    expert                       (num_requests,)  int16 when n fits, else int64
    round_token_idx, round_rank  (num_rounds,)    request t has those of round t // l
    gate                         (num_requests,)  optional
    meta                         a JSON object of strings

A file that is empty, cut short or not such an archive gives a :class:`TraceFormatError`, never
a numpy or zipfile exception. Routing JSONL is :mod:`prefixlab.experts.routing_jsonl`.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.experts.routing_jsonl import load_routing_jsonl, write_routing_jsonl
from prefixlab.experts.trace import ExpertTrace
from prefixlab.types import I64

NPZ_FORMAT = "prefixlab-expert-trace"
_NOT_NPZ = "not a prefixlab expert trace (.npz)"
_Arrays = dict[str, npt.NDArray[np.generic]]


def file_kind(path: str | Path) -> str:
    """``"npz"`` or ``"jsonl"`` (also for ``.jsonl.gz``), from the file name."""
    name = str(path).lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    raise ConfigError(f"expert trace {path}: expected a .npz, .jsonl or .jsonl.gz file")


def save_trace(trace: ExpertTrace, path: str | Path) -> None:
    """Write ``.npz`` (native) or ``.jsonl`` / ``.jsonl.gz`` (routing format)."""
    if file_kind(path) == "npz":
        _save_npz(trace, Path(path))
    else:
        write_routing_jsonl(trace, path)


def load_trace(path: str | Path) -> ExpertTrace:
    """Read a trace written by :func:`save_trace` (or any routing JSONL file)."""
    if not Path(path).is_file():
        raise ConfigError(f"expert trace file not found: {path}")
    return _load_npz(Path(path)) if file_kind(path) == "npz" else load_routing_jsonl(path)


def _save_npz(trace: ExpertTrace, path: Path) -> None:
    trace.validate()
    nl = trace.num_layers
    small = np.int16 if trace.num_experts <= np.iinfo(np.int16).max else np.int64
    arrays: _Arrays = {
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


def _read_npz(path: Path) -> _Arrays:
    """Every array of the archive, decompressed now so that damage shows here, and only here."""
    name = str(path)
    if path.stat().st_size == 0:
        raise TraceFormatError(name, None, None, f"{_NOT_NPZ}: the file is empty")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):  # a lone .npy array
            raise TraceFormatError(name, None, None, f"{_NOT_NPZ}: a single .npy array")
        with data:
            return {key: np.asarray(data[key]) for key in data.files}
    # numpy and zipfile report damage with all of these, EOFError for a file cut short
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, OSError, zlib.error) as exc:
        raise TraceFormatError(name, None, None, f"{_NOT_NPZ}: {exc}") from None


def _get(name: str, arrays: _Arrays, key: str) -> npt.NDArray[np.generic]:
    if key not in arrays:
        raise TraceFormatError(name, None, key, f"missing: {_NOT_NPZ}")
    return arrays[key]


def _positive_int(name: str, arrays: _Arrays, key: str) -> int:
    arr = _get(name, arrays, key)
    if arr.shape != () or arr.dtype.kind not in "iu" or not 1 <= int(arr) < 2**63:
        raise TraceFormatError(name, None, key, f"expected a positive integer, got {arr!r}")
    return int(arr)


def _ints(name: str, arrays: _Arrays, key: str) -> I64:
    arr = _get(name, arrays, key)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        msg = f"expected a 1-d integer array, got {arr.dtype} of shape {arr.shape}"
        raise TraceFormatError(name, None, key, msg)
    return arr.astype(np.int64)


def _meta(name: str, arrays: _Arrays) -> dict[str, str]:
    try:
        meta = json.loads(str(_get(name, arrays, "meta")))
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise TraceFormatError(name, None, "meta", "expected a JSON object")
    return {str(k): str(v) for k, v in meta.items()}


def _load_npz(path: Path) -> ExpertTrace:
    name = str(path)
    arrays = _read_npz(path)
    if str(_get(name, arrays, "format")) != NPZ_FORMAT:
        raise TraceFormatError(name, None, "format", f"expected '{NPZ_FORMAT}'")
    nl, n = _positive_int(name, arrays, "num_layers"), _positive_int(name, arrays, "num_experts")
    expert = _ints(name, arrays, "expert")
    rounds_tok, rounds_rank = (
        _ints(name, arrays, "round_token_idx"),
        _ints(name, arrays, "round_rank"),
    )
    if rounds_tok.size * nl != expert.size or rounds_rank.size != rounds_tok.size:
        msg = f"{rounds_tok.size} rounds of {nl} layers do not match {expert.size} requests"
        raise TraceFormatError(name, None, "round_token_idx", msg)
    gate = None
    if "gate" in arrays:
        if arrays["gate"].dtype.kind not in "iuf":
            raise TraceFormatError(
                name, None, "gate", f"expected numbers, got {arrays['gate'].dtype}"
            )
        gate = arrays["gate"].astype(np.float64)
    cols = (expert, np.repeat(rounds_tok, nl), np.repeat(rounds_rank, nl), gate)
    trace = ExpertTrace(nl, n, *cols, meta=_meta(name, arrays))
    found = trace.problem()
    if found is not None:
        raise TraceFormatError(name, None, *found)
    return trace


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

    Raises:
        ConfigError: a missing file, an unknown kind or generator, or a shape mismatch.
        TraceFormatError: a file whose content is not a trace (empty, damaged, malformed).
    """
    text = str(source)
    if text.startswith("gen:"):
        if num_layers is not None or num_experts is not None:
            raise ConfigError(f"give num_layers / num_experts inside the spec: {text}")
        from prefixlab.experts.generators import generate_from_spec

        trace = generate_from_spec(text[4:])
    elif file_kind(text) == "jsonl":
        if not Path(text).is_file():
            raise ConfigError(f"expert trace file not found: {text}")
        return load_routing_jsonl(text, num_layers=num_layers, num_experts=num_experts, top_k=top_k)
    else:
        trace = load_trace(text)
        for key, want in (("num_layers", num_layers), ("num_experts", num_experts)):
            have = getattr(trace, key)
            if want is not None and want != have:
                raise ConfigError(f"{text} has {key}={have}, not {want}")
    return trace if top_k is None else trace.with_top_k(top_k)
