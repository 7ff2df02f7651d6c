"""The engine runner: hand-computed timelines, agreement with replay and with queueing theory,
determinism, events, memory invariants, preemption, chunked prefill, closed loop."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cache.events import Event
from prefixlab.cli.main import app
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.metrics.latency import overload
from prefixlab.model.timing import make_timing
from prefixlab.policies.base import EvictionPolicy
from prefixlab.policies.lru import LRU
from prefixlab.runner.engine import (
    Arrived,
    EngineConfig,
    EventLoop,
    Finished,
    FirstToken,
    Preempted,
    Scheduled,
    StepDone,
    simulate,
)
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.loaders.write import write_trace
from prefixlab.workload.trace import Request, Trace

LINEAR = make_timing("power:a=1,b=1,c=1+tpot:s=1")  # prefill = total new tokens; decode = 1 s


class Log:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def _plain(event: Any) -> tuple[Any, ...]:
    values = dataclasses.astuple(event)
    return (type(event).__name__, *(v.tolist() if isinstance(v, np.ndarray) else v for v in values))


def _req(
    t: float,
    inp: list[int],
    out: int,
    sid: str | None = None,
    turn: int = 0,
    think: float | None = None,
) -> Request:
    return Request(
        arrival_s=t,
        input_length=len(inp),
        output_length=out,
        session_id=sid,
        turn=turn,
        input_tokens=inp,
        output_tokens=list(range(900, 900 + out)),
        think_s=think,
    )


# ------------------------------------------------------------------ event loop
def test_event_loop_orders_by_time_priority_then_insertion() -> None:
    loop: EventLoop[str] = EventLoop()
    loop.schedule(2.0, "late")
    loop.schedule(1.0, "b", priority=1)
    loop.schedule(1.0, "a", priority=0)
    loop.schedule(1.0, "c", priority=1)
    seen: list[tuple[float, str]] = []
    loop.run(lambda p: seen.append((loop.now, p)), until_s=1.5)
    assert seen == [(1.0, "a"), (1.0, "b"), (1.0, "c")] and loop.now == 1.5
    assert loop.peek() == 2.0 and loop.pop() == "late"
    with pytest.raises(ConfigError, match="before now"):
        loop.schedule(1.0, "past")


# ------------------------------------------------------------------ hand-computed timeline
def test_hand_computed_timeline() -> None:
    """Blocks of 4 tokens; prefill costs 1 s per new token, a decode step 1 s.

    r0 t=0: 8 tokens, 3 out.   step [0,8) prefill 8 -> first token 8; decodes 8->9, 9->...
    r1 t=8.5: r0's 8 tokens + 4 (12), 2 out. Busy until 9. r0's two prompt blocks were
       cached when its prefill finished (at 8), so r1 hits them while r0 still decodes:
       lookup caps at (12-1)//4 = 2 blocks -> 8 hit tokens. At 9 the step runs r0's decode
       and r1's 4-token prefill: 5 s -> ends 14: r0 finishes (3 tokens), r1's first token;
       r1 decodes 14 -> 15: done.
    r2 t=30: r1's 12 tokens, 1 out: 2 cached blocks -> 8 hits, prefill 4 -> done at 34.
    With cache_while_running=False (replay's rule) r1 finds nothing: it prefills 12 tokens
    in a 13-second step (9 -> 22) and r0 finishes at 22.
    """
    a = list(range(1, 9))
    trace = Trace.from_requests(
        [
            _req(0.0, a, 3),
            _req(8.5, [*a, 20, 21, 22, 23], 2),
            _req(30.0, [*a, 20, 21, 22, 23], 1),
        ]
    )
    log = Log()
    res = simulate(
        trace,
        "lru",
        EngineConfig(capacity_blocks=64, block_tokens=4),
        LINEAR,
        observers=[log],
        check_every=1,
    )
    assert res.scheduled_s.tolist() == [0.0, 9.0, 30.0]
    assert res.first_token_s.tolist() == [8.0, 14.0, 34.0]
    assert res.finish_s.tolist() == [14.0, 15.0, 34.0]
    assert res.hit_tokens.tolist() == [0, 8, 8]
    m = res.metrics
    assert m["mean_ttft_s"] == pytest.approx((8 + 5.5 + 4) / 3)  # arrival -> first token
    assert m["mean_prefill_s"] == pytest.approx((8 + 5 + 4) / 3)  # scheduled -> first token
    assert m["mean_queue_s"] == pytest.approx((0 + 0.5 + 0) / 3)  # arrival -> scheduled
    assert m["p50_ttft_s"] == pytest.approx(5.5) and m["p50_prefill_s"] == pytest.approx(5)
    # TPOT: r0 (14-8)/2 = 3, r1 (15-14)/1 = 1; r2 has one token: no TPOT.
    assert m["mean_tpot_s"] == pytest.approx(2.0)
    assert m["makespan_s"] == 34.0 and m["throughput_tokens_per_s"] == pytest.approx(6 / 34)
    steps = log.of(StepDone)
    assert [(s.start_s, s.duration_s) for s in steps] == [
        (0.0, 8.0),
        (8.0, 1.0),
        (9.0, 5.0),
        (14.0, 1.0),
        (30.0, 4.0),
    ]
    late = simulate(
        trace,
        "lru",
        EngineConfig(capacity_blocks=64, block_tokens=4, cache_while_running=False),
        LINEAR,
        check_every=1,
    )
    assert late.hit_tokens.tolist() == [0, 0, 8]
    assert late.first_token_s.tolist() == [8.0, 22.0, 34.0]
    assert late.finish_s.tolist() == [22.0, 23.0, 34.0]


# ------------------------------------------------------------------ agreement with replay
@pytest.mark.parametrize("structure", ["block", "radix"])
@pytest.mark.parametrize("policy", ["lru", "fifo", "vllm", "sglang-lru", "s3fifo"])
def test_no_queueing_matches_replay_and_timing(structure: str, policy: str) -> None:
    """Arrivals far apart: hits equal the replay runner's, TTFT = timing(uncached tokens)."""
    if (policy == "vllm" and structure == "radix") or (
        policy == "sglang-lru" and structure == "block"
    ):
        pytest.skip("policy does not apply to this structure")
    trace = generate_sessions(
        num_sessions=25,
        seed=3,
        session_rate_per_s=1e-4,
        gap_mu=9.0,
        system_tokens=256,
        mean_user_tokens=64,
        mean_output_tokens=32,
    )
    timing = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.01")
    cap = 600
    # With arrivals far apart caching while running changes nothing for recency and FIFO
    # orders; S3-FIFO's queues see the prompt's blocks before the decode's evictions, so it
    # matches replay under replay's caching rule.
    early = policy != "s3fifo"
    res = simulate(
        trace,
        policy,
        EngineConfig(
            capacity_blocks=cap,
            structure=structure,
            block_tokens=16,
            max_num_batched_tokens=1 << 20,
            cache_while_running=early,
        ),
        timing,
        check_every=5,
    )
    rep = replay(
        trace, policy, ReplayConfig(capacity_blocks=cap, structure=structure, block_tokens=16)
    )
    assert res.metrics["num_evictions"] > 0  # the capacity binds
    assert np.array_equal(res.hit_tokens, rep.hit_tokens)
    assert res.metrics["token_hit_ratio"] == rep.metrics["token_hit_ratio"]
    expected = [
        timing.prefill_s([(int(n - h), int(h))])
        for n, h in zip(trace.input_length, res.hit_tokens, strict=True)
    ]
    ttft = res.first_token_s - res.scheduled_s
    assert np.allclose(ttft, expected, rtol=1e-12, atol=1e-9)
    assert np.array_equal(res.scheduled_s, trace.arrival_s)  # nobody waited


# ------------------------------------------------------------------ queueing theory
def _fixed_prompts(n: int, rate: float, seed: int, tokens: int = 100) -> Trace:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    blocks = tokens // 16
    ids = np.arange(n * blocks, dtype=np.uint64)  # all distinct: no hits
    return Trace(
        arrival_s=arrivals,
        input_length=np.full(n, tokens),
        output_length=np.ones(n, np.int64),
        session_id=[None] * n,
        turn=np.zeros(n, np.int64),
        task=[None] * n,
        hash_ids=(ids, np.arange(0, n * blocks + 1, blocks, dtype=np.int64)),
        hashed_tokens=np.full(n, tokens),
        block_tokens=16,
    )


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_matches_theory(rho: float) -> None:
    """Single server, Poisson arrivals, deterministic service D: Wq = rho D / (2 (1 - rho))."""
    timing = make_timing("power:a=0.01,b=1,c=1")  # 100 tokens -> D = 1 s
    service = 1.0
    waits = []
    for seed in range(4):
        trace = _fixed_prompts(30_000, rho / service, seed)
        res = simulate(trace, "lru", EngineConfig(capacity_blocks=64, max_num_seqs=1), timing)
        assert np.allclose(res.first_token_s - res.scheduled_s, service)
        waits.append(res.scheduled_s - res.arrival_s)
    theory = rho * service / (2 * (1 - rho))
    measured = float(np.concatenate(waits).mean())
    assert measured == pytest.approx(theory, rel=0.05), (measured, theory)


# ------------------------------------------------------------------ hits help
def test_higher_hit_ratio_never_worse_mean_prefill() -> None:
    """Prefill time, not TTFT: with queueing, who waits behind whom depends on more than
    the hits."""
    trace = generate_sessions(
        num_sessions=120,
        seed=5,
        session_rate_per_s=0.5,
        system_tokens=512,
        mean_user_tokens=128,
        mean_output_tokens=64,
    )
    timing = make_timing("power:preset=llama-3.2-1b-a100+tpot:s=0.005")
    runs = []
    for cap in (600, 1000, 2000, 4000, 8000):
        for pol in ("fifo", "lru", "opt"):
            r = simulate(trace, pol, EngineConfig(capacity_blocks=cap, block_tokens=16), timing)
            runs.append((r.metrics["token_hit_ratio"], r.metrics["mean_prefill_s"], cap, pol))
    runs.sort()
    assert runs[-1][0] > runs[0][0] + 0.2  # the sweep spans a real range of hit ratios
    for (h1, t1, *_), (h2, t2, *_) in itertools.pairwise(runs):
        if h2 > h1:
            assert t2 <= t1 + 1e-12, (runs,)


# ------------------------------------------------------------------ determinism and events
def test_deterministic_and_every_event_observed() -> None:
    trace = generate_sessions(
        num_sessions=30, seed=2, session_rate_per_s=2.0, mean_output_tokens=48
    )
    timing = make_timing("power:preset=llama-3.2-1b-a100+tpot:s=0.01")
    cfg = EngineConfig(
        capacity_blocks=1500, block_tokens=16, max_num_seqs=8, max_num_batched_tokens=2048
    )
    logs = []
    for _ in range(2):
        log = Log()
        res = simulate(trace, "lecar:seed=4", cfg, timing, observers=[log], check_every=3)
        logs.append((log, res))
    (l1, r1), (l2, r2) = logs
    assert [_plain(e) for e in l1.events] == [_plain(e) for e in l2.events]
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s"):
        assert np.array_equal(getattr(r1, name), getattr(r2, name))
    n = len(trace)
    assert len(l1.of(Arrived)) == n and len(l1.of(Finished)) == n and len(l1.of(FirstToken)) == n
    assert len(l1.of(Scheduled)) == n + r1.metrics["num_preemptions"]
    assert len(l1.of(StepDone)) == r1.metrics["num_steps"]
    assert max(s.num_running for s in l1.of(StepDone)) <= 8
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 2048 for s in l1.of(StepDone))
    assert not np.isnan(r1.finish_s).any()


