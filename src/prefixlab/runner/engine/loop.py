"""A small discrete-event loop: it owns time and a heap of events, nothing else.

Entries are ``(time, priority, seq, payload)``; ``seq`` is a per-loop counter, so events at
the same time and priority come out in the order they were scheduled (deterministic, no
global state). Verbs: ``schedule``, ``peek``, ``pop``, ``run(until)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

from prefixlab.errors import ConfigError

T = TypeVar("T")


class EventLoop(Generic[T]):
    """Virtual clock plus a priority queue of payloads."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now = start_s
        self._heap: list[tuple[float, int, int, T]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, at_s: float, payload: T, priority: int = 0) -> None:
        """Add an event at absolute time ``at_s`` (never in the past)."""
        if at_s < self.now:
            raise ConfigError(f"cannot schedule an event at {at_s} s, before now ({self.now} s)")
        heapq.heappush(self._heap, (at_s, priority, self._seq, payload))
        self._seq += 1

    def peek(self) -> float | None:
        """Time of the next event, or None when there is none."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> T:
        """Advance the clock to the next event and return its payload."""
        at_s, _, _, payload = heapq.heappop(self._heap)
        self.now = at_s
        return payload

    def run(self, handle: Callable[[T], None], until_s: float | None = None) -> None:
        """Pop and handle events in order (until ``until_s`` when given)."""
        while self._heap and (until_s is None or self._heap[0][0] <= until_s):
            handle(self.pop())
        if until_s is not None and until_s > self.now:
            self.now = until_s
