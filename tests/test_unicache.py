"""UniCache (``unicache``, ``unicache-opt``). WA, the other baseline, is in
test_workload_aware.py; ``opt-online``, which keeps the waiting queue as UniCache-OPT does,
in test_opt_online.py (what the two share: tests/engine_only.py).

Hand-computed queue assignments, victim orders, Algorithm 2 weight steps, the online gap fit,
the stage-2 ablation; Hypothesis comparisons against naive
reference models; and the engine-only policies (which the conformance suite skips) run under
the engine runner with invariant checks after every step.

Blocks hold ``BT = 2`` tokens throughout (``BT`` tokens per entry in directly driven views).
Every expectation is derived by hand in the comment next to it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixlab.errors import ConfigError
from prefixlab.policies import EntryView, make_policy
from prefixlab.policies.unicache import (
    AGENTIC,
    CHAT,
    EVICT,
    QUEUES,
    STRUCT,
    UniCache,
    UniCacheOPT,
    lognormal_cdf,
    parse_tasks,
    update_weights,
)
from prefixlab.policies.workload_aware import (
    WorkloadAware,
)
from prefixlab.runner.engine import simulate
from prefixlab.runner.replay import ReplayConfig, ReplayResult, replay
from prefixlab.workload.arrivals import GAP_PRESETS
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
    same,
    scenario_trace,
    small_traces,
)
from tests.helpers import BT, Drive, ids, row, tok

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
C, A, S, E = "chat", "agentic", "structural", "evict"  # queue names, as in QUEUES


def phi(z: float) -> float:
    """Standard normal CDF (an independent formula for the expectations)."""
    return statistics.NormalDist().cdf(z)


# ----------------------------------------------------------------------------- helpers
def queues_of(pol: UniCache, entries: Sequence[int]) -> list[str]:
    return [QUEUES[int(q)] if q >= 0 else "-" for q in pol.queue[list(entries)]]


# ----------------------------------------------------------------------------- UniCache: basics
def test_lognormal_cdf_matches_the_normal_cdf_of_the_log() -> None:
    for mu, sigma in ((4.15, 0.971), (1.81, 1.092), (0.0, 1.0), (-2.0, 0.1)):
        for x in (1e-3, 0.5, 1.0, 7.0, 63.4, 1e4):
            want = statistics.NormalDist(mu, sigma).cdf(math.log(x))
            assert lognormal_cdf(x, mu, sigma) == pytest.approx(want, rel=1e-12, abs=1e-300)
        # the median is e^mu; one sigma above it is Phi(1)
        assert lognormal_cdf(math.exp(mu), mu, sigma) == pytest.approx(0.5, rel=1e-12)
        assert lognormal_cdf(math.exp(mu + sigma), mu, sigma) == pytest.approx(
            0.8413447460685429, rel=1e-12
        )
        assert lognormal_cdf(0.0, mu, sigma) == 0.0 and lognormal_cdf(-3.0, mu, sigma) == 0.0


def test_parse_tasks_defaults_overrides_and_errors() -> None:
    default = parse_tasks("")
    assert default["chat"] == CHAT and default["swe-agent"] == AGENTIC
    assert default["untemplated"] == EVICT and default["document-qa"] == STRUCT
    got = parse_tasks(" programming:evict / my-bot:agentic /")  # spaces, a trailing '/'
    assert got["programming"] == EVICT and got["my-bot"] == AGENTIC and got["chat"] == CHAT
    # rpartition: only the last ':' separates the queue
    assert parse_tasks("ns:qa:structural")["ns:qa"] == STRUCT
    for bad in ("chat", ":chat", "chat:nowhere", "a:chat/b"):
        with pytest.raises(ValueError, match="TASK:QUEUE"):
            parse_tasks(bad)
    with pytest.raises(ConfigError, match="TASK:QUEUE"):
        make_policy("unicache:tasks=chat")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("unicache:fit=offline", "fit must be"),
        ("unicache:offset=block", "offset must be one of global, cached, request"),
        ("unicache:alg2=exact", "alg2 must be 'paper' or 'clip-ehat'"),
        ("unicache:hits=all", "hits must be 'window' or 'cumulative'"),
        ("unicache:update_every=0", "update_every must be"),
        ("unicache:temperature=0", "temperature must be > 0"),
        ("unicache:beta=1.5", "beta must be in"),
        ("unicache:stage2=1", "stage2 must be"),
        ("unicache-opt:min_gaps=0", "min_gaps must be"),
        ("wa:max_turn=0", "max_turn must be"),
        ("wa:profile=0", "profile must be"),
        ("wa:window_s=60", "policy 'wa' has no parameter 'window_s'"),
        ("wa-atc25:window_s=-1", "window_s must be"),
        ("wa-atc25:min_samples=0", "min_samples must be"),
    ],
)
def test_bad_parameters_are_config_errors(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_policy(spec)


def test_unlabelled_and_mapped_tasks_choose_the_queue() -> None:
    rows = [
        row(0, None, "s"),  # unlabelled in a session: chat-like
        row(1, None),  # unlabelled single turn: templated-like
        row(2, "mystery", "s2"),  # unknown label: the same fallback
        row(3, "mystery"),
        row(4, "tool-agent", "t"),  # a default label of the agentic queue (ToolBench chains)
        row(5, "programming"),
        row(6, "chat", "c"),
    ]
    for tasks, want in (
        ("", [C, S, C, S, A, S, C]),
        # remapping changes the queue (and a chat block mapped to evict goes first)
        ("mystery:agentic/programming:chat/chat:evict", [C, S, A, A, A, C, E]),
    ):
        pol = UniCache(tasks=tasks)
        d = Drive(pol, rows)
        for r in range(len(rows)):
            d.store(r, [r])  # one block at depth 0 (inside every 4-token prompt)
        assert queues_of(pol, range(len(rows))) == want, tasks


# ----------------------------------------------------------------------------- UniCache: replay
def _replay_snapshots(
    pol: UniCache, capacity: int = 12
) -> tuple[ReplayResult, list[dict[str, str]]]:
    """Replay the scenario; after each request, cached block label -> its queue."""
    trace, label = scenario_trace()
    snaps: list[dict[str, str]] = []

    def snap(r: int) -> None:
        keys = pol.view.key
        cached = np.flatnonzero(keys >= 0)
        snaps.append({label[int(keys[b])]: QUEUES[int(pol.queue[b])] for b in cached})

    res = replay(
        trace,
        pol,
        ReplayConfig(capacity_blocks=capacity, block_tokens=BT),
        on_step=snap,
        check_every=1,
    )
    return res, snaps


def test_replay_queues_and_evict_first_order() -> None:
    """Capacity 12 blocks of 2 tokens; min_recompute_tokens = 1 (lookups cap at
    (input - 1) // 2 blocks).

    r0 chat a: A0 A1 (prompt) A2 (reply) -> chat (a session's reply is reused: not evict).
    r1 untemplated: U0 U1 U2 -> evict (its prefill too).
    r2 programming, 6-token prompt: P0 P1 P2 structural; P3 ((3+1)*2 = 8 > 6: decode) evict.
    r3 agentic b: G0 G1 agentic. 3 + 3 + 4 + 2 = 12 blocks: full, nothing evicted yet.
    r4 chat a, 8-token prompt: hits A0 A1 A2 (6 tokens), needs 2 more of its 5 blocks:
       the evict queue goes first, largest offset first: P3 (offset 3), U2 (offset 2).
    r5 tool-use (structural), 2 blocks: evict queue again: U1, U0.
    r6 untemplated, 2 blocks: the evict queue is empty -> stage 2 at t = 6 (alpha = 1):
       structural max offset 2: P2 has s = 1 - 2/2 = 0 -> out; then P1 (offset 1, released
       before T1) s = 0.5; agentic G (idle 3 s) s = 1 - Phi((ln 3 - 1.81) / 1.092) = 0.743;
       chat A (idle 2 s) s = 1 - Phi((ln 2 - 4.15) / 0.971) = 0.9998 -> P1 out.
    r7 programming [21 22 23 24 61]: looks up P0 P1 (cap (5-1)//2 = 2): P0 hits (2 tokens),
       P1 was evicted; 3 blocks held, 2 new: the evict queue: V1, V0.
    """
    pol = UniCache()
    res, snaps = _replay_snapshots(pol)
    chat_a = {"A0": C, "A1": C, "A2": C}
    assert snaps[0] == chat_a
    assert snaps[1] == {**chat_a, "U0": E, "U1": E, "U2": E}
    assert snaps[2] == {**snaps[1], "P0": S, "P1": S, "P2": S, "P3": E}
    assert snaps[3] == {**snaps[2], "G0": A, "G1": A}
    base = {**chat_a, "A3": C, "A4": C, "P0": S, "P1": S, "P2": S, "G0": A, "G1": A}
    assert snaps[4] == {**base, "U0": E, "U1": E}
    assert snaps[5] == {**base, "T0": S, "T1": S}
    del base["P1"], base["P2"]
    assert snaps[6] == {**base, "T0": S, "T1": S, "V0": E, "V1": E}
    assert snaps[7] == {**base, "T0": S, "T1": S, "P1": S}
    assert res.hit_tokens.tolist() == [0, 0, 0, 0, 6, 0, 0, 2]
    assert pol.weight_history == []  # 8 requests < update_every = 10
    # the replay clock is the arrival time: s of the agentic blocks at r7 (t = 7, idle 4 s)
    g0 = int(np.flatnonzero(pol.queue == AGENTIC)[0])
    mu, sigma = GAP_PRESETS["agentic"]
    assert pol.local_priority(g0, AGENTIC, pol.now()) == pytest.approx(
        1 - phi((math.log(4.0) - mu) / sigma), rel=1e-9
    )


def test_replay_tasks_mapping_changes_the_victims() -> None:
    """tasks=tool-use:evict: r5's T0 T1 join the evict queue, so r6 evicts them (T1 first,
    the larger offset) instead of P2 P1; r7 then hits P0 and P1: 4 tokens."""
    pol = UniCache(tasks="tool-use:evict")
    res, snaps = _replay_snapshots(pol)
    assert snaps[5]["T0"] == E and snaps[5]["T1"] == E
    assert {"P1", "P2"} <= set(snaps[6]) and not {"T0", "T1"} & set(snaps[6])
    assert res.hit_tokens.tolist() == [0, 0, 0, 0, 6, 0, 0, 4]


# ----------------------------------------------------------------------------- UniCache: direct
LN100 = math.log(100.0)
#: given gap models chosen for round numbers at t = 100: chat idle 100 s -> CDF 0.5 (s = 0.5);
#: chat idle 50 s -> s = 1 - Phi(-ln 2); agentic idle 70 s -> z = 1, s = 1 - Phi(1)
GIVEN: dict[str, Any] = {
    "fit": "given",
    "chat_mu": LN100,
    "chat_sigma": 1.0,
    "agentic_mu": math.log(70.0) - 1.0,
    "agentic_sigma": 1.0,
}
ROWS = [
    row(0, "chat", "a", n_in=8),  # r0: entries 0-3 prompt, 4 reply (still chat)
    row(10, "programming", n_in=8),  # r1: 5-8 structural (offsets 0-3), 9 decode -> evict
    row(20, "untemplated"),  # r2: 10 11 evict
    row(30, "agentic", "c"),  # r3: 12 13 agentic
    row(50, "chat", "b"),  # r4: 14 15 chat, idle 50 s at t = 100
    row(100, "chat", "a", turn=1),  # r5: evictions happen here (t = 100)
]


def _stored(pol: UniCache) -> Drive:
    d = Drive(pol, ROWS)
    d.store(0, [0, 1, 2, 3, 4])
    d.store(1, [5, 6, 7, 8, 9])
    d.store(2, [10, 11])
    d.store(3, [12, 13])
    d.store(4, [14, 15])
    d.at(5)
    return d


def test_direct_queue_assignment_and_local_priorities() -> None:
    pol = UniCache(**GIVEN)
    _stored(pol)
    assert queues_of(pol, range(16)) == [C] * 5 + [S] * 4 + [E] * 3 + [A] * 2 + [C] * 2
    assert pol.max_offset == 3  # the deepest structural block (entry 9 is evict)
    assert pol.held.tolist() == [3.0, 7.0, 2.0, 4.0]  # evict, chat, agentic, structural
    now = pol.now()
    assert now == 100.0
    assert pol.local_priority(0, CHAT, now) == 0.5  # ln(100) - mu = 0 exactly
    assert pol.local_priority(14, CHAT, now) == pytest.approx(1 - phi(-math.log(2)), rel=1e-12)
    assert pol.local_priority(12, AGENTIC, now) == pytest.approx(1 - phi(1.0), rel=1e-12)
    assert [pol.local_priority(e, STRUCT, now) for e in (8, 7, 6, 5)] == pytest.approx(
        [0.0, 1 / 3, 2 / 3, 1.0]
    )
    assert pol.local_priority(9, EVICT, now) == 0.0


@pytest.mark.parametrize(
    ("alpha", "order"),
    [
        # alpha = 1. Evict queue first, largest offset first: 9 (4), 11 (1), 10 (0).
        # Stage 2 (G = s): structural 8 (s 0); agentic 13 12 (0.159, 13 released first);
        # structural 7 (1/3) < chat 0.5; chat 4 3 2 1 0 (idle 100 s, tail released first)
        # < structural 6 (2/3); 6 < chat 15 (idle 50 s: 0.756); 15 14 < structural 5 (1).
        ({}, [9, 11, 10, 8, 13, 12, 7, 4, 3, 2, 1, 0, 6, 15, 14, 5]),
        # alpha_structural = 2: G = 0, 2/3, 4/3, 2. After 8 and the agentic pair, chat 0.5
        # < 2/3: 4..0; then 7 (2/3) < chat 15 (0.756); 15 14 < 6 (4/3); 6, 5.
        ({STRUCT: 2.0}, [9, 11, 10, 8, 13, 12, 4, 3, 2, 1, 0, 7, 15, 14, 6, 5]),
        # alpha_chat = 0.2: chat G = 0.1 (idle 100) and 0.151 (idle 50) < agentic 0.159.
        ({CHAT: 0.2}, [9, 11, 10, 8, 4, 3, 2, 1, 0, 15, 14, 13, 12, 7, 6, 5]),
    ],
)
def test_direct_victims_evict_first_then_lowest_weighted_priority(
    alpha: dict[int, float], order: list[int]
) -> None:
    pol = UniCache(update_every=10**9, **GIVEN)
    d = _stored(pol)
    for q, a in alpha.items():
        pol.alpha[q] = a
    assert d.evict(3) == order[:3]  # the evict queue alone
    assert d.evict(20) == order[3:]
    assert d.evict(1) == []
    assert pol.held.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_direct_hit_requeues_and_pinned_blocks_stay() -> None:
    """r5 (chat a, t = 100) hits structural block 8: it joins the chat queue with t_last =
    100 (s = 1 - CDF(0) = 1) and the structural queue earns the hit. It also keeps block 7
    pinned. Order: 9 11 10; agentic 13 12 (0.159); chat 4..0 (0.5) < structural 6 (2/3);
    6 < chat 15 (0.756); 15 14; then chat 8 (s 1) ties structural 5 (s 1): the chat queue
    comes first in the scan and the comparison is strict -> 8, then 5. 7 is never offered."""
    pol = UniCache(update_every=10**9, **GIVEN)
    d = _stored(pol)
    d.hit(5, 8)
    d.hit(5, 7, release=False)
    assert queues_of(pol, [7, 8]) == [C, C]
    assert pol.hits.tolist() == [0.0, 0.0, 0.0, 2.0]
    assert pol.t_last[8] == 100.0
    assert pol.max_offset == 3  # never shrinks
    assert d.evict(20) == [9, 11, 10, 13, 12, 4, 3, 2, 1, 0, 6, 15, 14, 8, 5]


def test_offset_global_versus_request() -> None:
    """Two programming prompts: X 8 tokens (span 4 blocks, entries 0-3 at offsets 0-3) and
    Y 6 tokens (span 3, entries 4-6 at offsets 0-2); X released first.

    global (max offset 3): s = 1 - offset/3, deepest first, ties by release order:
        0:3, then offset 2: X2 (2) before Y2 (6), offset 1: 1, 5; offset 0: 0, 4.
    request: s = 1 - offset/span: X3 0.25, Y2 1/3, X2 0.5, Y1 2/3, X1 0.75, X0 = Y0 = 1.
    """
    rows = [row(0, "programming", n_in=8), row(1, "programming", n_in=6), row(2, "chat", "z")]
    orders = {}
    for offset in ("global", "request"):
        pol = UniCache(offset=offset)
        d = Drive(pol, rows)
        d.store(0, [0, 1, 2, 3])
        d.store(1, [4, 5, 6])
        d.at(2)
        s = [pol.local_priority(e, STRUCT, 2.0) for e in range(7)]
        if offset == "global":
            assert s == pytest.approx([1, 2 / 3, 1 / 3, 0, 1, 2 / 3, 1 / 3])
        else:
            assert s == pytest.approx([1, 0.75, 0.5, 0.25, 1, 2 / 3, 1 / 3])
        orders[offset] = d.evict(7)
    assert orders == {"global": [3, 2, 6, 1, 5, 0, 4], "request": [3, 6, 2, 5, 1, 0, 4]}


def test_offset_cached_shrinks_with_the_deepest_cached_block() -> None:
    """offset=cached: max_offset is the deepest structural block cached now. The direct
    scenario, alpha = 1: 9 11 10 (evict queue), then structural 8 (offset 3 of 3: s 0); now
    the deepest is 7 (offset 2 of 2: s 0 < agentic 0.159), then 6 (1 of 1), then 5 alone
    (offset 0, scale 1: s 1) comes last; agentic 13 12, chat 4..0 (0.5), chat 15 14 (0.756)
    between. A block that leaves the queue by a hit (8 joins chat) no longer counts."""
    pol = UniCache(update_every=10**9, offset="cached", **GIVEN)
    d = _stored(pol)
    now = pol.now()
    assert [pol.local_priority(e, STRUCT, now) for e in (8, 7, 6, 5)] == pytest.approx(
        [0.0, 1 / 3, 2 / 3, 1.0]
    )
    assert d.evict(20) == [9, 11, 10, 8, 7, 6, 13, 12, 4, 3, 2, 1, 0, 15, 14, 5]
    pol = UniCache(update_every=10**9, offset="cached", **GIVEN)
    d = _stored(pol)
    d.hit(5, 8)
    assert queues_of(pol, [8]) == [C]
    assert pol.local_priority(7, STRUCT, pol.now()) == 0.0  # 7 is the deepest left (2 of 2)
    assert pol.max_offset == 3  # the global reading keeps 3


def test_offset_cached_counts_blocks_deeper_than_the_state() -> None:
    """A driver may place blocks deeper than the state's width (a runner cannot: a request
    holds all its blocks): the per-depth counts grow. Two structural blocks at offsets 10
    and 150 of a 400-token prompt: the deeper goes first (s = 0), then the other (the
    deepest cached is now 10: s = 0 again)."""
    pol = UniCache(offset="cached")
    d = Drive(pol, [row(0.0, "programming", n_in=400)], num_entries=4)
    d.store(0, [0, 1], depths=[10, 150])
    assert pol.local_priority(1, STRUCT, 0.0) == 0.0
    assert d.evict(1) == [1]
    assert pol.local_priority(0, STRUCT, 0.0) == 0.0
    assert d.evict(2) == [0]


def test_stage2_off_splits_victims_in_proportion() -> None:
    """stage2=false: the evict queue still goes first (entry 6, no credit used); then each
    call adds held_q / total to each non-empty queue's credit and the largest credit (ties to
    the first queue) evicts its own head and pays 1:

        evictable (C, A, S)  credits after adding           pick  victim
        2, 1, 3  (6)         1/3,  1/6,  1/2                  S    5 (offset 2)
        2, 1, 2  (5)         11/15, 11/30, -1/10              C    1 (tail released first)
        1, 1, 2  (4)         -1/60, 37/60, 2/5                A    2
        1, 0, 2  (3)         19/60, (A empty), 16/15          S    4
        1, 0, 1  (2)         49/60, 17/30                     C    0
        0, 0, 1  (1)         47/30                            S    3

    With stage 2 the same blocks go 6, 5 (s 0), 2 (agentic idle 9 s: s = 0.361), 4 (0.5),
    1 0 (chat idle 10 s: 0.971), 3 (1).
    """
    rows = [
        row(0, "chat", "a"),
        row(1, "agentic", "b"),
        row(2, "programming", n_in=6),
        row(3, "untemplated"),
        row(10, "chat", "a", turn=1),
    ]

    def run(stage2: bool, chunk: int) -> list[int]:
        d = Drive(UniCache(stage2=stage2, fit="given"), rows)
        d.store(0, [0, 1])
        d.store(1, [2])
        d.store(2, [5, 4, 3], depths=[2, 1, 0])
        d.store(3, [6])
        d.at(4)
        out: list[int] = []
        while victims := d.evict(chunk):
            out += victims
        return out

    assert run(False, 7) == [6, 5, 1, 2, 4, 0, 3]
    assert run(False, 1) == [6, 5, 1, 2, 4, 0, 3]  # the credits persist across calls
    assert run(True, 7) == [6, 5, 2, 4, 1, 0, 3]


# ----------------------------------------------------------------------------- Algorithm 2
def test_update_weights_clip_ehat_one_step() -> None:
    """alg2=clip-ehat (E^ clipped before the EMA). T = 0.2, beta = 0.9, eps = 1e-3; hits (2, 1, 0) on (4, 4, 4) held blocks.

    E = hits / 4.001 = (0.49988, 0.24994, 0); mean 0.24994; E / mean = (2, 1, 0);
    E^ = (E / mean + eps) ^ 5 = (2.001^5, 1.001^5, 0.001^5) = (32.080, 1.005010, 1e-15);
    mu = 11.028, sigma = 14.89: bounds [max(0.001, mu - 2 sigma < 0), min(10, 40.8)] =
    [0.001, 10] -> (10, 1.005010, 0.001);
    alpha = 0.9 * 1 + 0.1 * E^ = (1.9, 1.000501, 0.9001).
    """
    alpha = np.ones(3)
    new = update_weights(
        alpha, np.array([2.0, 1.0, 0.0]), np.full(3, 4.0), 0.2, 0.9, 1e-3, "clip-ehat"
    )
    assert new.tolist() == pytest.approx([1.9, 0.9 + 0.1 * 1.001**5, 0.9001], rel=1e-12)
    assert alpha.tolist() == [1.0, 1.0, 1.0]  # the input is not changed


def test_update_weights_clip_ehat_two_sigma_clipping() -> None:
    """alg2=clip-ehat. Three queues can never reach 2 sigma (|z| <= sqrt(2)); six can (|z| <= sqrt(5)).
    T = 1, beta = 0.5, eps = 0, one block held each.

    Upper: hits (6, 0, 0, 0, 0, 0): E^ = E / mean = (6, 0, ...); mu = 1, sigma = sqrt(5);
    6 is clipped to 1 + 2 sqrt(5) = 5.472 (< 10), the zeros to the floor 0.001:
    alpha = (0.5 + 0.5 (1 + 2 sqrt 5), 0.5005 x 5) = (1 + sqrt 5, 0.5005, ...).

    Lower: hits (0, 6, 6, 6, 6, 6): mean 5, E^ = (0, 1.2 x 5); mu = 1, sigma = sqrt(0.2);
    0 is clipped up to 1 - 2 sqrt(0.2) = 0.106 (above the floor): alpha =
    (1 - sqrt 0.2, 1.1 x 5).

    Cap: three queues, T = 0.2, hits (1, 0, 0): E^ = (3^5 = 243, 0, 0), bounds [0.001, 10]:
    alpha (beta 0.9) = (0.9 + 1, 0.9001, 0.9001).
    """
    ones = np.ones(6)
    up = update_weights(ones, np.array([6.0, 0, 0, 0, 0, 0]), ones, 1.0, 0.5, 0.0, "clip-ehat")
    assert up.tolist() == pytest.approx([1 + math.sqrt(5)] + [0.5005] * 5, rel=1e-12)
    low = update_weights(ones, np.array([0.0, 6, 6, 6, 6, 6]), ones, 1.0, 0.5, 0.0, "clip-ehat")
    assert low.tolist() == pytest.approx([1 - math.sqrt(0.2)] + [1.1] * 5, rel=1e-12)
    cap = update_weights(np.ones(3), np.array([1.0, 0, 0]), np.ones(3), 0.2, 0.9, 0.0, "clip-ehat")
    assert cap.tolist() == pytest.approx([1.9, 0.9001, 0.9001], rel=1e-12)


def test_update_weights_empty_queues_and_no_hits() -> None:
    """Queue 1 holds nothing: it keeps alpha 2.0 (its 5 hits are ignored). The others:
    E = (2/4, 0/4), mean 0.25, E^ (T = 1, eps = 0) = (2, 0); mu 1, sigma 1 -> bounds
    [0.001, 3]: (2, 0.001); beta 0.5: (0.25 + 1, 0.5 + 0.0005)."""
    alpha = np.array([0.5, 2.0, 1.0])
    new = update_weights(
        alpha, np.array([2.0, 5.0, 0.0]), np.array([4.0, 0.0, 4.0]), 1.0, 0.5, 0.0, "clip-ehat"
    )
    assert new.tolist() == pytest.approx([1.25, 2.0, 0.5005], rel=1e-12)
    # no hits anywhere, or nothing held: unchanged (a copy)
    for hits, held in (([0.0, 0.0, 0.0], [4.0, 1.0, 2.0]), ([3.0, 1.0, 0.0], [0.0, 0.0, 0.0])):
        same = update_weights(alpha, np.array(hits), np.array(held), 0.2, 0.9, 1e-3)
        assert same.tolist() == alpha.tolist() and same is not alpha
        for order in ("paper", "clip-ehat"):
            same = update_weights(alpha, np.array(hits), np.array(held), 0.2, 0.9, 1e-3, order)
            assert same.tolist() == alpha.tolist() and same is not alpha


def test_update_weights_paper_order_one_step() -> None:
    """Algorithm 2 as printed, T = 0.2, beta = 0.9, eps = 1e-3; hits (2, 1, 0) on shares
    (0.25, 0.25, 0.25) of the capacity.

    E = hits / 0.251 = (7.968, 3.984, 0); E_bar = mean + eps = 3.98506;
    E^ = (E / E_bar)^5 = (1.99950^5, 0.99975^5, 0) = (31.960, 0.998745, 0);
    mu = 10.986, sigma = 14.832 -> [L, U] = [0.001, 10];
    raw = 0.9 + 0.1 E^ = (4.0960, 0.99987, 0.9) -> clamp: (4.0960, 0.99987, 0.9).
    """
    e = np.array([2.0, 1.0, 0.0]) / 0.251
    e_hat = (e / (e.mean() + 1e-3)) ** 5
    want = 0.9 + 0.1 * e_hat
    assert want[0] == pytest.approx(4.0960, abs=1e-3) and want[2] == 0.9
    new = update_weights(np.ones(3), np.array([2.0, 1.0, 0.0]), np.full(3, 0.25), 0.2, 0.9, 1e-3)
    assert new.tolist() == pytest.approx(want.tolist(), rel=1e-12)


def test_update_weights_paper_order_clamps_the_weight() -> None:
    """The clamp binds on alpha, after the EMA (lines 21-22). T = 1, beta = 0.5, eps = 0.

    From alpha (9, 1, 1), hits (1, 1, 1) on equal shares: E^ = (1, 1, 1), sigma = 0, so
    [L, U] = [1, 1] and every weight becomes 1 (raw (5, 1, 1) clamped) -- the clip-ehat
    order would keep (5, 1, 1).
    From alpha (1, 1, 1), hits (3, 0, 0): E^ = (3, 0, 0), mu = 1, sigma = sqrt 2:
    [L, U] = [0.001, 1 + 2 sqrt 2 = 3.828]; raw = (2, 0.5, 0.5), inside: unchanged.
    From alpha (8, 1, 1), the same hits: raw = (5.5, 0.5, 0.5) -> 5.5 clamped to 3.828.
    """
    ones = np.ones(3)
    eq = update_weights(np.array([9.0, 1, 1]), np.ones(3), ones, 1.0, 0.5, 0.0)
    assert eq.tolist() == [1.0, 1.0, 1.0]
    old = update_weights(np.array([9.0, 1, 1]), np.ones(3), ones, 1.0, 0.5, 0.0, "clip-ehat")
    assert old.tolist() == [5.0, 1.0, 1.0]
    inside = update_weights(ones, np.array([3.0, 0, 0]), ones, 1.0, 0.5, 0.0)
    assert inside.tolist() == pytest.approx([2.0, 0.5, 0.5], rel=1e-12)
    top = update_weights(np.array([8.0, 1, 1]), np.array([3.0, 0, 0]), ones, 1.0, 0.5, 0.0)
    assert top.tolist() == pytest.approx([1 + 2 * math.sqrt(2), 0.5, 0.5], rel=1e-12)


def _weights_trace(n: int) -> Trace:
    """r0 chat a, r1 agentic b, r2 programming, r3 chat a again (hits r0's 2 blocks); then
    untemplated requests that share nothing."""
    reqs = [
        tok(0, "chat", "a", [1, 2, 3, 4]),
        tok(1, "agentic", "b", [11, 12, 13, 14]),
        tok(2, "programming", None, [21, 22, 23, 24]),
        tok(3, "chat", "a", [1, 2, 3, 4, 5, 6, 7, 8], turn=1),
    ]
    reqs += [tok(r, "untemplated", None, [100 * r + 1, 100 * r + 2]) for r in range(4, n)]
    return Trace.from_requests(reqs)


@pytest.mark.parametrize(
    ("update_every", "ats"), [(10, [9, 19]), (7, [6, 13, 20]), (1, list(range(25)))]
)
def test_weights_update_every_n_requests(update_every: int, ats: list[int]) -> None:
    """25 requests, each with a hook: an update when each update_every-th request is seen."""
    pol = UniCache(update_every=update_every)
    replay(_weights_trace(25), pol, ReplayConfig(capacity_blocks=64, block_tokens=BT))
    assert [at for at, _ in pol.weight_history] == ats


def test_first_window_rewards_the_only_queue_with_hits() -> None:
    """update_every=10: the update at request 9 sees r3's 2 hits on chat blocks only, while
    chat, agentic and structural all hold blocks. Paper order: E = (2 / (C + eps), 0, 0),
    E^ = (E / (E / 3 + eps))^5 ~ 3^5 = 243, 0, 0; mu ~ 81, sigma ~ 114.6 -> [0.001, 10];
    raw = (0.9 + 24.3, 0.9, 0.9) -> alpha = (10, 0.9, 0.9). clip-ehat: E / mean = (3, 0, 0);
    E^ = (3.001^5, 1e-15, 1e-15) -> clipped (10, 0.001, 0.001); alpha = (1.9, 0.9001,
    0.9001). The second window (requests 9-18) has no hit at all: unchanged."""
    for alg2, want in (("paper", [10.0, 0.9, 0.9]), ("clip-ehat", [1.9, 0.9001, 0.9001])):
        pol = UniCache(update_every=10, alg2=alg2)
        replay(_weights_trace(25), pol, ReplayConfig(capacity_blocks=64, block_tokens=BT))
        (at1, w1), (at2, w2) = pol.weight_history
        assert (at1, at2) == (9, 19)
        assert w1 == pytest.approx(want, rel=1e-12)
        assert w2 == w1
        assert pol.alpha.tolist() == pytest.approx([1.0, *want], rel=1e-12)


def test_cumulative_hits_keep_counting_across_updates() -> None:
    """hits=cumulative (Algorithm 2's "cumulative hit-token counts"): the second update sees
    r3's 2 chat hits again: raw = (0.9 x 10 + 24.3, 0.9 x 0.9, 0.9 x 0.9) -> (10, 0.81,
    0.81) after the clamp; with hits=window it had nothing to learn from."""
    pol = UniCache(update_every=10, hits="cumulative")
    replay(_weights_trace(25), pol, ReplayConfig(capacity_blocks=64, block_tokens=BT))
    (_, w1), (_, w2) = pol.weight_history
    assert w1 == pytest.approx([10.0, 0.9, 0.9], rel=1e-12)
    assert w2 == pytest.approx([10.0, 0.81, 0.81], rel=1e-12)
    assert pol.hits[CHAT] == 2.0


# ----------------------------------------------------------------------------- online gap fit
def _gap_trace() -> Trace:
    """Chat a at t = 0, 10, 30, 70 (gaps 10, 20, 40); chat b at 5, 6 (gap 1); agentic c at
    2, 4 (gap 2); one programming request. r6 (chat a) reuses r0's prompt: a hit and an
    insert, and its gap must still count once."""
    return Trace.from_requests(
        [
            tok(0, "chat", "a", [1, 2, 3, 4]),
            tok(2, "agentic", "c", [11, 12]),
            tok(3, "programming", None, [21, 22]),
            tok(4, "agentic", "c", [31, 32], turn=1),
            tok(5, "chat", "b", [41, 42]),
            tok(6, "chat", "b", [51, 52], turn=1),
            tok(10, "chat", "a", [1, 2, 3, 4, 5, 6], turn=1),
            tok(30, "chat", "a", [61, 62], turn=2),
            tok(70, "chat", "a", [71, 72], turn=3),
        ]
    )


def test_online_gap_fit_is_the_mle_after_min_gaps() -> None:
    """Chat gaps arrive at r5 (1), r6 (10), r7 (20), r8 (40): with min_gaps = 4 the chat model
    is the preset up to r7 and the MLE of the four log gaps from r8 on (mean, and the
    population standard deviation). The agentic queue has one gap (r3): still its preset."""
    pol = UniCache(min_gaps=4)
    chat: list[tuple[float, float]] = []
    agentic: list[tuple[float, float]] = []

    def snap(r: int) -> None:
        chat.append(pol.gap_params(CHAT))
        agentic.append(pol.gap_params(AGENTIC))

    replay(_gap_trace(), pol, ReplayConfig(capacity_blocks=64, block_tokens=BT), on_step=snap)
    logs = [math.log(g) for g in (1.0, 10.0, 20.0, 40.0)]
    # mu = (0 + 2.3026 + 2.9957 + 3.6889) / 4 = 2.2468;
    # sigma^2 = (2.2468^2 + 0.0558^2 + 0.7489^2 + 1.4421^2) / 4 = 1.9229: sigma = 1.3867
    mle = (statistics.fmean(logs), statistics.pstdev(logs))
    assert chat[:8] == [GAP_PRESETS["chat"]] * 8
    assert chat[8] == pytest.approx(mle, rel=1e-12)
    assert mle == pytest.approx((2.2468, 1.3867), abs=1e-4)
    assert agentic == [GAP_PRESETS["agentic"]] * 9


def test_gap_fit_floor_given_and_custom_presets() -> None:
    # One agentic gap (2 s) with min_gaps = 1: mu = ln 2, a zero variance floored at 1e-6.
    pol = UniCache(min_gaps=1)
    replay(_gap_trace(), pol, ReplayConfig(capacity_blocks=64, block_tokens=BT))
    assert pol.gap_params(AGENTIC) == pytest.approx((math.log(2.0), 1e-6), rel=1e-12)
    # fit=given never fits; the given values are what it returns
    given = UniCache(
        fit="given", min_gaps=1, chat_mu=3.0, chat_sigma=0.5, agentic_mu=-1.0, agentic_sigma=2.0
    )
    replay(_gap_trace(), given, ReplayConfig(capacity_blocks=64, block_tokens=BT))
    assert given.gap_params(CHAT) == (3.0, 0.5) and given.gap_params(AGENTIC) == (-1.0, 2.0)


# ----------------------------------------------------------------------------- unicache-opt
def test_unicache_opt_sets_needed_blocks_aside() -> None:
    """The direct scenario (alpha = 1 order 9 11 10 8 13 12 7 4 3 2 1 0 6 15 14 5), with
    waiting requests needing keys of 9 and 7 (position 0) and of 13 and 4 (position 1).
    Unneeded blocks keep UniCache's order: 11 10 8 12 3 2 1 0 6 15 14 5; then the needed
    ones, farthest position first, deepest first: 4 (pos 1, offset 4), 13 (pos 1, offset
    1), 9 (pos 0, offset 4), 7 (pos 0, offset 2). In three calls the set-aside blocks go
    back and are set aside again: the same order."""
    want = [11, 10, 8, 12, 3, 2, 1, 0, 6, 15, 14, 5, 4, 13, 9, 7]
    for chunks in ((16,), (3, 4, 20)):
        pol = UniCacheOPT(update_every=10**9, **GIVEN)
        d = _stored(pol)
        pol.on_waiting([ids(109, 107), ids(113, 104, 109)])
        got: list[int] = []
        for n in chunks:
            got += d.evict(n)
        assert got == want, chunks
        assert d.evict(1) == [] and pol.held.tolist() == [0.0] * 4
    # an empty waiting queue: plain UniCache order
    pol = UniCacheOPT(update_every=10**9, **GIVEN)
    d = _stored(pol)
    pol.on_waiting([])
    assert d.evict(16) == [9, 11, 10, 8, 13, 12, 7, 4, 3, 2, 1, 0, 6, 15, 14, 5]


def test_unicache_opt_stage2_off_keeps_needed_blocks_last() -> None:
    """Chat block 0 (needed by the waiting request) and structural blocks 1-4 (offsets 0-3,
    unneeded). The credits pick the chat queue on the third call (1/5 + 1/4 + 1/3 = 0.78 vs
    4/5 - 1 + 3/4 - 1 + 2/3 = 0.22); its only block is set aside. The unneeded structural
    blocks must all go before it: 4 3 2 1, then 0."""
    rows = [row(0, "chat", "a"), row(1, "programming", n_in=8)]
    pol = UniCacheOPT(stage2=False)
    d = Drive(pol, rows, clock="view")
    d.store(0, [0])
    d.store(1, [1, 2, 3, 4])
    pol.on_waiting([ids(100)])
    assert d.evict(5) == [4, 3, 2, 1, 0]


def test_waiting_positions() -> None:
    check_waiting_positions(UniCacheOPT)


# ----------------------------------------------------------------------------- reference models
class RefUniCache:
    """A naive UniCache (stage 2, given gap models, fixed weights): scans every evictable
    entry at each choice."""

    MAP = {
        "chat": CHAT,
        "agentic": AGENTIC,
        "programming": STRUCT,
        "tool-use": STRUCT,
        "untemplated": EVICT,
    }

    def __init__(
        self, trace: Trace, view: EntryView, alpha: list[float], offset: str = "global"
    ) -> None:
        self.view = view
        self.offset = offset
        self.alpha = [1.0, *alpha]
        self.models = {CHAT: GAP_PRESETS["chat"], AGENTIC: GAP_PRESETS["agentic"]}
        self.base = [
            self.MAP.get(t, CHAT if s is not None else STRUCT)
            if t is not None
            else (CHAT if s is not None else STRUCT)
            for t, s in zip(trace.task, trace.session_id, strict=True)
        ]
        self.inputs = trace.input_length.tolist()
        self.arrival = trace.arrival_s.tolist()
        self.queue: dict[int, int] = {}
        self.t_last: dict[int, float] = {}
        self.order: dict[int, int] = {}  # evictable entries -> when they became evictable
        self.counter = 0
        self.max_offset = 1

    def now(self) -> float:
        return float(self.arrival[self.view.request_index])

    def assign(self, entries: I64, touch: bool) -> None:
        r = self.view.request_index
        for e in entries.tolist():
            q = self.base[r]
            end = (int(self.view.depth[e]) + 1) * int(self.view.size[e])
            if q in (EVICT, STRUCT) and end > self.inputs[r]:
                q = EVICT
            self.queue[e] = q
            if q == STRUCT:
                self.max_offset = max(self.max_offset, int(self.view.depth[e]))
            self.t_last[e] = max(self.t_last[e], self.now()) if touch else self.now()

    def on_evictable(self, entries: I64) -> None:
        for e in entries.tolist():
            self.order[e] = self.counter
            self.counter += 1

    def on_pinned(self, entries: I64) -> None:
        for e in entries.tolist():
            del self.order[e]

    def s(self, e: int) -> float:
        q = self.queue[e]
        if q == STRUCT:
            scale = self.max_offset
            if self.offset == "cached":  # the deepest structural block cached now
                scale = max(
                    [int(self.view.depth[x]) for x, qx in self.queue.items() if qx == STRUCT] + [1]
                )
            return 1.0 - float(self.view.depth[e]) / scale
        mu, sigma = self.models[q]
        gap = self.now() - self.t_last[e]
        cdf = 0.0 if gap <= 0 else 0.5 * (1 + math.erf((math.log(gap) - mu) / (sigma * 2**0.5)))
        return 1.0 - cdf

    def evict(self, n: int) -> list[int]:
        out = []
        for _ in range(min(n, len(self.order))):
            free = list(self.order)
            first = [e for e in free if self.queue[e] == EVICT]
            if first:
                e = min(first, key=lambda e: (-int(self.view.depth[e]), self.order[e]))
            else:
                heads = []
                for q in (CHAT, AGENTIC, STRUCT):
                    members = [e for e in free if self.queue[e] == q]
                    if not members:
                        continue
                    rank = (
                        (lambda e: self.t_last[e])
                        if q != STRUCT
                        else (lambda e: -int(self.view.depth[e]))
                    )
                    h = min(members, key=lambda e: (rank(e), self.order[e]))
                    heads.append((self.alpha[q] * self.s(h), q, h))
                e = min(heads)[2]
            del self.order[e]
            del self.queue[e]
            out.append(e)
        return out

    def on_remove(self, entries: I64) -> None:
        for e in entries.tolist():
            self.queue.pop(e, None)
            self.order.pop(e, None)


class TwinUniCache(Twin, UniCache):
    """UniCache that replays every hook into the reference and compares the victims."""

    def __init__(self, alpha: list[float], offset: str = "global") -> None:
        super().__init__(update_every=10**9, fit="given", offset=offset)
        self._alpha0 = alpha
        self.num_victims = 0

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.alpha[1:] = self._alpha0

    def prepare_trace(self, trace: Any, clock: str) -> None:
        super().prepare_trace(trace, clock)
        self.ref = RefUniCache(trace, self.view, self._alpha0, self.offset)

    def on_insert(self, entries: I64) -> None:
        super().on_insert(entries)
        self.ref.assign(entries, touch=False)

    def on_access(self, entries: I64) -> None:
        super().on_access(entries)
        self.ref.assign(entries, touch=True)

    def on_evictable(self, entries: I64) -> None:
        super().on_evictable(entries)
        self.ref.on_evictable(entries)

    def on_pinned(self, entries: I64) -> None:
        super().on_pinned(entries)
        self.ref.on_pinned(entries)

    def on_remove(self, entries: I64) -> None:
        super().on_remove(entries)
        self.ref.on_remove(entries)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=small_traces(),
    slack=st.integers(0, 6),
    window=st.integers(1, 2),
    alpha=st.lists(st.sampled_from([0.25, 1.0, 3.0]), min_size=3, max_size=3),
    offset=st.sampled_from(["global", "cached"]),
)
def test_unicache_matches_a_naive_reference(
    trace: Trace, slack: int, window: int, alpha: list[float], offset: str
) -> None:
    held = int(trace.block_layout(BT).num_blocks_held.max())
    pol = TwinUniCache(alpha, offset)
    drive_window(trace, pol, held + slack, window, 0)


def test_the_twin_does_evict() -> None:
    """The property test compares something: on a fixed trace the twin evicts."""
    uni = TwinUniCache([1.0, 2.0, 0.5])
    drive_window(scenario_trace()[0], uni, 8, 2, 0)
    assert uni.num_victims > 5


# ----------------------------------------------------------------------------- engine runner
@pytest.fixture(scope="module")
def mix() -> Trace:
    return mix_trace()


class GuardedUniCacheOPT(Guard, UniCacheOPT):
    pass


def test_unicache_opt_runs_checked_and_deterministic_under_the_engine(mix: Trace) -> None:
    check_engine_only_run(mix, GuardedUniCacheOPT(), "unicache-opt")


def test_replay_refuses_unicache_opt() -> None:
    check_replay_refuses("unicache-opt")


def test_unicache_opt_clone_and_pickle() -> None:
    check_clone_and_pickle("unicache-opt:offset=request")


# ----------------------------------------------------------------------------- determinism
@pytest.mark.parametrize(
    "spec",
    ["unicache", "unicache:stage2=false,offset=request", "wa-atc25", "wa"],
)
def test_replay_determinism_on_the_mix(mix: Trace, spec: str) -> None:
    cfg = ReplayConfig(capacity_blocks=230, block_tokens=64)
    a_pol, b_pol = make_policy(spec), make_policy(spec)
    a = replay(mix, a_pol, cfg, check_every=10)
    b = replay(mix, b_pol, cfg)
    assert np.array_equal(a.hit_tokens, b.hit_tokens)
    assert a.metrics == b.metrics
    assert a.metrics["num_evictions"] > 1000
    if isinstance(a_pol, UniCache) and isinstance(b_pol, UniCache):
        assert a_pol.weight_history == b_pol.weight_history and len(a_pol.weight_history) == 30
    if isinstance(a_pol, WorkloadAware) and isinstance(b_pol, WorkloadAware):
        assert np.array_equal(a_pol.p, b_pol.p) and np.array_equal(a_pol.rate, b_pol.rate)


def test_unicache_and_wa_run_under_the_engine(mix: Trace) -> None:
    """The view clock: both run checked and give the same results twice."""
    for spec in ("unicache", "wa", "wa-atc25"):
        a = simulate(mix, spec, ENGINE, TIMING, check_every=200)
        same(a, simulate(mix, spec, ENGINE, TIMING))
        assert a.metrics["token_hit_ratio"] > 0
