"""``opt-online``: evict blocks no waiting request needs (LRU) first, then those needed
furthest ahead in the waiting queue, deepest first (the online OPT of UniCache's
evaluation). It runs under the engine runner only (it reads the waiting queue).

Hand-computed victim orders, a Hypothesis comparison against a naive model, and runs
under the engine with invariant checks after every step. What it shares with
``unicache-opt`` (the waiting positions, the engine checks) is in tests/engine_only.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixlab.policies import EntryView
from prefixlab.policies.opt_online import OPTOnline
from prefixlab.runner.engine import simulate
from prefixlab.types import I64
from prefixlab.workload.trace import Trace
from tests.engine_only import (
    ENGINE,
    TIMING,
    Guard,
    Twin,
    check_clone_and_pickle,
    check_engine_only_run,
    check_replay_refuses,
    check_waiting_positions,
    drive_window,
    mix_trace,
    scenario_trace,
    small_traces,
)
from tests.helpers import BT, Drive, ids, row


@pytest.fixture(scope="module")
def mix() -> Trace:
    return mix_trace()


def test_waiting_positions() -> None:
    check_waiting_positions(OPTOnline)


def _opt_online_stored() -> Drive:
    """Entries 0-6 (key 100 + e) released in order, then 1 is hit: LRU 0 2 3 4 5 6 1.
    Entry 7 stays pinned. Offsets: 2 -> 0, 3 -> 1, 4 -> 2, 5 -> 0 (others 0)."""
    d = Drive(OPTOnline(), [row(0, None)], num_entries=8)
    for e in range(8):
        d.store(0, [e], depths=[{3: 1, 4: 2}.get(e, 0)], release=e != 7)
    d.hit(0, 1)
    return d


def test_opt_online_unneeded_lru_first_then_farthest_waiting() -> None:
    """Waiting: [102 103] [105] [102 103 104 107] -> 102, 103 at 0; 105 at 1; 104 at 2; 107 is
    needed but pinned. Unneeded, LRU order: 0 6 1. Needed, farthest first: 4 (2), 5 (1),
    then position 0 deepest first: 3 (offset 1), 2 (offset 0)."""
    want = [0, 6, 1, 4, 5, 3, 2]
    for chunks in ((7,), (2, 2, 5)):
        d = _opt_online_stored()
        d.policy.on_waiting([ids(102, 103), ids(105), ids(102, 103, 104, 107)])
        got: list[int] = []
        for n in chunks:
            got += d.evict(n)
        assert got == want
        assert d.evict(1) == []
    d = _opt_online_stored()
    d.policy.on_waiting([])
    assert d.evict(8) == [0, 2, 3, 4, 5, 6, 1]  # plain LRU


class RefOPTOnline:
    """A naive opt-online: sort every evictable entry by (needed?, -position, -offset, LRU)."""

    def __init__(self, view: EntryView) -> None:
        self.view = view
        self.lru: list[int] = []
        self.pos: dict[int, int] = {}

    def on_waiting(self, waiting: Sequence[I64]) -> None:
        self.pos = {}
        for i, keys in enumerate(waiting):
            for k in keys.tolist():
                self.pos.setdefault(k, i)

    def evict(self, n: int) -> list[int]:
        def rank(item: tuple[int, int]) -> tuple[int, ...]:
            i, e = item
            p = self.pos.get(int(self.view.key[e]))
            return (0, i) if p is None else (1, -p, -int(self.view.depth[e]), i)

        out = [e for _, e in sorted(enumerate(self.lru), key=rank)[:n]]
        self.lru = [e for e in self.lru if e not in out]
        return out


class TwinOPTOnline(Twin, OPTOnline):
    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.ref = RefOPTOnline(view)
        self.num_victims = 0

    def on_waiting(self, waiting_keys: Sequence[I64]) -> None:
        super().on_waiting(waiting_keys)
        self.ref.on_waiting(waiting_keys)

    def on_evictable(self, entries: I64) -> None:
        super().on_evictable(entries)
        self.ref.lru += entries.tolist()

    def on_access(self, entries: I64) -> None:
        super().on_access(entries)
        for e in entries.tolist():
            if e in self.ref.lru:
                self.ref.lru.remove(e)
                self.ref.lru.append(e)

    def on_pinned(self, entries: I64) -> None:
        super().on_pinned(entries)
        self.ref.lru = [e for e in self.ref.lru if e not in entries.tolist()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=small_traces(),
    slack=st.integers(0, 6),
    window=st.integers(1, 2),
    lookahead=st.integers(0, 4),
)
def test_opt_online_matches_a_naive_reference(
    trace: Trace, slack: int, window: int, lookahead: int
) -> None:
    held = int(trace.block_layout(BT).num_blocks_held.max())
    drive_window(trace, TwinOPTOnline(), held + slack, window, lookahead)


def test_the_twin_does_evict() -> None:
    """The property test compares something: on a fixed trace the twin evicts."""
    opt = TwinOPTOnline()
    drive_window(scenario_trace()[0], opt, 8, 2, 3)
    assert opt.num_victims > 5


# ----------------------------------------------------------------------------- engine runner
class GuardedOPTOnline(Guard, OPTOnline):
    pass


def test_runs_checked_and_deterministic_under_the_engine(mix: Trace) -> None:
    check_engine_only_run(mix, GuardedOPTOnline(), "opt-online")


def test_opt_online_beats_lru_under_the_engine(mix: Trace) -> None:
    lru = simulate(mix, "lru", ENGINE, TIMING)
    opt = simulate(mix, "opt-online", ENGINE, TIMING)
    assert int(opt.hit_tokens.sum()) >= int(lru.hit_tokens.sum())


def test_replay_refuses_it() -> None:
    check_replay_refuses("opt-online")


def test_clone_and_pickle() -> None:
    check_clone_and_pickle("opt-online")
