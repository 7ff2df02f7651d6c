"""Review of today's modules (LPC, hybrid engine adapter, hybrid config): each test shows a
bug found in review, fixed since; each test would fail without its fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prefixlab.errors import ConfigError
from prefixlab.model.spec import get_model
from prefixlab.model.timing import make_timing
from prefixlab.policies.base import make_policy
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import Request, Trace


def _trace(rows: list[tuple[float, str, list[int]]], out: int = 1) -> Trace:
    reqs = [Request(arrival_s=a, input_length=len(t), output_length=out, session_id=s,
                    input_tokens=t) for a, s, t in rows]  # fmt: skip
    return Trace.from_requests(reqs)


# ---------------------------------------------------------------------------- LPC
def test_lpc_radix_split_does_not_credit_the_unused_lower_part() -> None:
    # y stores [1,1,2,2,3,3] and ends (p = 0); x (continues, p = 1) shares only [1,1]
    trace = _trace([(0.0, "y", [1, 1, 2, 2, 3, 3]), (50.0, "x", [1, 1, 9, 9]),
                    (60.0, "x", [1, 1, 9, 9, 7, 7])])  # fmt: skip
    pol = make_policy("lpc-oracle", "radix")
    # the generic path: the test reads the tree's node sizes from its view
    replay(trace, pol, ReplayConfig(capacity_blocks=64, structure="radix", block_tokens=2,
                                    min_recompute_tokens=0), fast=False)  # fmt: skip
    v = pol.view
    # the node holding y's remainder [2,2,3,3] (2 pages of 2 tokens) under the split point
    (lower,) = [e for e in range(v.num_entries) if v.key[e] >= 0 and v.size[e] == 4]
    assert pol.p[lower] == 0.0  # only y (which ends) ever used it; bug: 1.0 (x's p)
    assert pol.t[lower] == 0.0  # last used at t = 0; bug: 50.0 (x's arrival)


# ---------------------------------------------------------------- hybrid engine adapter
def test_engine_vllm_plus_transformer_hit_is_block_rounded_like_replay() -> None:
    model = "llama-3.1-8b"
    a = list(range(1, 41))
    b = list(range(1, 21)) + list(range(100, 120))  # shares 20 tokens (< one 32-token block)
    trace = _trace([(0.0, "a", a), (100.0, "b", b)])
    rep = replay_hybrid(trace, "vllm+", HybridConfig(10**11, model))
    eng = simulate(trace, "vllm+", EngineConfig(capacity_blocks=1, structure="hybrid",
                                                capacity_bytes=10**11, model=model),
                   make_timing(["roofline"], model, "h100"), check_every=1)  # fmt: skip
    assert rep.hit_tokens.tolist() == [0, 0]
    assert eng.hit_tokens.tolist() == rep.hit_tokens.tolist()  # bug: [0, 20]


def test_failed_hybrid_acquire_leaves_the_tree_alone() -> None:
    """A request that cannot fit even with the tree emptied is refused before any eviction."""
    from prefixlab.runner.engine.hybrid import HybridEngineCache

    spec = get_model("marconi-hybrid-7b")
    k, s = spec.kv_bytes_per_token, spec.state_bytes_per_checkpoint
    trace = _trace([(0.0, "a", list(range(1, 101))), (1.0, "b", list(range(200, 300))),
                    (2.0, "c", list(range(400, 500)))])  # fmt: skip
    total = 101 * k + s + 400 * k + s  # tree after request 0, then 400 tokens + a state
    cache = HybridEngineCache(total, spec, make_policy("sglang+", "hybrid"), trace, 16)
    empty = np.zeros(0, dtype=np.int64)
    # request 0 runs and finishes: its 101 tokens and a state are in the tree
    cache.view.request_index = 0
    h0 = cache.acquire(cache.match(empty), 7, empty)
    cache.commit(h0, empty, 0)
    used = cache.tree.used
    assert used > 0
    # request 1 runs, reserving 20 blocks (fits next to the tree)
    cache.view.request_index = 1
    assert cache.acquire(cache.match(empty), 20, empty) is not None
    # request 2 cannot fit even with the tree empty: it must wait, and nothing should change
    cache.view.request_index = 2
    assert cache.acquire(cache.match(empty), 20, empty) is None
    assert cache.tree.used == used  # bug: 0, request 0's prefix evicted for nothing


def test_hybrid_cell_rejects_prefix_caching_false(tmp_path: Path) -> None:
    """The no-caching baseline of the hybrid cache is the vanilla policy, said in one line."""
    from prefixlab.experiments import parse_config

    data = {
        "workload": {"source": "gen:sessions", "params": {"num_sessions": 5}},
        "model": {"name": "marconi-hybrid-7b"},
        "cache": {"structure": "hybrid", "capacities": ["10GB"]},
        "runner": {"prefix_caching": False},
        "policies": ["marconi"],
    }
    with pytest.raises(ConfigError, match="use the 'vanilla' policy"):
        parse_config(data)
    data["runner"] = {}
    data["cache"] = {"structure": "hybrid", "capacities": [4000]}
    from prefixlab.experiments import run_sweep

    with pytest.raises(ConfigError, match="cannot hold one state and one block"):
        run_sweep(parse_config(data), tmp_path)


# ------------------------------------------------------------------ experiments config
