"""What the tests of the engine-only policies share: ``opt-online`` (test_opt_online.py) and
``unicache-opt`` (test_unicache.py) keep the waiting queue's first positions the same way,
run under the engine runner only, and are compared with naive models on the same traces.

Here: the hand scenario, the Hypothesis trace strategy and the windowed driver of the
property tests, the engine settings and its workload, the victim guard, and the checks
both policies pass (each file runs them for its own policy).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pytest
from hypothesis import strategies as st

from prefixlab.cache.block import BlockCache
from prefixlab.errors import ConfigError
from prefixlab.model.timing import make_timing
from prefixlab.policies import EntryView, EvictionPolicy, make_policy, opt_online, unicache
from prefixlab.policies.opt_online import OPTOnline
from prefixlab.policies.unicache import UniCacheOPT
from prefixlab.runner.engine import EngineConfig, EngineResult, simulate
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.types import I64
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Request, Trace
from tests.helpers import BT, Drive, ids, row, tok

#: the replay scenario: (arrival, task, session, input ids, output ids or length, block prefix)
SCENARIO: list[tuple[int, str, str | None, list[int], list[int] | int, str]] = [
    (0, "chat", "a", [1, 2, 3, 4], [5, 6], "A"),
    (1, "untemplated", None, [11, 12, 13, 14], [15, 16], "U"),
    (2, "programming", None, [21, 22, 23, 24, 25, 26], [27, 28], "P"),
    (3, "agentic", "b", [31, 32], [33, 34], "G"),
    (4, "chat", "a", [1, 2, 3, 4, 5, 6, 7, 8], [9, 10], "A"),
    (5, "tool-use", None, [41, 42, 43, 44], 0, "T"),
    (6, "untemplated", None, [51, 52], [53, 54], "V"),
    (7, "programming", None, [21, 22, 23, 24, 61], 0, "P"),
]


def scenario_trace() -> tuple[Trace, dict[int, str]]:
    reqs = [tok(t, task, s, i, o, turn=int(t == 4)) for t, task, s, i, o, _ in SCENARIO]
    trace = Trace.from_requests(reqs)
    layout = trace.block_layout(BT)
    label: dict[int, str] = {}
    for r, (*_, prefix) in enumerate(SCENARIO):
        for d, k in enumerate(layout.request_keys(r).tolist()):
            label.setdefault(k, f"{prefix}{d}")
    return trace, label


TASKS = ["chat", "agentic", "programming", "untemplated", "tool-use", None, "mystery"]


@st.composite
def small_traces(draw: st.DrawFn) -> Trace:
    """2-14 requests over three 6-token system prompts and session continuations (a prior
    request's prompt and reply plus new tokens), so prefixes, replies and gaps recur."""
    systems = [list(range(1000 * k + 1, 1000 * k + 7)) for k in range(3)]
    fresh = iter(range(100_000, 200_000))
    seqs: list[list[int]] = []
    reqs: list[Request] = []
    t = 0.0
    for i in range(draw(st.integers(2, 14))):
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 5.0, 30.0, 200.0]))
        if i and draw(st.booleans()):
            head = seqs[draw(st.integers(0, i - 1))]
        else:
            head = systems[draw(st.integers(0, 2))][: draw(st.integers(0, 6))]
        inp = head + [next(fresh) for _ in range(draw(st.integers(0 if head else 1, 5)))]
        n_out = draw(st.integers(0, 3))
        out = [next(fresh) for _ in range(n_out)] if draw(st.booleans()) else None
        seqs.append(inp + (out or []))
        reqs.append(
            Request(
                arrival_s=t,
                input_length=len(inp),
                output_length=n_out,
                session_id=draw(st.sampled_from([None, "s0", "s1"])),
                task=draw(st.sampled_from(TASKS)),
                input_tokens=inp,
                output_tokens=out,
            )
        )
    return Trace.from_requests(reqs)


def drive_window(
    trace: Trace, policy: EvictionPolicy, capacity: int, window: int, lookahead: int
) -> None:
    """Runs requests in order on a BlockCache, up to ``window`` at once (the oldest released
    when a new one is admitted, or when it does not fit); before each admission the policy
    sees the lookup keys of the next ``lookahead`` requests (the waiting queue)."""
    layout = trace.block_layout(BT)
    cache = BlockCache(capacity, policy, layout.num_distinct_keys, block_tokens=BT)
    if policy.needs_trace:
        policy.prepare_trace(trace, "arrival")
    running: list[I64] = []
    n = len(trace)
    for r in range(n):
        cache.view.now = float(trace.arrival_s[r])
        cache.view.request_index = r
        if lookahead:
            policy.on_waiting(
                [
                    layout.request_keys(w)[: int(layout.num_lookup_blocks[w])]
                    for w in range(r, min(n, r + lookahead))
                ]
            )
        keys = layout.request_keys(r)
        while True:
            m = cache.match(
                keys[: int(layout.num_lookup_blocks[r])], int(layout.lookup_end_tokens[r])
            )
            held = cache.acquire(m, int(layout.num_blocks_held[r]), keys[m.num_hit_blocks :])
            if held is not None:
                break
            assert running, "a lone request must fit"
            cache.release(running.pop(0))
        cache.commit(held, keys, m.num_hit_blocks)
        running.append(held)
        while len(running) >= window:
            cache.release(running.pop(0))
        cache.check()
    for h in running:
        cache.release(h)
    cache.check()


