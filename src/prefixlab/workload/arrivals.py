"""Arrival models: when each turn of each session arrives.

A model schedules sessions one at a time, in order (so loaders can stream): given a
session's number of turns it returns the turns' arrival times and think times. Two models:

* :class:`SessionArrivals` (UniCache): session starts form a Poisson process
  (``session_rate_per_s``); the gaps between turns are log-normal, ``gap_mu``/``gap_sigma``
  in log-seconds, presets ``chat`` (4.15, 0.971) and ``agentic`` (1.81, 1.092).
* :class:`LPCArrivals` (LPC): conversation starts spaced by exponential gaps (rate
  ``session_rate_per_s``), delayed so at most ``n_conv`` are active at once; turns spaced by
  exponential gaps of mean ``lambda_chat`` seconds; a conversation stays active until its
  last reply is decoded (at ``decode_tokens_per_s``).

Open loop, arrival times are absolute. Closed loop (``closed_loop=True``), the same times
are written, and every later turn also carries its gap as ``think_s``: the engine runner
then counts it from the completion of the previous response instead.
Spec strings (``--arrival``): ``sessions:session_rate_per_s=0.5,preset=agentic`` or
``lpc:lambda_chat=100,n_conv=200``.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import cast, overload

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.types import B1, F64, I64

#: what :func:`lognormal_cdf` takes element-wise
ArrayOfReals = npt.NDArray[np.floating] | npt.NDArray[np.integer] | Sequence[float]

GAP_PRESETS = {"chat": (4.15, 0.971), "agentic": (1.81, 1.092)}


def lognormal_cdf_scalar(x: float, mu: float, sigma: float) -> float:
    """:func:`lognormal_cdf` of one number (UniCache compiles it into its hooks)."""
    if x <= 0.0:
        return 0.0
    if sigma <= 0:
        return 1.0 if x >= math.exp(mu) else 0.0
    return 0.5 * (1.0 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2.0))))


@overload
def lognormal_cdf(x: float, mu: float, sigma: float) -> float: ...
@overload
def lognormal_cdf(x: ArrayOfReals, mu: float, sigma: float) -> F64: ...
def lognormal_cdf(x: float | ArrayOfReals, mu: float, sigma: float) -> float | F64:
    """P(gap <= x) for a log-normal gap: a float for a float (the policies' hot path), an
    array for an array; 0 for x <= 0, and a step at exp(mu) when sigma is 0."""
    if np.ndim(x) == 0:
        return lognormal_cdf_scalar(float(cast(float, x)), mu, sigma)
    arr = np.asarray(x, dtype=np.float64)
    if sigma <= 0:
        return (arr >= math.exp(mu)).astype(np.float64)
    z = (np.log(np.maximum(arr, 1e-300)) - mu) / (sigma * math.sqrt(2.0))
    erf = np.frompyfunc(math.erf, 1, 1)
    return np.where(arr > 0, 0.5 * (1.0 + np.asarray(erf(z), dtype=np.float64)), 0.0)


def session_order(session_id: Sequence[str | None], arrival_s: F64) -> tuple[I64, B1]:
    """The rows that belong to a session, sorted by (session, arrival; ties keep their
    order), and for each but the first whether it continues the previous row's session."""
    codes: dict[str, int] = {}
    sess = np.array(
        [-1 if s is None else codes.setdefault(s, len(codes)) for s in session_id], dtype=np.int64
    )
    rows = np.flatnonzero(sess >= 0)
    rows = rows[np.lexsort((arrival_s[rows], sess[rows]))]
    return rows, sess[rows][1:] == sess[rows][:-1]


def previous_turn_gaps(
    session_id: Sequence[str | None], arrival_s: F64, last: dict[str, float] | None = None
) -> F64:
    """Per request: its arrival minus that of the previous request of its session (NaN for
    a session's first request and for requests without a session).

    ``last``: each session's latest arrival before these requests (a streamed trace's
    earlier chunks, which come earlier in time): a session's first request here takes its
    gap from it, and ``last`` is updated to these requests."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    rows, same = session_order(session_id, arrival)
    out = np.full(arrival.shape[0], np.nan)
    out[rows[1:][same]] = np.diff(arrival[rows])[same]
    if last is not None and rows.shape[0]:
        for r in rows[np.concatenate(([True], ~same))].tolist():  # each session's first
            s = session_id[r]
            if s in last:
                out[r] = arrival[r] - last[s]
        for r in rows[np.concatenate((~same, [True]))].tolist():  # and its last
            last[session_id[r]] = float(arrival[r])
    return out


def check_number(name: str, value: object, low: float, strict: bool = False) -> float:
    """A real number >= low (> low when strict), or a ConfigError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if not (value > low if strict else value >= low):
        raise ConfigError(f"{name} must be {'>' if strict else '>='} {low}, got {value!r}")
    return float(value)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


class ArrivalModel(ABC):
    """Schedules sessions in order; state lives in the model, randomness in ``rng``."""

    closed_loop: bool

    @abstractmethod
    def schedule(
        self,
        num_turns: int,
        rng: np.random.Generator,
        known: Sequence[float | None] | None = None,
        output_tokens: int = 0,
    ) -> tuple[F64, F64]:
        """Arrival times and gaps of the next session's turns (``gaps[0]`` is 0).

        ``known[k]``, when given and not None, is a measured think time before turn k (e.g.
        a tool's execution time in an agent trajectory): it replaces the drawn gap as the
        think time (``gaps``), and the open-loop arrival gap is the larger of the two (the
        drawn gap models the whole time between calls, generation included; a measured
        think time cannot be shortened).
        ``output_tokens`` (the session's total) lets a model estimate when it finishes.
        """

    def think_times(self, gaps: F64) -> list[float | None]:
        """The ``think_s`` column for one session (None everywhere when open loop)."""
        if not self.closed_loop:
            return [None] * len(gaps)
        return [None, *(float(g) for g in gaps[1:])]


@dataclass
class SessionArrivals(ArrivalModel):
    """Poisson session starts, log-normal inter-turn gaps (UniCache)."""

    session_rate_per_s: float = 1.0
    preset: str = "chat"
    gap_mu: float | None = None
    gap_sigma: float | None = None
    closed_loop: bool = False
    _clock: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_bool("closed_loop", self.closed_loop)
        if self.preset not in GAP_PRESETS:
            raise ConfigError(
                f"preset '{self.preset}' unknown; choose one of {', '.join(GAP_PRESETS)}"
            )
        check_number("session_rate_per_s", self.session_rate_per_s, 0.0, strict=True)
        if self.gap_mu is not None:
            check_number("gap_mu", self.gap_mu, -1e9)
        if self.gap_sigma is not None:
            check_number("gap_sigma", self.gap_sigma, 0.0, strict=True)

    @property
    def mu_sigma(self) -> tuple[float, float]:
        mu, sigma = GAP_PRESETS[self.preset]
        return (
            mu if self.gap_mu is None else float(self.gap_mu),
            sigma if self.gap_sigma is None else float(self.gap_sigma),
        )

    def schedule(
        self,
        num_turns: int,
        rng: np.random.Generator,
        known: Sequence[float | None] | None = None,
        output_tokens: int = 0,
    ) -> tuple[F64, F64]:
        self._clock += float(rng.exponential(1.0 / self.session_rate_per_s))
        mu, sigma = self.mu_sigma
        gaps = np.zeros(num_turns)
        gaps[1:] = rng.lognormal(mu, sigma, num_turns - 1)
        arrival_gaps = _use_known(gaps, known)
        return self._clock + np.cumsum(arrival_gaps), gaps


@dataclass
class LPCArrivals(ArrivalModel):
    """LPC's conversation schedule: spaced starts, at most ``n_conv`` active, exponential gaps.

    Conversation starts are spaced by exponential gaps of mean ``1 / session_rate_per_s``;
    when ``n_conv`` conversations are active, a start waits for the earliest to finish. A
    conversation's turns are spaced by exponential gaps of mean ``lambda_chat`` seconds, and
    it finishes when its last reply is decoded: its last turn's arrival plus its output
    tokens at ``decode_tokens_per_s`` (as the authors' benchmark client assumes).
    """

    lambda_chat: float = 100.0
    n_conv: int = 200
    session_rate_per_s: float = 10.0
    decode_tokens_per_s: float = 30.0
    closed_loop: bool = False
    _last_start: float = field(default=0.0, init=False, repr=False)
    _active: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_bool("closed_loop", self.closed_loop)
        check_number("lambda_chat", self.lambda_chat, 0.0, strict=True)
        check_number("session_rate_per_s", self.session_rate_per_s, 0.0, strict=True)
        check_number("decode_tokens_per_s", self.decode_tokens_per_s, 0.0, strict=True)
        if isinstance(self.n_conv, bool) or not isinstance(self.n_conv, int) or self.n_conv < 1:
            raise ConfigError(f"n_conv must be an integer >= 1, got {self.n_conv!r}")

    def schedule(
        self,
        num_turns: int,
        rng: np.random.Generator,
        known: Sequence[float | None] | None = None,
        output_tokens: int = 0,
    ) -> tuple[F64, F64]:
        start = self._last_start + float(rng.exponential(1.0 / self.session_rate_per_s))
        while self._active and self._active[0] <= start:
            heapq.heappop(self._active)
        if len(self._active) >= self.n_conv:
            start = max(start, heapq.heappop(self._active))
        self._last_start = start
        gaps = np.zeros(num_turns)
        gaps[1:] = rng.exponential(self.lambda_chat, num_turns - 1)
        times = start + np.cumsum(_use_known(gaps, known))
        heapq.heappush(self._active, float(times[-1]) + output_tokens / self.decode_tokens_per_s)
        return times, gaps


def _use_known(gaps: F64, known: Sequence[float | None] | None) -> F64:
    """Put known think times into ``gaps``; return the open-loop arrival gaps."""
    arrival: F64 = gaps.copy()
    if known is not None:
        for k in range(1, min(len(known), gaps.shape[0])):
            g = known[k]
            if g is not None:
                gaps[k] = g
                arrival[k] = max(arrival[k], g)
    return arrival


ARRIVAL_MODELS: dict[str, type[ArrivalModel]] = {"sessions": SessionArrivals, "lpc": LPCArrivals}


def make_arrivals(spec: str | ArrivalModel, **defaults: object) -> ArrivalModel:
    """Build an arrival model from a spec string (``lpc:lambda_chat=50``) or pass one through.

    ``defaults`` fill parameters the spec leaves out (e.g. a loader's ``preset=agentic``).
    """
    if isinstance(spec, ArrivalModel):
        return spec
    from prefixlab.registry import parse_spec

    name, kwargs = parse_spec(spec, "arrival model")
    if name not in ARRIVAL_MODELS:
        raise ConfigError(
            f"unknown arrival model '{name}'; known: {', '.join(sorted(ARRIVAL_MODELS))}"
        )
    cls = ARRIVAL_MODELS[name]
    names = {f.name for f in fields(cls) if f.init}  # type: ignore[arg-type]
    for key in kwargs:
        if key not in names:
            raise ConfigError(
                f"arrival model '{name}' has no parameter {key!r}; it takes "
                f"{', '.join(sorted(names))}"
            )
    merged = {k: v for k, v in defaults.items() if k in names} | kwargs
    return cls(**merged)


def max_concurrent(starts: Sequence[float], ends: Sequence[float]) -> int:
    """Most sessions active at one instant, a session active over ``[start, end)``.

    A session that ends when another starts frees its place first (as :class:`LPCArrivals`
    hands a finished conversation's place to the next one).
    """
    events = sorted([(float(e), 0) for e in ends] + [(float(s), 1) for s in starts])
    active = best = 0
    for _, kind in events:
        active += 1 if kind == 1 else -1
        best = max(best, active)
    return best
