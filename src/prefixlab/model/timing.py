"""Timing models: how long one scheduler step takes.

A step runs a batch of prefill chunks (``new`` tokens after ``cached`` ones each) and a batch
of decode tokens (one per running sequence, with its context length). Models:

* ``power`` (UniCache): prefill ``a * BS^b * L^c`` seconds, BS the number of prefill chunks
  in the step and L their mean new tokens. Presets from the UniCache paper:
  ``llama-3.2-1b-a100`` (5.56e-5, 0.992, 1.034) and ``llama-3.1-8b-h100`` (3.59e-5, 0.991,
  1.018). The unit is seconds with L in tokens: for 1,000 tokens the 1B preset gives 70 ms,
  the 8B preset 41 ms, in line with those models' measured prefill on those GPUs (read in
  ms, the 1B figure would be 70 us, about 95x faster than the GPU's peak allows).
* ``roofline``: FLOPs / (peak x ``mfu``) or bytes moved / (bandwidth x ``mbu``), whichever is
  larger, for any :class:`ModelSpec` on a GPU preset; a step reads the weights its tokens
  touch (all dense weights; for MoE the experts hit, see ``ModelSpec.parameters_read``)
  plus the KV of its sequences (decode is memory-bound for small batches). FLOPs are
  causal, so a prompt's chunks add up to its one-pass cost (``cached`` must include the
  prompt's earlier chunks).
* ``table``: a CSV of measured prefill time against new tokens (columns ``input_tokens`` and
  ``ttft_s``), interpolated linearly (and extrapolated from the end segments); a batch costs
  the sum of its chunks.
* ``tpot``: a constant time per decode step (``s`` seconds).

Specs combine with ``+``: ``power:preset=llama-3.2-1b-a100+tpot:s=0.02``. One component
times prefill (power, table or roofline) and one decode (tpot or roofline); a step with both
costs the sum of its prefill and decode times, except under a lone roofline, which prices
the mixed batch as a whole.
"""

from __future__ import annotations

import dataclasses
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prefixlab._jit import jit
from prefixlab.errors import ConfigError
from prefixlab.model._csv import read_csv
from prefixlab.model.spec import ModelSpec, check_tp, get_model
from prefixlab.types import F64

#: (new tokens, cached tokens[, tokens of this prompt's earlier chunks]) of a prefill chunk;
#: the third part (0 when absent) lets a model price a chunk as the increment it adds, so a
#: prompt split into chunks costs what it costs in one pass
Chunk = tuple[int, ...]


def _done(chunk: Chunk) -> int:
    return chunk[2] if len(chunk) > 2 else 0


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    peak_flops: float  # dense BF16 tensor FLOP/s
    mem_bandwidth: float  # bytes/s
    mem_bytes: int

    def parallel(self, tp: int) -> GPU:
        """``tp`` of these GPUs as one for a roofline: FLOP/s, bandwidth and memory times
        tp (tensor parallelism without its all-reduce cost)."""
        if tp == 1:
            return self
        return GPU(
            f"{tp}x{self.name}", self.peak_flops * tp, self.mem_bandwidth * tp, self.mem_bytes * tp
        )


GPU_PRESETS = {
    g.name: g
    for g in (
        GPU("a100", 312e12, 2.039e12, 80 * 2**30),
        GPU("h100", 989e12, 3.35e12, 80 * 2**30),
        GPU("h200", 989e12, 4.8e12, 141 * 2**30),
        GPU("a6000", 154.8e12, 768e9, 48 * 2**30),
    )
}

POWER_PRESETS = {
    "llama-3.2-1b-a100": (5.56e-5, 0.992, 1.034),
    "llama-3.1-8b-h100": (3.59e-5, 0.991, 1.018),
}


# The formulas the compiled engine (runner/engine/_kernel.py) prices steps with, and the
# classes below too: one source.
@jit()
def power_fresh_tokens(new: float, done: float, c: float) -> float:
    """A chunk of ``new`` tokens after ``done`` of its own prompt costs the increment
    (done + new)^c - done^c: this is the fresh length with that cost."""
    if not done:
        return new
    return float(max((done + new) ** c - done**c, 0.0) ** (1.0 / c))


@jit()
def power_batch_s(a: float, b: float, c: float, n: int, total_fresh: float) -> float:
    """``a * BS^b * L^c``: n chunks of ``total_fresh`` fresh-equivalent tokens in all."""
    mean_new = total_fresh / n
    return float(a * float(n) ** b * mean_new**c) if mean_new > 0 else 0.0


