"""The reference loop's run: one virtual clock, one or more engine replicas, and where each
arrival goes.

A run owns the event heap and per-request times; each replica is a
:class:`~prefixlab.runner.engine.scheduler.Scheduler` over its own cache, told apart by its
index. At each instant, step ends come before arrivals (``STEP`` < ``ARRIVE``); an arrival
is given to the replica its :class:`Dispatch` picks; then every idle replica starts its
next step. A replica with nothing to run but requests waiting for tier loads wakes when
the first load ends. With one replica and no dispatch this is the engine runner's
reference loop.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from prefixlab.cache.events import Observer
from prefixlab.model.timing import TimingModel
from prefixlab.runner.engine.events import Arrived, Finished, StepDone
from prefixlab.runner.engine.loop import EventLoop
from prefixlab.runner.engine.scheduler import Batch, Scheduler
from prefixlab.types import I64
from prefixlab.workload.trace import Trace

STEP, ARRIVE = 0, 1  # event priorities at one instant: step ends before arrivals


class Dispatch(Protocol):
    """Where arrivals go, told what a router sees of the answers: first tokens and ends."""

    def route(self, r: int, now: float) -> int: ...
    def first_token(self, r: int, replica: int, now: float) -> None: ...
    def finished(self, r: int, replica: int, now: float) -> None: ...


def arrival_plan(trace: Trace, closed_loop: bool) -> tuple[I64, np.ndarray, I64]:
    """The arrivals known at the start (requests and times, in the order they are
    scheduled) and, per request, the one that arrives after it finishes (-1: none).

    Open loop: every request at its trace time. Closed loop: a session's first request
    arrives at its trace time; each later one a think time after its predecessor finishes
    (gated: at its trace time, but not before its predecessor finishes)."""
    n = len(trace)
    next_turn = np.full(n, -1, np.int64)
    if not closed_loop:
        return np.arange(n, dtype=np.int64), trace.arrival_s.astype(np.float64), next_turn
    last: dict[str, int] = {}
    first: list[int] = []
    order = np.lexsort((trace.turn, trace.arrival_s))
    for r in order.tolist():
        sid = trace.session_id[r]
        if sid is not None and sid in last:
            next_turn[last[sid]] = r
        else:
            first.append(r)
        if sid is not None:
            last[sid] = r
    idx = np.array(first, dtype=np.int64)
    return idx, trace.arrival_s[idx].astype(np.float64), next_turn


class Run:
    """One simulation's mutable state: the loop, the clock, per-request times, and the
    replicas (their schedulers, observers and whether a step is under way)."""

    def __init__(
        self,
        trace: Trace,
        scheds: list[Scheduler],
        timing: TimingModel,
        observers: list[list[Observer]],
        arrivals: tuple[bool, bool],
        check_every: int,
        dispatch: Dispatch | None = None,
    ) -> None:
        n = len(trace)
        self.scheds = scheds
        self.timing = timing
        self.observers = observers
        self.check_every = check_every
        self.dispatch = dispatch
        # a request (ARRIVE), a Batch (STEP) or a wake-up (None), each with its replica
        self.loop: EventLoop[tuple[int, int | Batch | None]] = EventLoop()
        self.wake_s = [math.nan] * len(scheds)
        self.arrival_s = np.full(n, np.nan)
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.replica = np.full(n, -1, np.int64)
        self.think_s = trace.think_s
        self.trace_arrival = trace.arrival_s
        self.busy = [False] * len(scheds)
        self.num_steps = 0
        closed_loop, self.gated = arrivals
        first, times, self.next_turn = arrival_plan(trace, closed_loop or self.gated)
        for r, t in zip(first.tolist(), times.tolist(), strict=True):
            self.loop.schedule(t, (-1, r), ARRIVE)

    def _think(self, prev: int, r: int, now: float) -> float:
        if self.gated:
            return max(float(self.trace_arrival[r]) - now, 0.0)
        t = float(self.think_s[r])
        if math.isnan(t):
            t = max(float(self.trace_arrival[r] - self.trace_arrival[prev]), 0.0)
        return t

    def _emit(self, i: int, event: object) -> None:
        for o in self.observers[i]:
            o.on_event(event)  # type: ignore[arg-type]

    def go(self) -> None:
        loop = self.loop
        while (now := loop.peek()) is not None:
            while loop.peek() == now:
                i, payload = loop.pop()
                if isinstance(payload, Batch):
                    self._step_done(i, payload, now)
                elif payload is not None:
                    self._arrive(payload, now)
            for i, busy in enumerate(self.busy):
                if not busy:
                    self._start_step(i, now)
        for s in self.scheds:
            if s.waiting or s.running:  # pragma: no cover - a scheduler bug
                raise AssertionError("simulation ended with unfinished requests")

    def _arrive(self, r: int, now: float) -> None:
        i = 0 if self.dispatch is None else self.dispatch.route(r, now)
        self.replica[r] = i
        self.arrival_s[r] = now
        self._emit(i, Arrived(r, now))
        self.scheds[i].add(r)

    def _start_step(self, i: int, now: float) -> None:
        sched = self.scheds[i]
        batch = sched.schedule(now)
        if batch is None:
            wake = sched.next_ready()
            if wake is not None and wake > now and wake != self.wake_s[i]:
                self.wake_s[i] = wake
                self.loop.schedule(wake, (i, None), STEP)
            return
        for r, _, _ in batch.chunks:
            if math.isnan(self.scheduled_s[r]):
                self.scheduled_s[r] = now
        hits = sched.admit_hits
        duration = self.timing.step_s(
            [(n, cached, cached - hits[r]) for r, n, cached in batch.chunks],
            [d[1] for d in batch.decodes],
        )
        self.busy[i] = True
        self.num_steps += 1
        self.loop.schedule(now + duration, (i, batch), STEP)
        self._emit(
            i,
            StepDone(
                now,
                duration,
                sum(c[1] for c in batch.chunks),
                len(batch.decodes),
                len(sched.running),
                len(sched.waiting),
            ),
        )

    def _step_done(self, i: int, batch: Batch, now: float) -> None:
        self.busy[i] = False
        first, done = self.scheds[i].complete(batch, now)
        for r in first:
            self.first_token_s[r] = now
            if self.dispatch is not None:
                self.dispatch.first_token(r, i, now)
        for r in done:
            self.finish_s[r] = now
            self._emit(i, Finished(r, now))
            if self.dispatch is not None:
                self.dispatch.finished(r, i, now)
            nxt = int(self.next_turn[r])
            if nxt >= 0:
                self.loop.schedule(now + self._think(r, nxt, now), (-1, nxt), ARRIVE)
        if self.check_every and self.num_steps % self.check_every == 0:
            self.scheds[i].check()
