"""LPC's eviction policy (issue 7): the decay formula, max-pooling, victims, and the win."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from prefixlab.errors import ConfigError
from prefixlab.policies.base import make_policy
from prefixlab.policies.hooks.lpc import decayed
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Request, Trace


def test_decay_formula_exact() -> None:
    # p = 0.8, idle 100 s, scale 1e-2: d = e^-1; p_cur = 0.8 e^-1 / (0.8 e^-1 + 0.2)
    d = math.exp(-1.0)
    assert float(decayed(0.8, 100.0, 1e-2)) == pytest.approx(0.8 * d / (0.8 * d + 0.2), rel=1e-15)
    assert float(decayed(0.8, 0.0, 1e-2)) == pytest.approx(0.8)  # no idle time, no decay
    assert float(decayed(1.0, 1e6, 1e-2)) == 1.0  # certainty never decays
    assert float(decayed(0.0, 5.0, 1e-2)) == 0.0
    # odds shrink by exactly d
    p, q = 0.3, float(decayed(0.3, 50.0, 2e-2))
    assert (q / (1 - q)) / (p / (1 - p)) == pytest.approx(math.exp(-1.0), rel=1e-12)
    # arrays, elementwise
    out = decayed(np.array([0.5, 0.9]), np.array([0.0, 100.0]), 1e-2)
    assert out.tolist() == pytest.approx([0.5, 0.9 * d / (0.9 * d + 0.1)])


def _trace(rows: list[tuple[float, str, list[int]]]) -> Trace:
    """(arrival, session, input token ids); one output token each, no ids."""
    reqs = [
        Request(
            arrival_s=a, input_length=len(toks), output_length=1, session_id=s, input_tokens=toks
        )
        for a, s, toks in rows
    ]
    return Trace.from_requests(reqs)


def test_max_pooling_across_conversations_latest_within_one() -> None:
    """Sec. 3.4-3.5: a block shared by conversations ranks by the largest of their latest
    decayed predictions; one conversation's latest prediction replaces its earlier one."""
    rows = [
        (0.0, "a", [1, 2, 3, 4, 5, 6]),
        (10.0, "b", [1, 2, 3, 4, 9]),
        (20.0, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ]
    cfg = ReplayConfig(capacity_blocks=64, block_tokens=2, min_recompute_tokens=0)
    # oracle labels: a's first request continues (p=1), b's only one does not (p=0), a's
    # second is its last (p=0)
    pol = make_policy("lpc-oracle", "block")
    seen: list[list[tuple[float, float, list[int]]]] = []

    def after(r: int) -> None:
        if r == 1:
            hit = [e for e in range(pol.p.shape[0]) if pol.view.hits[e] >= 1]
            seen.append([(pol.p[e], pol.t[e], sorted(pol.shared.get(e, {}))) for e in hit])

    res = replay(_trace(rows), pol, cfg, on_step=after)
    # after b: [1,2] and [3,4], stored by a (1 at t=0), reused by b (0 at t=10): a's stands
    assert seen[0][:2] == [(1.0, 0.0, [0, 1]), (1.0, 0.0, [0, 1])]
    assert res.metrics["num_hit_tokens"] == 4 + 6
    # a came back with 0 at t=20: both conversations now predict 0; the latest one ranks
    shared = [e for e in range(pol.p.shape[0]) if pol.view.hits[e] >= 2]
    assert len(shared) == 2 and all((pol.p[e], pol.t[e]) == (0.0, 20.0) for e in shared)
    # a's own block [5,6] (only a uses it): its latest prediction (0) replaced the first (1)
    own = [e for e in range(pol.p.shape[0]) if pol.owner[e] == 0 and pol.view.hits[e] == 1]
    assert own and all((pol.p[e], pol.t[e]) == (0.0, 20.0) for e in own)


def test_shared_block_keeps_the_largest_decayed_prediction() -> None:
    """Two conversations with moderate predictions: the one whose decayed probability is
    larger now stays larger later (odds shrink alike), so it is the block's."""
    pol = make_policy("lpc-oracle:scale=0.01", "block")
    # a p=0.9 at t=0 (odds 9); b p=0.6 at t=100 (odds 1.5): decayed to t=100, a's odds are
    # 9 e^-1 = 3.31 > 1.5, so a's (0.9, 0) stands; c p=0.8 at t=300 (odds 4): a's odds at
    # 300 are 9 e^-3 = 0.45 < 4, so c's (0.8, 300) takes over
    from prefixlab.policies.hooks.lpc import _rank

    assert _rank(0.9, 0.0, 0.01) > _rank(0.6, 100.0, 0.01)
    assert _rank(0.8, 300.0, 0.01) > _rank(0.9, 0.0, 0.01)
    assert float(decayed(0.9, 100.0, 0.01)) > 0.6
    assert float(decayed(0.9, 300.0, 0.01)) < 0.8
    assert pol.scale == 0.01


def test_lpc_radix_split_does_not_credit_the_unused_lower_part() -> None:
    # y stores [1,1,2,2,3,3] and ends (p = 0); x (continues, p = 1) shares only [1,1]
    trace = _trace(
        [(0.0, "y", [1, 1, 2, 2, 3, 3]), (50.0, "x", [1, 1, 9, 9]), (60.0, "x", [1, 1, 9, 9, 7, 7])]
    )
    pol = make_policy("lpc-oracle", "radix")
    # the generic path: the test reads the tree's node sizes from its view
    replay(
        trace,
        pol,
        ReplayConfig(capacity_blocks=64, structure="radix", block_tokens=2, min_recompute_tokens=0),
        fast=False,
    )
    v = pol.view
    # the node holding y's remainder [2,2,3,3] (2 pages of 2 tokens) under the split point
    (lower,) = [e for e in range(v.num_entries) if v.key[e] >= 0 and v.size[e] == 4]
    assert pol.p[lower] == 0.0  # only y (which ends) ever used it; bug: 1.0 (x's p)
    assert pol.t[lower] == 0.0  # last used at t = 0; bug: 50.0 (x's arrival)


def test_hand_computed_victims() -> None:
    """Two finished one-block conversations: x (continues, p=1) and y (ends, p=0). A third
    request needs room: y's block goes, whatever the recency."""
    trace = _trace(
        [(0.0, "x", [1, 1]), (5.0, "y", [2, 2]), (6.0, "z", [3, 3]), (7.0, "x", [1, 1, 4, 4])]
    )
    # capacity 3 blocks of 2 tokens; each request holds ceil((2+1)/2) = 2 blocks while it runs
    res_oracle = replay(
        trace, "lpc-oracle", ReplayConfig(capacity_blocks=3, block_tokens=2, min_recompute_tokens=0)
    )
    res_lru = replay(
        trace, "lru", ReplayConfig(capacity_blocks=3, block_tokens=2, min_recompute_tokens=0)
    )
    # oracle keeps x's [1,1] (x continues) and the last request hits it; LRU evicted it first
    assert res_oracle.hit_tokens.tolist() == [0, 0, 0, 2]
    assert res_lru.hit_tokens.tolist() == [0, 0, 0, 0]


def test_lpc_needs_a_model_and_text(tmp_path: Path) -> None:
    trace = GENERATORS["lpc"].fn(num_conversations=20)
    cfg = ReplayConfig(capacity_blocks=500, block_tokens=16, model="qwen3-32b")
    with pytest.raises(ConfigError, match="needs model=PATH"):
        replay(trace, "lpc", cfg)
    with pytest.raises(ConfigError, match="no LPC model here"):
        replay(trace, f"lpc:model={tmp_path / 'none'}", cfg)
    # the predictor's memory is deducted from the cache: that needs the served model
    with pytest.raises(ConfigError, match="give the model"):
        replay(trace, "lpc:model=x", ReplayConfig(capacity_blocks=500, block_tokens=16))


def test_predictor_memory_is_deducted_from_the_cache() -> None:
    """1 GiB on Qwen3-32B (256 KiB of KV per token) is 4,096 tokens: 256 blocks of 16."""
    from prefixlab.model import get_model
    from prefixlab.runner.replay import reserved_blocks

    assert get_model("qwen3-32b").kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert reserved_blocks(make_policy("lpc:model=x"), "qwen3-32b", 16) == 256
    assert reserved_blocks(make_policy("lpc-oracle"), None, 16) == 0  # the oracle: none
    assert reserved_blocks(make_policy("lpc-oracle:predictor_bytes=1"), "qwen3-32b", 16) == 1
    trace = GENERATORS["lpc"].fn(num_conversations=300, seed=2)
    full = replay(trace, "lpc-oracle", ReplayConfig(600, block_tokens=16))
    less = replay(
        trace,
        f"lpc-oracle:predictor_bytes={2**30}",
        ReplayConfig(600, block_tokens=16, model="qwen3-32b"),
    )
    same = replay(trace, "lpc-oracle", ReplayConfig(600 - 256, block_tokens=16))
    assert less.metrics["num_reserved_blocks"] == 256 and less.capacity_blocks == 344
    assert np.array_equal(less.hit_tokens, same.hit_tokens)
    assert less.metrics["num_hit_tokens"] < full.metrics["num_hit_tokens"]
    with pytest.raises(ConfigError, match="whole capacity"):
        replay(
            trace,
            f"lpc-oracle:predictor_bytes={2**30}",
            ReplayConfig(256, block_tokens=16, model="qwen3-32b"),
        )
    with pytest.raises(ConfigError, match="scale must be a finite number"):
        make_policy("lpc-oracle:scale=-1")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("sklearn")
    from prefixlab.learn.predictor import TrainConfig, train

    trace = GENERATORS["lpc"].fn(num_conversations=1500, seed=0)
    pred, _ = train(trace, TrainConfig(epochs=8))
    return str(pred.save(tmp_path_factory.mktemp("lpc") / "model").with_suffix(""))


def test_lpc_beats_lru_and_oracle_bounds_it(model: str) -> None:
    """The LPC workload (lambda_chat 100 s, N_conv 200) on a different seed than training:
    at five cache sizes, lpc > lru and lpc-oracle >= lpc (the predictor's memory left out:
    no model is named here, predictor_bytes=0)."""
    trace = GENERATORS["lpc"].fn(num_conversations=800, seed=7)
    ws = trace.block_layout(16).num_distinct_keys
    for frac in (0.05, 0.1, 0.2, 0.3, 0.4):
        cfg = ReplayConfig(capacity_blocks=int(frac * ws), block_tokens=16)
        hit = {
            p.split(":")[0]: replay(
                trace, p + ",predictor_bytes=0" if p.startswith("lpc:") else p, cfg
            ).metrics["token_hit_ratio"]
            for p in ("lru", f"lpc:model={model}", "lpc-oracle")
        }
        assert hit["lpc"] > hit["lru"], (frac, hit)
        assert hit["lpc-oracle"] >= hit["lpc"], (frac, hit)


def test_lpc_is_deterministic_and_runs_in_the_engine(model: str) -> None:
    from prefixlab.model.timing import make_timing
    from prefixlab.runner.engine import EngineConfig, simulate

    trace = GENERATORS["lpc"].fn(num_conversations=150, seed=3)
    cfg = ReplayConfig(capacity_blocks=800, block_tokens=16, model="llama-3.1-8b")
    a = replay(trace, f"lpc:model={model}", cfg, check_every=5)
    b = replay(trace, f"lpc:model={model}", cfg)
    assert np.array_equal(a.hit_tokens, b.hit_tokens)
    timing = make_timing(["power:preset=llama-3.1-8b-h100", "tpot:s=0.02"])
    eng = simulate(
        trace,
        f"lpc:model={model}",
        EngineConfig(800, block_tokens=16, model="llama-3.1-8b"),
        timing,
        check_every=10,
    )
    assert eng.metrics["token_hit_ratio"] > 0


def shared_prompt_trace(n: int, conversations: int) -> Trace:
    """n requests of ``conversations`` conversations in turn, each a 64-token system prompt
    everyone shares and 32 tokens of its own."""
    rng = np.random.default_rng(4)
    prompt = list(range(1, 65))
    reqs = [
        Request(
            float(i),
            96,
            1,
            session_id=f"c{i % conversations}",
            input_tokens=prompt + rng.integers(100, 10_000, 32).tolist(),
        )
        for i in range(n)
    ]
    return Trace.from_requests(reqs)


def test_records_survive_a_state_widened_from_outside() -> None:
    """The (entry, conversation) -> record table keeps its own size: a state widened by
    someone else mid-run (a streamed replay's new slots, a radix view that grew, here every
    50 requests) finds every record where it put it, so the run equals an unwidened one
    (when the table hashed by the state's width, records went missing and were recreated)."""
    from prefixlab.policies._arrays import SC, grow_state
    from prefixlab.policies.hooks.lpc import NFREE_REC, RTOP

    trace = shared_prompt_trace(300, 60)
    cfg = ReplayConfig(capacity_blocks=40, block_tokens=16)
    runs = []
    for widen in (False, True):
        pol = make_policy("lpc-oracle", "block")

        def step(r: int, pol: object = pol, widen: bool = widen) -> None:
            if widen and r % 50 == 49:
                ist = pol.state[0]  # type: ignore[attr-defined]
                pol.state = grow_state(pol.state, 1, 2 * ist.shape[1])  # type: ignore[attr-defined]

        res = replay(trace, pol, cfg, fast=False, on_step=step)
        ist = pol.state[0]  # type: ignore[attr-defined]
        records = sorted((e, sorted(c)) for e, c in pol.shared.items())  # type: ignore[attr-defined]
        live = int(ist[SC, RTOP] - ist[SC, NFREE_REC])  # a lost record is made again
        runs.append((res.hit_tokens.tolist(), records, live, ist.shape[1]))
    assert runs[0][:3] == runs[1][:3]
    assert runs[1][3] > 4 * runs[0][3]  # it was widened
    assert max(len(c) for _, c in runs[1][1]) >= 20  # shared blocks keep many records
