"""The hybrid cache under the engine runner (issue 6: TTFT for Marconi and its baselines)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.experiments import parse_config, run_sweep
from prefixlab.model.spec import get_model
from prefixlab.model.timing import make_timing
from prefixlab.policies.base import make_policy
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Request, Trace

TIMING = make_timing(["roofline"], "marconi-hybrid-7b", "h100")


def _config(gb: float, **kw: object) -> EngineConfig:
    return EngineConfig(
        capacity_blocks=1,
        structure="hybrid",
        capacity_bytes=int(gb * 1e9),
        model="marconi-hybrid-7b",
        **kw,
    )  # type: ignore[arg-type]


def _trace(rows: list[tuple[float, str, list[int]]], out: int = 1) -> Trace:
    """(arrival, session, input token ids); ``out`` output tokens each, no ids."""
    reqs = [
        Request(arrival_s=a, input_length=len(t), output_length=out, session_id=s, input_tokens=t)
        for a, s, t in rows
    ]
    return Trace.from_requests(reqs)


def test_one_at_a_time_the_engine_hits_what_replay_hits() -> None:
    """With sessions far apart and closed-loop turns nothing overlaps, the engine admits each finished sequence
    as replay does, and with a cache large enough never to evict the hits are equal."""
    trace = GENERATORS["sessions"].fn(num_sessions=15, preset="agentic", session_rate_per_s=0.001)
    for pol in ("sglang+", "marconi:alpha=1", "vllm+"):
        rep = replay_hybrid(trace, pol, HybridConfig(400_000_000_000))
        # closed loop: a session's next turn arrives after the previous one finished
        eng = simulate(trace, pol, _config(400, closed_loop=True), TIMING, check_every=1)
        assert rep.metrics["num_evicted_nodes"] == 0
        assert int(eng.hit_tokens.sum()) == rep.metrics["num_hit_tokens"], pol


def test_under_pressure_invariants_hold_and_tuned_marconi_tunes() -> None:
    trace = GENERATORS["mix"].fn(trace=3, num_requests=300)
    res = {}
    for pol in ("vanilla", "sglang+", "marconi:alpha=1", "marconi:alpha_step=0.5"):
        r = simulate(trace, pol, _config(5, max_num_seqs=32), TIMING, check_every=1)
        res[pol] = r
        assert np.all(r.first_token_s >= r.scheduled_s) and np.all(r.finish_s >= r.first_token_s)
    assert res["vanilla"].metrics["token_hit_ratio"] == 0.0
    # fewer prompt tokens to prefill on this workload: lower mean TTFT than no caching
    assert res["sglang+"].metrics["mean_ttft_s"] < res["vanilla"].metrics["mean_ttft_s"]
    # the eviction rule matters under pressure
    assert not np.array_equal(res["marconi:alpha=1"].hit_tokens, res["sglang+"].hit_tokens)
    # tuned Marconi is tuned under the engine too (it used to stay at alpha 0)
    tuned = res["marconi:alpha_step=0.5"].metrics
    assert len(tuned["alpha_history"]) == 1
    ((lookups, alpha),) = tuned["alpha_history"]
    assert lookups > 0 and alpha in (0.0, 0.5, 1.0, 1.5, 2.0) and tuned["alpha"] == alpha


@pytest.mark.parametrize(("factor", "preemptions"), [(1.05, 0), (1.3, 1), (2.0, 0)])
def test_tight_budgets_run_to_the_end(factor: float, preemptions: int) -> None:
    """Budgets a little above the longest request, six sessions at once, checks every step.
    At 1.05x a request's locked hit path (KV plus the states along it) leaves too little
    room even with nothing else running: it runs as a miss instead of waiting forever (this
    used to end with unfinished requests). At 1.3x a decode needs a block nobody can free:
    the newest request is preempted."""
    from prefixlab.model import get_model

    spec = get_model("marconi-hybrid-7b")
    trace = GENERATORS["sessions"].fn(num_sessions=6, preset="agentic", session_rate_per_s=50.0)
    need = int((trace.input_length + trace.output_length).max())
    cap = int(((need + 32) * spec.kv_bytes_per_token + spec.state_bytes_per_checkpoint) * factor)
    r = simulate(trace, "marconi:alpha=1", _config(cap / 1e9), TIMING, check_every=1)
    assert r.metrics["num_preemptions"] == preemptions
    assert np.all(np.isfinite(r.finish_s))
    assert r.metrics["token_hit_ratio"] > 0


def test_errors() -> None:
    trace = GENERATORS["sessions"].fn(num_sessions=2)
    with pytest.raises(ConfigError, match="does not apply to the hybrid structure"):
        simulate(trace, "lru", _config(5), TIMING)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        simulate(
            trace,
            "marconi",
            EngineConfig(capacity_blocks=1, structure="hybrid", model="marconi-hybrid-7b"),
            TIMING,
        )


def test_simulate_cli_and_engine_sweep(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "simulate",
            "gen:mix:trace=3,num_requests=200",
            "--structure",
            "hybrid",
            "--model",
            "marconi-7b-hybrid",
            "--gpu",
            "h100",
            "--capacity-bytes",
            "5000000000",
            "-p",
            "sglang+",
            "-p",
            "marconi:alpha=1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["structure"] for r in rows] == ["hybrid", "hybrid"]
    assert all(r["p95_ttft_s"] > 0 for r in rows)
    bad = runner.invoke(
        app,
        [
            "simulate",
            "gen:mix:trace=3,num_requests=50",
            "--structure",
            "hybrid",
            "--model",
            "marconi-7b-hybrid",
            "--gpu",
            "h100",
            "--capacity-blocks",
            "100",
            "-p",
            "marconi",
        ],
    )
    assert bad.exit_code == 2 and "needs --model and --capacity-bytes" in bad.output
    cfg = parse_config(
        {
            "workload": {"source": "gen:mix", "params": {"trace": 3, "num_requests": 150}},
            "model": {"name": "marconi-hybrid-7b", "gpu": "h100"},
            "cache": {"structure": "hybrid", "capacities": ["5GB"]},
            "runner": {"kind": "engine"},
            "policies": ["sglang+", "marconi:alpha=1"],
        }
    )
    run_sweep(cfg, tmp_path)
    table = pq.read_table(tmp_path / "results.parquet").to_pylist()
    assert all(r["p95_ttft_s"] > 0 and r["capacity_bytes"] == 5_000_000_000 for r in table)
    assert pq.read_table(tmp_path / "cdf.parquet").num_rows == 2 * 101


def test_engine_vllm_plus_transformer_hit_is_block_rounded_like_replay() -> None:
    model = "llama-3.1-8b"
    a = list(range(1, 41))
    b = list(range(1, 21)) + list(range(100, 120))  # shares 20 tokens (< one 32-token block)
    trace = _trace([(0.0, "a", a), (100.0, "b", b)])
    rep = replay_hybrid(trace, "vllm+", HybridConfig(10**11, model))
    eng = simulate(
        trace,
        "vllm+",
        EngineConfig(capacity_blocks=1, structure="hybrid", capacity_bytes=10**11, model=model),
        make_timing(["roofline"], model, "h100"),
        check_every=1,
    )
    assert rep.hit_tokens.tolist() == [0, 0]
    assert eng.hit_tokens.tolist() == rep.hit_tokens.tolist()  # bug: [0, 20]


def test_failed_hybrid_acquire_leaves_the_tree_alone() -> None:
    """A request that cannot fit even with the tree emptied is refused before any eviction."""
    from prefixlab.runner.engine.hybrid import HybridEngineCache

    spec = get_model("marconi-hybrid-7b")
    k, s = spec.kv_bytes_per_token, spec.state_bytes_per_checkpoint
    trace = _trace(
        [
            (0.0, "a", list(range(1, 101))),
            (1.0, "b", list(range(200, 300))),
            (2.0, "c", list(range(400, 500))),
        ]
    )
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