def test_preemption_under_memory_pressure_keeps_invariants() -> None:
    """A pool too small for everyone's decode: requests are preempted, recomputed, and all
    finish; the invariant checker runs after every step."""
    trace = generate_sessions(
        num_sessions=40,
        seed=8,
        session_rate_per_s=20.0,
        max_turns=3,
        system_tokens=64,
        mean_user_tokens=64,
        mean_output_tokens=200,
    )
    log = Log()
    res = simulate(
        trace,
        "lru",
        EngineConfig(capacity_blocks=120, block_tokens=16),
        LINEAR,
        observers=[log],
        check_every=1,
    )
    assert (
        res.metrics["num_preemptions"] > 0
        and len(log.of(Preempted)) == res.metrics["num_preemptions"]
    )
    assert not np.isnan(res.finish_s).any()
    assert (res.finish_s >= res.first_token_s).all() and (res.first_token_s >= res.arrival_s).all()


def test_preemption_hand_example() -> None:
    """Pool of 5 blocks of 4 tokens. r0 and r1 (4-token prompts, 8 out) start together:
    2 blocks each (prompt + first token). Each decode crosses into a new block at 8 tokens;
    when r1 (the later one) cannot grow, it is preempted, r0 runs on, r1 restarts after."""
    trace = Trace.from_requests([_req(0.0, [1, 2, 3, 4], 8), _req(0.0, [5, 6, 7, 8], 8)])
    log = Log()
    res = simulate(
        trace,
        "lru",
        EngineConfig(capacity_blocks=5, block_tokens=4),
        LINEAR,
        observers=[log],
        check_every=1,
    )
    pre = log.of(Preempted)
    assert [p.request for p in pre] == [1]
    assert res.finish_s[0] < res.finish_s[1]
    assert res.num_preemptions.tolist() == [0, 1]
    scheduled = [(s.request, s.time_s) for s in log.of(Scheduled)]
    assert scheduled[:2] == [(0, 0.0), (1, 0.0)] and scheduled[2][0] == 1


