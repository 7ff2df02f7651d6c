"""What every generator shares: parameter declarations, checks, the registry, token draws.

A generator is a function ``fn(params=None, **overrides) -> Trace`` plus a frozen dataclass
of parameters declared with :func:`param` (default, lower bound, help). The CLI builds one
flag per parameter from the declarations (``prefixlab trace generate lpc --lambda-chat 50``),
and ``gen:NAME:k=v`` trace sources pass them as keywords.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.types import F64, I64
from prefixlab.workload.trace import Request, Trace

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

P = TypeVar("P", bound="DataclassInstance")
T = TypeVar("T")


def param(default: T, low: float | None = None, help: str = "", strict: bool = False) -> T:
    """Declare a generator parameter: its default, lower bound (inclusive unless strict)."""
    meta = {"low": low, "help": help, "strict": strict}
    return dataclasses.field(default=default, metadata=meta)


def check_params(obj: DataclassInstance) -> None:
    """Each parameter has its default's type and respects its bound; errors name it."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default
        if value is None and default is None:
            continue
        kind: type[object] = type(default) if default is not None else float
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{f.name} must be true or false, got {value!r}")
            continue
        if kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"{f.name} must be a string, got {value!r}")
            continue
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{f.name} must be an integer, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{f.name} must be a number, got {value!r}")
        elif not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number, got {value!r}")
        low = f.metadata.get("low")
        if low is not None:
            strict = f.metadata.get("strict", False)
            if value < low or (strict and value == low):
                raise ConfigError(
                    f"{f.name} must be {'>' if strict else '>='} {low}, got {value!r}"
                )


def resolve_params(cls: type[P], params: P | None, overrides: Mapping[str, object], what: str) -> P:
    """``params`` (or the defaults) with ``overrides`` applied; unknown names are errors."""
    names = {f.name for f in dataclasses.fields(cls)}
    bad = [k for k in overrides if k not in names]
    if bad:
        raise ConfigError(
            f"{what} generator has no parameter {bad[0]!r}; it takes {', '.join(sorted(names))}"
        )
    base = params if params is not None else cls()
    out = dataclasses.replace(base, **overrides)
    check_params(out)
    validate = getattr(out, "validate", None)
    if validate is not None:
        validate()
    return out


R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class GeneratorInfo(Generic[R]):
    """A registered generator: its parameter dataclass, function and one-line summary."""

    name: str
    params: type[DataclassInstance]
    fn: Callable[..., R]
    summary: str


GENERATORS: dict[str, GeneratorInfo[Trace]] = {}


def registrar(
    registry: dict[str, GeneratorInfo[R]], name: str, params: type[DataclassInstance], summary: str
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorator: add ``fn`` to ``registry`` as the generator ``name`` (workload generators
    here, expert-trace generators in :mod:`prefixlab.experts.generators`)."""

    def deco(fn: Callable[..., R]) -> Callable[..., R]:
        registry[name] = GeneratorInfo(name, params, fn, summary)
        return fn

    return deco


def register_generator(
    name: str, params: type[DataclassInstance], summary: str
) -> Callable[[Callable[..., Trace]], Callable[..., Trace]]:
    """Decorator: register a workload generator."""
    return registrar(GENERATORS, name, params, summary)


def zipf_weights(n: int, exponent: float) -> F64:
    """Popularity of ranks 1..n proportional to rank**-exponent (exponent 0: uniform)."""
    w: F64 = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    out: F64 = w / w.sum()
    return out


def lognormal_lengths(rng: np.random.Generator, mean: float, n: int, sigma: float = 0.6) -> I64:
    """Positive integer lengths, log-normal with the given mean."""
    mu = np.log(mean) - sigma**2 / 2
    out: I64 = np.maximum(1, rng.lognormal(mu, sigma, n).round()).astype(np.int64)
    return out


def session_turns(
    history: I64,
    user_lens: I64,
    out_lens: I64,
    gaps: F64,
    start_s: float,
    draw: Callable[[int], I64],
    *,
    session_id: str,
    task: str,
    closed_loop: bool = False,
) -> list[Request]:
    """The turns of one session: turn k's input is the history plus a new user message, its
    output the reply, which the next turn repeats; turn k+1 arrives ``gaps[k]`` later.
    ``draw(n)`` gives n fresh token ids (user message, then reply, turn by turn)."""
    out: list[Request] = []
    t = start_s
    for k in range(len(user_lens)):
        prompt = np.concatenate([history, draw(int(user_lens[k]))])
        reply = draw(int(out_lens[k]))
        out.append(
            Request(
                arrival_s=t,
                input_length=int(prompt.shape[0]),
                output_length=int(reply.shape[0]),
                session_id=session_id,
                turn=k,
                task=task,
                input_tokens=prompt,
                output_tokens=reply,
                think_s=float(gaps[k - 1]) if closed_loop and k else None,
            )
        )
        history = np.concatenate([prompt, reply])
        t += float(gaps[k])
    return out


class TokenSource:
    """Fresh random token ids, from a stream of their own so content never depends on how
    many other draws were made (and distinct content never collides in practice)."""

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.rng = np.random.default_rng([seed, 0x70C])
        self.vocab_size = vocab_size

    def draw(self, n: int) -> I64:
        return self.rng.integers(0, self.vocab_size, int(n), dtype=np.int64)