@jit()
def table_s(tokens: F64, seconds: F64, n: float) -> float:
    """A measured table's seconds at n tokens: interpolated inside it, extrapolated from
    its end segments outside it (never below 0); one row scales linearly."""
    t, s = tokens, seconds
    if t.shape[0] == 1:
        return float(s[0] * n / t[0]) if t[0] else float(s[0])
    last = t.shape[0] - 1
    if n <= t[0]:
        slope = (s[1] - s[0]) / (t[1] - t[0])
        return max(float(s[0] + slope * (n - t[0])), 0.0)
    if n >= t[last]:
        slope = (s[last] - s[last - 1]) / (t[last] - t[last - 1])
        return max(float(s[last] + slope * (n - t[last])), 0.0)
    return float(np.interp(n, t, s))


def get_gpu(name: str) -> GPU:
    if name.lower() not in GPU_PRESETS:
        raise ConfigError(f"unknown GPU '{name}'; known: {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[name.lower()]


class TimingModel(ABC):
    """Seconds of one step; either part may be absent (zero)."""

    times_prefill: bool = False
    times_decode: bool = False

    def prefill_s(self, chunks: Sequence[Chunk]) -> float:
        return 0.0

    def decode_s(self, contexts: Sequence[int]) -> float:
        return 0.0

    def step_s(self, chunks: Sequence[Chunk], contexts: Sequence[int]) -> float:
        return (self.prefill_s(chunks) if chunks else 0.0) + (
            self.decode_s(contexts) if contexts else 0.0
        )

    @abstractmethod
    def spec(self) -> str: ...


@dataclass(frozen=True)
class PowerLaw(TimingModel):
    a: float
    b: float
    c: float
    times_prefill = True

    def prefill_s(self, chunks: Sequence[Chunk]) -> float:
        n = len(chunks)
        if not n:
            return 0.0
        # A chunk after d tokens of its own prompt costs the increment (d + L)^c - d^c, so
        # chunking does not make a prompt cheaper; its equivalent fresh length enters the
        # batch formula (for fresh chunks this is a BS^b (mean L)^c exactly).
        total = 0.0  # left to right, as the compiled engine adds (sum() compensates on 3.12+)
        for c in chunks:
            total += power_fresh_tokens(float(c[0]), float(_done(c)), self.c)
        return power_batch_s(self.a, self.b, self.c, n, total)

    def spec(self) -> str:
        return f"power:a={self.a},b={self.b},c={self.c}"


@dataclass(frozen=True)
class ConstantTPOT(TimingModel):
    s: float
    times_decode = True

    def decode_s(self, contexts: Sequence[int]) -> float:
        return self.s if contexts else 0.0

    def spec(self) -> str:
        return f"tpot:s={self.s}"


class TableTiming(TimingModel):
    """Measured prefill seconds against new tokens, interpolated."""

    times_prefill = True

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        tokens, seconds = _read_table(Path(path))
        order = np.argsort(tokens)
        self.tokens, self.seconds = tokens[order], seconds[order]

    def _one(self, n: float) -> float:
        return float(table_s(self.tokens, self.seconds, n))

    def prefill_s(self, chunks: Sequence[Chunk]) -> float:
        # A chunk after d tokens of its prompt costs t(d + L) - t(d): chunks sum to t(n).
        total = 0.0
        for c in chunks:
            if c[0] <= 0:
                continue
            d = _done(c)
            total += (
                self._one(float(d + c[0])) - self._one(float(d)) if d else self._one(float(c[0]))
            )
        return total

    def spec(self) -> str:
        return f"table:path={self.path}"


def _read_table(path: Path) -> tuple[F64, F64]:
    from prefixlab.errors import TraceFormatError

    if not path.is_file():
        raise ConfigError(f"timing table not found: {path}")
    tokens: list[float] = []
    seconds: list[float] = []
    reader = read_csv(path)
    for col in ("input_tokens", "ttft_s"):
        if col not in (reader.fieldnames or []):
            raise TraceFormatError(str(path), 1, col, "column missing")
    for lineno, row in enumerate(reader, start=2):
        for col, out in (("input_tokens", tokens), ("ttft_s", seconds)):
            try:
                value = float(row[col])
            except (TypeError, ValueError):
                raise TraceFormatError(
                    str(path), lineno, col, f"expected a number, got {row[col]!r}"
                ) from None
            if not np.isfinite(value) or value < 0:
                raise TraceFormatError(str(path), lineno, col, f"must be >= 0, got {value}")
            out.append(value)
    if not tokens:
        raise TraceFormatError(str(path), None, None, "no rows")
    seen: dict[float, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise TraceFormatError(
                str(path),
                i + 2,
                "input_tokens",
                f"length {t:g} appears twice (also on line {seen[t] + 2}); give each once",
            )
        seen[t] = i
    return np.array(tokens), np.array(seconds)


@dataclass(frozen=True)
class Roofline(TimingModel):
    model: ModelSpec
    gpu: GPU
    mfu: float = 0.5
    mbu: float = 0.7
    #: the tensor-parallel GPUs ``gpu`` stands for: KV they all read is counted per GPU
    tp: int = 1
    times_prefill = True
    times_decode = True

    def _time(self, flops: float, num_bytes: float) -> float:
        compute = flops / (self.gpu.peak_flops * self.mfu)
        memory = num_bytes / (self.gpu.mem_bandwidth * self.mbu)
        return max(compute, memory)

    def _weights(self, num_tokens: int = 1) -> float:
        return self.model.weight_bytes_read(num_tokens)

    def prefill_s(self, chunks: Sequence[Chunk]) -> float:
        if not chunks:
            return 0.0
        flops, kv = self._chunks(chunks)
        return self._time(flops, self._weights(sum(c[0] for c in chunks)) + kv)

    def decode_s(self, contexts: Sequence[int]) -> float:
        if not contexts:
            return 0.0
        flops, kv = self._contexts(contexts)
        state = len(contexts) * self.model.state_bytes_per_checkpoint
        return self._time(flops, self._weights(len(contexts)) + kv + state)

    def step_s(self, chunks: Sequence[Chunk], contexts: Sequence[int]) -> float:
        flops, kv = self._chunks(chunks)
        dflops, dkv = self._contexts(contexts)
        flops += dflops
        kv += dkv
        kv += len(contexts) * self.model.state_bytes_per_checkpoint
        tokens = sum(c[0] for c in chunks) + len(contexts)
        return self._time(flops, self._weights(tokens) + kv) if chunks or contexts else 0.0

    # FLOPs are added left to right (not with ``sum``, which compensates on Python 3.12+):
    # the compiled engine (runner/engine/_kernel.py: roofline_s) adds them the same way.
    def _chunks(self, chunks: Sequence[Chunk]) -> tuple[float, int]:
        flops, kv = 0.0, 0
        for c in chunks:
            flops += self.model.total_prefill_flops(c[0], c[1], True)
            kv += self.model.kv_bytes_read(c[0] + c[1], self.tp)
        return flops, kv

    def _contexts(self, contexts: Sequence[int]) -> tuple[float, int]:
        flops, kv = 0.0, 0
        for c in contexts:
            flops += self.model.decode_flops(c, True)
            kv += self.model.kv_bytes_read(c, self.tp)
        return flops, kv

    def spec(self) -> str:
        tp = f",tp={self.tp}" if self.tp > 1 else ""
        return f"roofline:mfu={self.mfu},mbu={self.mbu}{tp}"


class Composite(TimingModel):
    """One prefill component and one decode component."""

    def __init__(self, prefill: TimingModel | None, decode: TimingModel | None) -> None:
        self.prefill = prefill
        self.decode = decode
        self.times_prefill = prefill is not None
        self.times_decode = decode is not None

    def prefill_s(self, chunks: Sequence[Chunk]) -> float:
        return self.prefill.prefill_s(chunks) if self.prefill else 0.0

    def decode_s(self, contexts: Sequence[int]) -> float:
        return self.decode.decode_s(contexts) if self.decode else 0.0

    def step_s(self, chunks: Sequence[Chunk], contexts: Sequence[int]) -> float:
        if self.prefill is self.decode and self.prefill is not None:
            return self.prefill.step_s(chunks, contexts)
        return super().step_s(chunks, contexts)

    def spec(self) -> str:
        parts = [p.spec() for p in (self.prefill, self.decode) if p is not None]
        return "+".join(dict.fromkeys(parts))


def _number(kind: str, key: str, value: object, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ConfigError(f"timing '{kind}': {key} must be a finite number, got {value!r}")
    if value <= low:
        raise ConfigError(f"timing '{kind}': {key} must be > {low}, got {value!r}")
    return float(value)


def _component(text: str, model: ModelSpec | None, gpu: GPU | None) -> TimingModel:
    from prefixlab.registry import parse_spec

    kind, kw = parse_spec(text, "timing spec")
    allowed = {
        "power": {"a", "b", "c", "preset"},
        "tpot": {"s"},
        "table": {"path"},
        "roofline": {"mfu", "mbu"},
    }
    if kind not in allowed:
        raise ConfigError(f"unknown timing model '{kind}'; known: {', '.join(allowed)}")
    bad = set(kw) - allowed[kind]
    if bad:
        raise ConfigError(
            f"timing '{kind}' has no parameter {sorted(bad)[0]!r}; it takes "
            f"{', '.join(sorted(allowed[kind]))}"
        )
    if kind == "power":
        if "preset" in kw:
            if str(kw["preset"]) not in POWER_PRESETS or len(kw) > 1:
                raise ConfigError(
                    f"power preset {kw['preset']!r} unknown or combined with a, b, c; known: "
                    f"{', '.join(POWER_PRESETS)}"
                )
            return PowerLaw(*POWER_PRESETS[str(kw["preset"])])
        missing = {"a", "b", "c"} - set(kw)
        if missing:
            raise ConfigError(f"timing 'power' needs a, b and c (or preset=); missing {missing}")
        return PowerLaw(
            _number(kind, "a", kw["a"]),
            _number(kind, "b", kw["b"], -1e9),
            _number(kind, "c", kw["c"]),  # c > 0: cost grows with length
        )
    if kind == "tpot":
        return ConstantTPOT(_number(kind, "s", kw.get("s", 0.02), -1e-300))
    if kind == "table":
        if "path" not in kw:
            raise ConfigError("timing 'table' needs path=CSV")
        return TableTiming(str(kw["path"]))
    if model is None or gpu is None:
        raise ConfigError("timing 'roofline' needs a model and a GPU (--model, --gpu)")
    mfu = _number(kind, "mfu", kw.get("mfu", 0.5))
    mbu = _number(kind, "mbu", kw.get("mbu", 0.7))
    for key, value in (("mfu", mfu), ("mbu", mbu)):
        if value > 1:
            raise ConfigError(f"roofline {key} is a fraction of peak (at most 1), got {value}")
    return Roofline(model, gpu, mfu, mbu)


def make_timing(
    spec: str | Sequence[str],
    model: str | ModelSpec | None = None,
    gpu: str | GPU | None = None,
    tp: int = 1,
) -> TimingModel:
    """Build a timing model from specs (``a+b`` strings or a list of them); a roofline
    runs on ``tp`` GPUs (:meth:`GPU.parallel`)."""
    texts = [spec] if isinstance(spec, str) else list(spec)
    # "+" joins components ("power:...+tpot:s=1"); a "+" inside a number (1e+3) does not.
    parts = [p.strip("+ ") for t in texts for p in re.split(r"\+(?=[A-Za-z])", t)]
    parts = [p for p in parts if p]
    if not parts:
        raise ConfigError("no timing model given")
    m = get_model(model) if model is not None else None
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if g is not None and tp != 1:
        if m is not None:
            check_tp(m, tp)
        g = g.parallel(tp)
    comps = [_component(p.strip(), m, g) for p in parts]
    if tp > 1:  # a roofline on tp GPUs reads the KV each of them holds
        comps = [dataclasses.replace(c, tp=tp) if isinstance(c, Roofline) else c for c in comps]
    # A roofline times whatever no dedicated component does (power/table prefill, tpot).
    roof = [c for c in comps if isinstance(c, Roofline)]
    prefill = [c for c in comps if isinstance(c, (PowerLaw, TableTiming))]
    tpot = [c for c in comps if isinstance(c, ConstantTPOT)]
    for what, group in (("prefill", prefill), ("tpot", tpot), ("roofline", roof)):
        if len(group) > 1:
            names = ", ".join(c.spec() for c in group)
            raise ConfigError(f"more than one {what} timing model: {names}")
    pre = prefill[0] if prefill else (roof[0] if roof else None)
    dec = tpot[0] if tpot else (roof[0] if roof else None)
    return Composite(pre, dec)