def test_capacity_error_names_the_request() -> None:
    trace = Trace.from_requests([_req(0.0, list(range(40)), 1)])
    with pytest.raises(CapacityError, match="request 0 needs 11 blocks"):
        simulate(trace, "lru", EngineConfig(capacity_blocks=10, block_tokens=4), LINEAR)


# ------------------------------------------------------------------ chunked prefill
def test_chunked_prefill_splits_by_budget() -> None:
    trace = Trace.from_requests([_req(0.0, list(range(1, 251)), 1)])
    log = Log()
    res = simulate(
        trace,
        "lru",
        EngineConfig(capacity_blocks=100, block_tokens=16, max_num_batched_tokens=100),
        LINEAR,
        observers=[log],
    )
    assert [s.num_prefill_tokens for s in log.of(StepDone)] == [100, 100, 50]
    assert res.first_token_s[0] == 250.0
    # Without chunking a lone long prompt still runs (over budget) rather than starve.
    res2 = simulate(
        trace,
        "lru",
        EngineConfig(
            capacity_blocks=100, block_tokens=16, max_num_batched_tokens=100, chunked_prefill=False
        ),
        LINEAR,
    )
    assert res2.first_token_s[0] == 250.0 and res2.metrics["num_steps"] == 1


# ------------------------------------------------------------------ closed loop
def test_closed_loop_next_turn_waits_for_completion_plus_think() -> None:
    a = list(range(1, 9))
    trace = Trace.from_requests(
        [
            _req(0.0, a, 2, sid="s", turn=0),
            _req(1.0, [*a, 900, 901, 30, 31], 1, sid="s", turn=1, think=5.0),
            _req(2.0, [50, 51], 1),
        ]
    )
    res = simulate(
        trace, "lru", EngineConfig(capacity_blocks=64, block_tokens=4, closed_loop=True), LINEAR
    )
    # turn 0: prefill 8 -> first token at 8. The sessionless request (open loop) arrived at
    # 2; at 8 one step runs turn 0's decode and its 2-token prefill: 3 s -> both finish at
    # 11. Turn 1 arrives 5 s of thinking later, at 16 (its trace time, 1.0, is ignored).
    assert res.arrival_s[2] == 2.0
    assert res.finish_s.tolist()[0] == 11.0 and res.finish_s[2] == 11.0
    assert res.arrival_s[1] == 16.0
    # Open loop the same trace arrives at the trace time, while turn 0 is still running.
    res_open = simulate(trace, "lru", EngineConfig(capacity_blocks=64, block_tokens=4), LINEAR)
    assert res_open.arrival_s[1] == 1.0