def waiting_positions(pol: OPTOnline | UniCacheOPT, keys: range) -> dict[int, int]:
    """The policy's first-waiting-position row (-1: not waited for), as a dict."""
    row = pol.state[0][opt_online.WPOS if isinstance(pol, OPTOnline) else unicache.WPOS]
    return {k: int(row[k]) for k in keys if row[k] >= 0}


class Reference(Protocol):
    def evict(self, n: int) -> list[int]: ...


class Twin(EvictionPolicy):
    """Mixin: every victim list is compared with the naive reference's (``ref``), and
    counted (``num_victims``), so a property test is known to compare something."""

    ref: Reference
    num_victims: int = 0

    def evict(self, n: int) -> I64:
        got = super().evict(n)
        assert got.tolist() == self.ref.evict(n)
        self.num_victims += int(got.shape[0])
        return got


def check_waiting_positions(cls: type[OPTOnline] | type[UniCacheOPT]) -> None:
    """Each key's first waiting request, and a new queue forgets the old one's keys."""
    pol = cls()
    Drive(pol, [row(0, None)], num_entries=4)
    pol.on_waiting([ids(3, 1), ids(1, 2), ids()])
    assert waiting_positions(pol, range(8)) == {3: 0, 1: 0, 2: 1}
    pol.on_waiting([])
    assert waiting_positions(pol, range(8)) == {}
    pol.on_waiting([ids(), ids()])
    assert waiting_positions(pol, range(8)) == {}
    pol.on_waiting([ids(5), ids(2, 5)])
    assert waiting_positions(pol, range(8)) == {5: 0, 2: 1}


TIMING = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.02")
#: the largest request holds 210 blocks; at most 4 running requests, so requests wait and
#: the waiting queue's blocks are sometimes all that is left to evict
ENGINE = EngineConfig(capacity_blocks=230, block_tokens=64, max_num_seqs=4)


def mix_trace() -> Trace:
    """The engine tests' workload: 300 requests of the task mix (UniCache's trace 2)."""
    return GENERATORS["mix"].fn(trace=2, num_requests=300)


class Guard(EvictionPolicy):
    """Mixin: tracks the evictable entries and the waiting queue's keys; every victim must be
    evictable, unpinned, chosen once, and an unneeded one must not be left behind when a
    needed one goes."""

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.free: set[int] = set()
        self.needed: set[int] = set()
        self.num_victims = 0
        self.num_needed_victims = 0

    def on_waiting(self, waiting_keys: Sequence[I64]) -> None:
        super().on_waiting(waiting_keys)
        self.needed = {k for keys in waiting_keys for k in keys.tolist()}

    def on_evictable(self, entries: I64) -> None:
        assert not self.free & set(entries.tolist()), "announced evictable twice"
        self.free.update(entries.tolist())
        super().on_evictable(entries)

    def on_pinned(self, entries: I64) -> None:
        assert set(entries.tolist()) <= self.free, "pinned but never evictable"
        self.free.difference_update(entries.tolist())
        super().on_pinned(entries)

    def evict(self, n: int) -> I64:
        victims = super().evict(n)
        got = victims.tolist()
        assert len(got) == len(set(got)) == min(n, len(self.free)), (n, got)
        assert set(got) <= self.free and (self.view.ref[victims] == 0).all()
        self.free.difference_update(got)
        key = self.view.key
        if any(int(key[e]) in self.needed for e in got):
            self.num_needed_victims += 1
            left = [e for e in self.free if int(key[e]) not in self.needed]
            assert not left, f"needed blocks evicted while unneeded {left[:5]} stay"
        self.num_victims += len(got)
        return victims


def same(a: EngineResult, b: EngineResult) -> None:
    for name in (
        "arrival_s",
        "scheduled_s",
        "first_token_s",
        "finish_s",
        "hit_tokens",
        "num_preemptions",
    ):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    # JSON text: NaN latencies (no TPOT for one-token replies) compare equal
    plain = [
        json.dumps({k: v for k, v in m.items() if k != "elapsed_s"}, sort_keys=True)
        for m in (a.metrics, b.metrics)
    ]
    assert plain[0] == plain[1]


def check_engine_only_run(mix: Trace, guarded: Guard, name: str) -> None:
    """check_every=1 (cache and scheduler invariants after every step) with a guard on
    every victim; then again unguarded and unchecked: the same results bit for bit."""
    checked = simulate(mix, guarded, ENGINE, TIMING, check_every=1)
    # needed blocks did go (only when nothing else was left: the guard checks it)
    assert guarded.num_victims > 1000 and guarded.num_needed_victims > 0
    assert checked.metrics["num_preemptions"] > 0  # tight enough to preempt
    same(checked, simulate(mix, name, ENGINE, TIMING))


def check_replay_refuses(name: str) -> None:
    trace = scenario_trace()[0]
    cfg = ReplayConfig(capacity_blocks=32, block_tokens=BT)
    for pol in (name, make_policy(name)):
        with pytest.raises(ConfigError, match="engine runner"):
            replay(trace, pol, cfg)


def check_clone_and_pickle(spec: str) -> None:
    """Clones are fresh; a pickled bound policy picks the same next victims."""
    trace = scenario_trace()[0]
    cfg = EngineConfig(capacity_blocks=10, block_tokens=BT)
    pol = make_policy(spec)
    clone = pol.clone()
    assert clone.spec() == pol.spec() and make_policy(pol.spec()).params() == pol.params()
    res = simulate(trace, pol, cfg, TIMING, check_every=1)
    assert not hasattr(pol.clone(), "view")
    same(res, simulate(trace, clone, cfg, TIMING))
    copy = pickle.loads(pickle.dumps(pol))
    assert copy.evict(3).tolist() == pol.evict(3).tolist()
