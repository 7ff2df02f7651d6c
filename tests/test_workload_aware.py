"""WA, the workload-aware policy of the ATC'25 characterisation (``wa-atc25``) and its
per-category LRU variant (``wa``): categories, the profiling fit, the reuse probability,
victims by hand. (Its determinism and engine runs are with UniCache's, in test_unicache.py.)

Blocks hold ``BT = 2`` tokens in directly driven views; every expectation is derived by
hand in the comment next to it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefixlab.policies.hooks.workload_aware import fit_categories
from prefixlab.policies.workload_aware import PerCategoryLRU, WorkloadAware, categories
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import BlockLayout, Trace
from tests.helpers import BT, Drive, row, tok


# ----------------------------------------------------------------------------- WA
def test_wa_categories() -> None:
    rows = [
        row(0, "chat", "a"),
        row(1, "chat", "a", turn=1),
        row(2, "chat", "a", turn=2),
        row(3, "chat", "a", turn=3),
        row(4, "chat", "a", turn=9),
        row(5, None),
        row(6, "programming"),
        row(7, "chat", "b"),
    ]
    trace = Trace.from_requests(rows)
    names, cat = categories(trace, 4)
    # turn + 1 < 4 keeps its own label; turns 3 and 9 (4th and 10th) merge as "4+"
    assert names == ["chat_1", "chat_2", "chat_3", "chat_4+", "(none)_1", "programming_1"]
    assert cat.tolist() == [0, 1, 2, 3, 3, 4, 5, 0]
    names, cat = categories(trace, 1)  # the task alone (the UniCache paper's WA)
    assert names == ["chat", "(none)", "programming"]
    assert cat.tolist() == [0, 0, 0, 0, 0, 1, 2, 0]


def _layout(seqs: list[list[int]]) -> BlockLayout:
    keys = np.array([k for s in seqs for k in s], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    n = np.array([len(s) for s in seqs], dtype=np.int64)
    return BlockLayout(
        block_tokens=BT,
        keys=keys,
        key_offsets=offs,
        num_lookup_blocks=n,
        lookup_end_tokens=n * BT,
        num_blocks_held=n,
        num_distinct_keys=int(keys.max()) + 1,
        raw_keys=keys.astype(np.uint64),
    )


def test_wa_fit_categories_by_hand() -> None:
    """Requests (arrival, category, keys): r0 (0, 0, [0 1]), r1 (10, 1, [0 2]),
    r2 (30, 0, [0 1 3]), r3 (100, 1, [2 4]), r4 (110, 2, [5]).

    Touches: cat 0: 2 + 3 = 5; cat 1: 2 + 2 = 4; cat 2: 1. Next touch of the same key:
    key 0: r0 -> r1 (10 s, cat 0), r1 -> r2 (20 s, cat 1); key 1: r0 -> r2 (30 s, cat 0);
    key 2: r1 -> r3 (90 s, cat 1). Reuses: cat 0: 2 (gaps 40 s), cat 1: 2 (110 s), cat 2: 0.
    p = (2/5, 2/4, 0/1); rate = reuses / gap sum = (2/40, 2/110, pooled 4/150 for cat 2
    which has no reuse). Pooled: p = 4/10, rate = 4/150.
    """
    layout = _layout([[0, 1], [0, 2], [0, 1, 3], [2, 4], [5]])
    arrival = np.array([0.0, 10.0, 30.0, 100.0, 110.0])
    cat = np.array([0, 1, 0, 1, 2], dtype=np.int64)
    p, rate, reuses = fit_categories(layout, arrival, cat, 3, 5, 1)
    assert p.tolist() == pytest.approx([0.4, 0.5, 0.0])
    assert rate.tolist() == pytest.approx([0.05, 2 / 110, 4 / 150])
    assert reuses.tolist() == [2.0, 2.0, 0.0]
    # min_samples = 5: only cat 0 (5 touches) keeps its own fit
    p, rate, _ = fit_categories(layout, arrival, cat, 3, 5, 5)
    assert p.tolist() == pytest.approx([0.4, 0.4, 0.4])
    assert rate.tolist() == pytest.approx([0.05, 4 / 150, 4 / 150])
    # profiling window = the first 3 requests: key 2's reuse (r3) is outside it.
    # cat 0: 5 touches, reuses 10 s + 30 s; cat 1: 2 touches, 1 reuse (20 s); cat 2: none.
    # Pooled: 3 / 7, rate 3 / 60 (cat 2 has no touch: pooled).
    p, rate, reuses = fit_categories(layout, arrival, cat, 3, 3, 1)
    assert p.tolist() == pytest.approx([0.4, 0.5, 3 / 7])
    assert rate.tolist() == pytest.approx([0.05, 0.05, 0.05])
    assert reuses.tolist() == [2.0, 1.0, 0.0]


def test_wa_fit_through_replay() -> None:
    """bt = 2, outputs 0. r0 (t 0, chat turn 0): K0 K1; r1 (t 10, chat turn 1): K0 K1 K2;
    r2 (t 40, programming): K0 K3. Categories chat_1, chat_2, programming_1.
    Touches (2, 3, 2); reuses: K0 r0 -> r1 (10, cat 0), r1 -> r2 (30, cat 1); K1 r0 -> r1
    (10, cat 0). p = (1, 1/3, 0); rate = (2/20, 1/30, pooled 3/50); share = (2/3, 1/3, 0).
    profile = 0.5 -> ceil(1.5) = 2 requests: K0, K1 reused from r0 only: p = (1, 0, pooled
    2/5), rate = (0.1, pooled 2/20, pooled 0.1)."""
    trace = Trace.from_requests(
        [
            tok(0, "chat", "a", [1, 2, 3, 4]),
            tok(10, "chat", "a", [1, 2, 3, 4, 5, 6], turn=1),
            tok(40, "programming", None, [1, 2, 7, 8]),
        ]
    )
    cfg = ReplayConfig(capacity_blocks=16, block_tokens=BT)
    pol = WorkloadAware(profile=1.0, min_samples=1)
    res = replay(trace, pol, cfg)
    assert res.hit_tokens.tolist() == [0, 4, 2]
    assert pol.names == ["chat_1", "chat_2", "programming_1"]
    assert pol.p.tolist() == pytest.approx([1.0, 1 / 3, 0.0])
    assert pol.rate.tolist() == pytest.approx([0.1, 1 / 30, 0.06])
    assert pol.share.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    half = WorkloadAware(profile=0.5, min_samples=1)
    replay(trace, half, cfg)
    assert half.p.tolist() == pytest.approx([1.0, 0.0, 0.4])
    assert half.rate.tolist() == pytest.approx([0.1, 0.1, 0.1])


def test_wa_reuse_probability_formula() -> None:
    pol = WorkloadAware(window_s=10.0)
    pol.p, pol.rate = np.array([0.5, 1.0]), np.array([0.1, 0.0])
    # 0.5 (e^-0.5 - e^-1.5) = 0.5 (0.60653 - 0.22313) = 0.19170
    assert pol.reuse_probability(0, 5.0) == pytest.approx(0.191700, abs=1e-6)
    assert pol.reuse_probability(0, 0.0) == pytest.approx(0.5 * (1 - math.exp(-1.0)))
    assert pol.reuse_probability(1, 3.0) == 0.0  # rate 0: never "within the window"


WA_ROWS = [row(0, "chat", "a"), row(5, "programming", n_in=8), row(20, "chat", "a", turn=1)]


def _wa_stored(mode: str) -> Drive:
    """Category 0 (chat_1): entries 0, 1 at t 0; category 1 (programming_1): 2 3 4 at t 5 and
    5 (offset 3) pinned. Evictions at t 20 (clock = the view's time)."""
    pol = WorkloadAware(window_s=10.0) if mode == "wa" else PerCategoryLRU(max_turn=4)
    d = Drive(pol, WA_ROWS, clock="view")
    assert pol.names == ["chat_1", "programming_1", "chat_2"]
    d.store(0, [0, 1])
    d.store(1, [2, 3, 4])
    d.store(1, [5], depths=[3], release=False)
    d.at(2)
    return d


def test_wa_lowest_probability_first_ties_to_the_deeper_block() -> None:
    """p = (0.5, 0.9), rate = (0.1, 0.01), window 10 s, at t = 20:
    chat head 1 (idle 20): 0.5 (e^-2 - e^-3) = 0.0428; programming head 4 (idle 15):
    0.9 (e^-0.15 - e^-0.25) = 0.0737 -> 1, 0 (same score) first, then 4 3 2 (tail first).
    Rate 0: every head scores P = 0 and the deeper goes first: 4 (offset 2); then 1 and 3
    tie at offset 1: the lower category, 1; then 3 (offset 1 > 0); then 0 and 2 tie at
    offset 0: category 0 first."""
    d = _wa_stored("wa")
    pol = d.policy
    assert isinstance(pol, WorkloadAware)
    pol.p, pol.rate = np.array([0.5, 0.9, 0.0]), np.array([0.1, 0.01, 1.0])
    assert pol.reuse_probability(0, 20.0) == pytest.approx(0.5 * (math.exp(-2) - math.exp(-3)))
    assert d.evict(6) == [1, 0, 4, 3, 2]
    d = _wa_stored("wa")
    pol = d.policy
    assert isinstance(pol, WorkloadAware)
    pol.p, pol.rate = np.array([0.5, 0.5, 0.5]), np.array([0.0, 0.0, 0.0])  # P = 0 for all
    assert d.evict(6) == [4, 1, 3, 0, 2]


def test_wa_per_category_lru_evicts_the_most_over_share() -> None:
    """share = (0.5, 0.5); held counts pinned blocks too (programming holds 4 with 5)::

        held (chat, prog)  over (chat, prog)       victim
        2, 4               -1/6, +1/6              prog LRU head 4 (tail released first)
        2, 3               -0.1, +0.1              3
        2, 2               0, 0: tie -> older head  chat 1 (t 0 < t 5)
        1, 2               -1/6, +1/6              2
        1, 1 (5 pinned)    prog has nothing free    0

    With the fits of the test above, WA's score evicts the same blocks 1 0 4 3 2.
    """
    d = _wa_stored("per-category-lru")
    pol = d.policy
    assert isinstance(pol, WorkloadAware)
    pol.share = np.array([0.5, 0.5, 0.0])
    assert d.evict(6) == [4, 3, 1, 2, 0]
