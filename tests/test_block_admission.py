"""Admission on the block and radix caches (prefixlab.policies.block_admission): hand-computed
hits and events on tiny hash-form traces, a naive reference model, the engine's
cache-while-running path, third-party admissions, and the errors a user meets.

Hash ids 0..K-1 are used so dense key ids equal them; blocks are 4 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab.cache.events import Admitted, Event, Rejected
from prefixlab.cache.view import AdmitContext
from prefixlab.cli.main import app
from prefixlab.configfile import parse_config_text
from prefixlab.errors import ConfigError
from prefixlab.experiments.config import ExperimentConfig, parse_config
from prefixlab.experiments.run import fingerprint
from prefixlab.model.timing import make_timing
from prefixlab.policies.block_admission import (
    Admission,
    Seen,
    is_default,
    make_admission,
    register,
    registered,
)
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.types import I64
from prefixlab.workload.trace import Request, Trace

BT = 4
STRUCTURES = ("block", "radix")


def hash_trace(reqs: list[tuple[int, list[int]]], gap: float = 1.0) -> Trace:
    """A hash-form trace of (input_length, hash_ids) requests, ``gap`` seconds apart."""
    requests = [
        Request(arrival_s=gap * r, input_length=n, output_length=0, hash_ids=h)
        for r, (n, h) in enumerate(reqs)
    ]
    return Trace.from_requests(requests, block_tokens=BT)


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, list[int], int]] = []

    def on_event(self, event: Event) -> None:
        if isinstance(event, Admitted | Rejected):
            self.events.append((type(event).__name__, event.keys.tolist(), event.tokens))


def run(trace: Trace, admission: str, structure: str, capacity: int = 64) -> tuple[list[int], Log]:
    log = Log()
    cfg = ReplayConfig(capacity_blocks=capacity, structure=structure, admission=admission)
    res = replay(trace, "lru", cfg, observers=[log], check_every=1)
    return res.hit_tokens.tolist(), log


@pytest.mark.parametrize("structure", STRUCTURES)
def test_seen_twice_caches_from_the_second_computation(structure: str) -> None:
    # Three identical 13-token prompts: 3 full blocks, all 3 looked up ((13 - 1) // 4).
    trace = hash_trace([(13, [0, 1, 2, 9])] * 3)
    hits, log = run(trace, "seen:n=2", structure)
    # r0 computes them once (refused); r1 a second time (cached); r2 hits 3 blocks.
    assert hits == [0, 0, 12]
    assert log.events == [("Rejected", [0, 1, 2], 12), ("Admitted", [0, 1, 2], 12)]
    hits_all, log_all = run(trace, "all", structure)
    assert hits_all == [0, 12, 12]
    # The default caches every block and says so too.
    assert log_all.events == [("Admitted", [0, 1, 2], 12)]


@pytest.mark.parametrize("structure", STRUCTURES)
def test_admission_keeps_a_prefix(structure: str) -> None:
    # r0 computes blocks 0, 1; r1 computes 0..3: 0 and 1 are on their second computation,
    # 2 and 3 on their first, so r1 caches 0, 1 only. r2 hits 0, 1 and caches 2, 3 (first
    # candidate at depth 2); r3 hits all four.
    trace = hash_trace(
        [(9, [0, 1, 8]), (17, [0, 1, 2, 3, 9]), (17, [0, 1, 2, 3, 9]), (17, [0, 1, 2, 3, 9])]
    )
    hits, log = run(trace, "seen", structure)
    assert hits == [0, 0, 8, 16]
    assert log.events == [
        ("Rejected", [0, 1], 8),
        ("Admitted", [0, 1], 8),
        ("Rejected", [2, 3], 8),
        ("Admitted", [2, 3], 8),
    ]


def test_a_refused_block_never_outlives_its_request() -> None:
    # A 2-block pool: r0's refused blocks return empty, so r1 takes them with no eviction.
    trace = hash_trace([(9, [0, 1, 8]), (9, [2, 3, 8])])
    cfg = ReplayConfig(capacity_blocks=3, admission="seen:n=2")
    res = replay(trace, "lru", cfg, check_every=1)
    assert res.metrics["num_evictions"] == 0
    assert res.metrics["num_admitted_blocks"] == 0 and res.metrics["num_rejected_blocks"] == 4
    # With every block cached, r1 evicts r0's two.
    res_all = replay(trace, "lru", ReplayConfig(capacity_blocks=3), check_every=1)
    assert res_all.metrics["num_evictions"] == 2 and "num_rejected_blocks" not in res_all.metrics


def naive_hits(trace: Trace, n: int) -> list[int]:
    """An unbounded cache with a count-n admission, as a set of keys and a counter."""
    layout = trace.block_layout()
    cached: set[int] = set()
    count: dict[int, int] = {}
    out = []
    for r in range(len(trace)):
        keys = layout.request_keys(r).tolist()
        hit = 0
        while hit < int(layout.num_lookup_blocks[r]) and keys[hit] in cached:
            hit += 1
        out.append(hit * BT)
        admitting = True
        for k in keys[hit:]:
            count[k] = count.get(k, 0) + 1
            admitting = admitting and count[k] >= n
            if admitting:
                cached.add(k)
    return out


prompts = st.lists(
    st.lists(st.integers(0, 5), min_size=1, max_size=5).map(lambda t: [0, *t]),
    min_size=1,
    max_size=25,
)


def trie_trace(paths: list[list[int]]) -> Trace:
    """One request per path of choices; each prefix of choices a distinct hash id, so the
    requests share prefixes as the paths do (and end in a partial block)."""
    ids: dict[tuple[int, ...], int] = {}
    reqs = []
    for path in paths:
        hashes = [ids.setdefault(tuple(path[: i + 1]), len(ids)) for i in range(len(path))]
        reqs.append((BT * len(hashes) + 1, [*hashes, 10_000]))
    return hash_trace(reqs)


@settings(max_examples=60, deadline=None)
@given(prompts, st.integers(1, 3), st.sampled_from(STRUCTURES))
def test_seen_matches_a_naive_model(paths: list[list[int]], n: int, structure: str) -> None:
    trace = trie_trace(paths)
    hits, _ = run(trace, f"seen:n={n}", structure, capacity=1000)
    assert hits == naive_hits(trace, n)


@settings(max_examples=30, deadline=None)
@given(prompts, st.integers(7, 14), st.sampled_from(STRUCTURES))
def test_seen_once_is_all_under_eviction(paths: list[list[int]], cap: int, structure: str) -> None:
    """n=1 admits everything: the object path equals the compiled one, evictions and all."""
    trace = trie_trace(paths)
    cfg = ReplayConfig(capacity_blocks=cap, structure=structure)
    a = replay(trace, "lru", cfg)
    b = replay(
        trace, "lru", ReplayConfig(capacity_blocks=cap, structure=structure, admission="seen:n=1")
    )
    assert a.hit_tokens.tolist() == b.hit_tokens.tolist()
    assert a.metrics["num_evictions"] == b.metrics["num_evictions"]


@pytest.mark.parametrize("structure", STRUCTURES)
def test_engine_caching_while_running_honours_the_admission(structure: str) -> None:
    # Far-apart arrivals: the engine caches blocks as prefill computes them (several
    # commits per request) and must hit what the replay hits.
    trace = hash_trace(
        [(17, [0, 1, 2, 3, 9]), (17, [0, 1, 2, 3, 9]), (33, [0, 1, 2, 3, 4, 5, 6, 7, 9])] * 2,
        gap=1000.0,
    )
    timing = make_timing("power:a=1,b=1,c=1+tpot:s=1")
    for n in (1, 2, 3):
        spec = f"seen:n={n}"
        cfg = EngineConfig(
            capacity_blocks=64,
            structure=structure,
            admission=spec,
            max_num_batched_tokens=8,  # chunked prefill: 2 blocks per step
        )
        res = simulate(trace, "lru", cfg, timing, check_every=1)
        want, _ = run(trace, spec, structure)
        assert res.hit_tokens.tolist() == want, spec
        assert res.metrics["num_rejected_blocks"] >= 0


def test_the_context_names_request_time_and_depth() -> None:
    seen: list[tuple[int, float, int, list[int]]] = []

    @register("test-recorder")
    class Recorder(Admission):
        """Record every question; admit one block."""

        def admit(self, keys: I64, context: AdmitContext) -> int:
            seen.append((context.request, context.now, context.first_depth, keys.tolist()))
            return 1

    assert "test-recorder" in registered()
    trace = hash_trace([(13, [0, 1, 2, 9]), (13, [0, 1, 2, 9]), (13, [0, 1, 2, 9])])
    hits, log = run(trace, "test-recorder", "block")
    assert seen == [(0, 0.0, 0, [0, 1, 2]), (1, 1.0, 1, [1, 2]), (2, 2.0, 2, [2])]
    assert hits == [0, 4, 8]
    assert log.events[:2] == [("Admitted", [0], 4), ("Rejected", [1, 2], 8)]


def test_an_admission_out_of_range_is_caught() -> None:
    @register("test-greedy")
    class Greedy(Admission):
        """Admit more than offered (a bug)."""

        def admit(self, keys: I64, context: AdmitContext) -> int:
            return int(keys.shape[0]) + 1

    with pytest.raises(AssertionError, match="admitted 4 of 3"):
        run(hash_trace([(13, [0, 1, 2, 9])]), "test-greedy", "block")


def test_specs_and_their_errors() -> None:
    assert is_default(None) and is_default("all") and not is_default("seen")
    assert make_admission("seen:n=3").spec() == "seen:n=3"
    assert isinstance(make_admission("seen"), Seen)
    with pytest.raises(ConfigError, match="unknown admission 'sometimes'; known: all"):
        make_admission("sometimes")
    with pytest.raises(ConfigError, match="has no parameter 'm'; it takes: n"):
        make_admission("seen:m=2")
    with pytest.raises(ConfigError, match="n must be an integer >= 1, got 0"):
        make_admission("seen:n=0")
    with pytest.raises(ConfigError, match="unknown admission"):
        ReplayConfig(capacity_blocks=4, admission="nope").validate()
    cfg = EngineConfig(
        capacity_blocks=4, structure="hybrid", capacity_bytes=10, model="x", admission="seen"
    )
    with pytest.raises(ConfigError, match="applies to the block and radix structures"):
        cfg.validate()


def test_command_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"prefixlab_trace": 1, "block_tokens": BT}] + [
        {"arrival_s": i, "input_length": 13, "output_length": 0, "hash_ids": [0, 1, 2, 9]}
        for i in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    args = ["replay", str(path), "-p", "lru", "--capacity-blocks", "64", "--json"]
    out = runner.invoke(app, [*args, "--admission", "seen:n=2"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)[0]
    assert row["num_hit_tokens"] == 12 and row["num_rejected_blocks"] == 3
    bad = runner.invoke(app, [*args, "--admission", "seen:n=0"])
    assert bad.exit_code == 2 and "n must be an integer >= 1, got 0" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    hybrid = ["--structure", "hybrid", "--model", "marconi-hybrid-7b", "--capacity-bytes", "1GB"]
    timing = ["--timing", "power:a=1,b=1,c=1+tpot:s=1"]
    for cmd in (["replay"], ["simulate", *timing]):
        out = runner.invoke(app, [*cmd, str(path), "-p", "marconi", *hybrid, "--admission", "seen"])
        assert out.exit_code == 2 and "admission is its policy's" in out.output, out.output


BASE = """
name = "t"
policies = ["lru"]
[workload]
source = "sessions"
params = { num_sessions = 4 }
[cache]
capacities = [100]
"""


def config(extra: str = "") -> ExperimentConfig:
    return parse_config(parse_config_text(BASE + extra))


def test_experiment_config_and_fingerprint() -> None:
    assert "admission" not in fingerprint(config())["cache"]  # older folders keep their ids
    seen = fingerprint(config('admission = "seen:n=2"\n'))["cache"]
    assert isinstance(seen, dict) and seen["admission"] == "seen:n=2"
    with pytest.raises(ConfigError, match="hybrid structure's admission is its policy's"):
        config('admission = "seen"\nstructure = "hybrid"\n')
    with pytest.raises(ConfigError, match="unknown admission"):
        config('admission = "nope"\n')
