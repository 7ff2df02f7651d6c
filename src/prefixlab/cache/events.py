"""Typed cache events (the vocabulary of vLLM/SGLang KV events) and the observer protocol.

Events carry numpy arrays so one event describes a whole request's blocks. Metrics are
observers: nothing in a cache structure computes a report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from prefixlab.types import I64


@dataclass(slots=True, frozen=True)
class Hit:
    """A request found ``num_blocks`` cached blocks (``num_tokens`` tokens) of its prefix."""

    request: int
    num_blocks: int
    num_tokens: int


@dataclass(slots=True, frozen=True)
class Miss:
    """``num_blocks`` of the request's lookup blocks were not served from cache."""

    request: int
    num_blocks: int
    num_tokens: int


@dataclass(slots=True, frozen=True)
class Stored:
    """Blocks (or nodes) newly cached under these dense key ids."""

    keys: I64


@dataclass(slots=True, frozen=True)
class Removed:
    """Cached entries dropped. ``evicted`` is True when a policy chose them (to make room,
    or to keep a bounded free pool within its bound) and False for explicit clears."""

    keys: I64
    evicted: bool = True


@dataclass(slots=True, frozen=True)
class Admitted:
    """An insertion went ahead. The hybrid cache: ``keys`` are the checkpoint positions
    the admission placed (tokens from the sequence's start, ascending), ``tokens`` the
    sequence's tokens stored."""

    keys: I64
    tokens: int = 0


@dataclass(slots=True, frozen=True)
class Rejected:
    """An insertion was refused: by the admission policy (``keys`` empty: vanilla stores
    nothing), or because the sequence cannot fit (``keys``: the checkpoints it would have
    had). ``tokens``: the sequence's tokens, none of them stored."""

    keys: I64
    tokens: int = 0


Event = Hit | Miss | Stored | Removed | Admitted | Rejected


class Observer(Protocol):
    def on_event(self, event: Event) -> None: ...


@dataclass(slots=True, frozen=True)
class MatchResult:
    """Result of a prefix lookup: how much hit and which entries hold it."""

    num_hit_blocks: int
    num_hit_tokens: int
    entries: I64


EMPTY = np.zeros(0, dtype=np.int64)
