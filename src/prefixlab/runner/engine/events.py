"""Engine events: what happens to requests in virtual time (observers see these and the
cache's own Hit/Miss/Stored/Removed events)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Arrived:
    request: int
    time_s: float


@dataclass(slots=True, frozen=True)
class Scheduled:
    """The request got memory and its first prefill chunk (again, after a preemption)."""

    request: int
    time_s: float
    num_hit_tokens: int


@dataclass(slots=True, frozen=True)
class FirstToken:
    request: int
    time_s: float


@dataclass(slots=True, frozen=True)
class Finished:
    request: int
    time_s: float


@dataclass(slots=True, frozen=True)
class Preempted:
    """Memory ran out: the request lost its blocks and will be recomputed."""

    request: int
    time_s: float


@dataclass(slots=True, frozen=True)
class StepDone:
    """One scheduler step: prefill chunks and decode tokens run for ``duration_s``."""

    start_s: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int


EngineEvent = Arrived | Scheduled | FirstToken | Finished | Preempted | StepDone