def test_gated_turn_arrives_at_its_time_but_not_before_its_predecessor_finishes() -> None:
    """The trace above, gated: turn 1's trace time (1.0) is before turn 0 finishes (11), so
    it arrives at 11; with a trace time of 20 it arrives at 20 (think times are ignored).
    Arriving at 11 it hits turn 0's 2 full prompt blocks (the 2-token reply fills no
    block): 4 new tokens, first token at 11 + 4 = 15."""
    a = list(range(1, 9))

    def trace(t1: float) -> Trace:
        return Trace.from_requests(
            [
                _req(0.0, a, 2, sid="s", turn=0),
                _req(t1, [*a, 900, 901, 30, 31], 1, sid="s", turn=1, think=5.0),
                _req(2.0, [50, 51], 1),
            ]
        )

    cfg = EngineConfig(capacity_blocks=64, block_tokens=4, gated=True)
    early = simulate(trace(1.0), "lru", cfg, LINEAR)
    assert early.arrival_s.tolist() == [0.0, 11.0, 2.0]
    assert early.hit_tokens[1] == 8 and early.first_token_s[1] == 15.0
    late = simulate(trace(20.0), "lru", cfg, LINEAR)
    assert late.arrival_s.tolist() == [0.0, 20.0, 2.0]
    with pytest.raises(ConfigError, match="two arrival modes"):
        simulate(trace(1.0), "lru", dataclasses.replace(cfg, closed_loop=True), LINEAR)


# ------------------------------------------------------------------ lookahead
class Lookahead(LRU):
    name = "lookahead-test"
    uses_lookahead = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def on_waiting(self, waiting_keys: Any) -> None:
        self.seen.append(len(waiting_keys))


def test_policies_with_lookahead_see_the_waiting_queue() -> None:
    trace = Trace.from_requests(
        [_req(0.0, list(range(1, 9)), 1)] * 1 + [_req(0.5, [i, i + 1], 1) for i in range(20, 30)]
    )
    pol = Lookahead()
    simulate(trace, pol, EngineConfig(capacity_blocks=64, block_tokens=4, max_num_seqs=2), LINEAR)
    assert pol.seen and max(pol.seen) == 10  # all ten late arrivals queued behind r0
    plain: EvictionPolicy = LRU()
    assert not plain.uses_lookahead


# ------------------------------------------------------------------ CLI
def test_simulate_cli_json_fields() -> None:
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "gen:sessions:num_sessions=30,seed=1",
            "--block-tokens",
            "16",
            "--capacity-blocks",
            "2000",
            "-p",
            "lru",
            "-p",
            "vllm",
            "--timing",
            "power:preset=llama-3.2-1b-a100",
            "--timing",
            "tpot:s=0.02",
            "--max-num-seqs",
            "16",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["policy"] for r in rows] == ["lru", "vllm"]
    for key in (
        "token_hit_ratio",
        "mean_ttft_s",
        "p50_ttft_s",
        "p95_ttft_s",
        "p99_ttft_s",
        "mean_prefill_s",
        "p50_prefill_s",
        "p95_prefill_s",
        "mean_queue_s",
        "mean_tpot_s",
        "throughput_tokens_per_s",
        "makespan_s",
        "by_task",
    ):
        assert key in rows[0], key
    r = rows[0]
    assert r["mean_ttft_s"] >= r["mean_prefill_s"] > 0
    assert r["mean_ttft_s"] == pytest.approx(r["mean_prefill_s"] + r["mean_queue_s"], rel=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timing", "power:a=1"], "needs a, b and c"),
        (["--timing", "warp:x=1"], "unknown timing model 'warp'"),
        ([], "give --timing, or --model and --gpu"),
        (["--model", "llama-3.1-8b", "--gpu", "tpu"], "unknown GPU 'tpu'"),
        (["--timing", "tpot:s=1", "--max-num-seqs", "0"], "max_num_seqs must be a positive"),
    ],
)
def test_simulate_cli_errors_are_one_line(args: list[str], message: str) -> None:
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "gen:sessions:num_sessions=5",
            "--block-tokens",
            "16",
            "--capacity-blocks",
            "500",
            "-p",
            "lru",
            *args,
        ],
    )
    assert res.exit_code == 2, res.output
    assert message in res.stderr.replace("\n", " ")


def test_radix_engine_preempts_and_keeps_invariants() -> None:
    trace = generate_sessions(
        num_sessions=40,
        seed=8,
        session_rate_per_s=20.0,
        max_turns=3,
        system_tokens=64,
        mean_user_tokens=64,
        mean_output_tokens=200,
    )
    res = simulate(
        trace,
        "sglang-lru",
        EngineConfig(capacity_blocks=120, structure="radix", block_tokens=16),
        LINEAR,
        check_every=1,
    )
    assert res.metrics["num_preemptions"] > 0
    assert not np.isnan(res.finish_s).any()
    assert res.metrics["token_hit_ratio"] > 0


def test_single_token_outputs_have_no_tpot_and_json_has_null() -> None:
    trace = Trace.from_requests([_req(0.0, [1, 2, 3, 4], 1), _req(0.0, [5, 6], 0)])
    res = simulate(trace, "lru", EngineConfig(capacity_blocks=16, block_tokens=4), LINEAR)
    # Both prefill in one 6-second step; an output of 0 tokens finishes at prefill end.
    assert res.first_token_s.tolist() == [6.0, 6.0] and res.finish_s.tolist() == [6.0, 6.0]
    assert np.isnan(res.metrics["mean_tpot_s"])
    out = CliRunner().invoke(
        app,
        [
            "simulate",
            "gen:random-pool:num_requests=20,output_tokens=1",
            "--block-tokens",
            "4",
            "--capacity-blocks",
            "100",
            "-p",
            "lru",
            "--timing",
            "power:a=1e-3,b=1,c=1",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)[0]["mean_tpot_s"] is None


@pytest.mark.parametrize(
    "spec", ["power:preset=llama-3.1-8b-h100", "roofline:mfu=0.5", "power:a=1e-6,b=1,c=1.3"]
)
def test_a_chunked_prompt_costs_what_one_pass_costs(spec: str) -> None:
    """Alone, a prompt larger than the token budget runs in several chunks; its TTFT still
    equals the timing model applied to its uncached tokens in one pass."""
    timing = make_timing(spec, "llama-3.1-8b", "h100")
    trace = Trace.from_requests([_req(0.0, list(range(1, 20_001)), 1)])
    res = simulate(
        trace,
        "lru",
        EngineConfig(capacity_blocks=2000, block_tokens=16, max_num_batched_tokens=4096),
        timing,
    )
    assert res.metrics["num_steps"] == 5  # 4096 x 4 + 3616
    ttft = res.first_token_s[0] - res.scheduled_s[0]
    assert ttft == pytest.approx(timing.prefill_s([(20_000, 0)]), rel=1e-9)


# ------------------------------------------------------------------ overload
@pytest.mark.parametrize(("rho", "warned"), [(0.8, False), (1.5, True)])
def test_overload_is_named_with_its_numbers(rho: float, warned: bool) -> None:
    """M/D/1 with D = 1 s: at rho 0.8 the queue is stable, at 1.5 it grows by 1/3 s of
    wait per second of arrivals, served at 1/s against 1.5/s offered."""
    timing = make_timing("power:a=0.01,b=1,c=1")  # 100 tokens -> D = 1 s
    trace = _fixed_prompts(2000, rho, 0)
    res = simulate(trace, "lru", EngineConfig(capacity_blocks=64, max_num_seqs=1), timing)
    message = overload(res.arrival_s, res.scheduled_s, res.first_token_s, res.finish_s)
    assert (message is not None) == warned, message
    if message is not None:
        found = re.search(r"arrive at ([\d.]+)/s but were served at ([\d.]+)/s", message)
        assert found is not None
        assert float(found[1]) == pytest.approx(1.5, rel=0.03)
        assert float(found[2]) == pytest.approx(1.0, rel=0.01)
        assert "(last tenth)" in message and "--time-scale" in message


def test_overload_warning_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(_fixed_prompts(400, 3.0, 1), path)
    args = ["simulate", str(path), "-p", "lru", "--capacity-blocks", "64", "--max-num-seqs", "1"]
    args += ["--timing", "power:a=0.01,b=1,c=1"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0 and "warning: lru: overloaded: requests arrive at" in out.output
    # A tenth of the rate (every gap ten times longer): served as it comes.
    calm = CliRunner().invoke(app, [*args, "--time-scale", "10"])
    assert calm.exit_code == 0 and "overloaded" not in calm.output, calm.output
