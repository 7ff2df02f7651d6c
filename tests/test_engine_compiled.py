"""The compiled engine (runner/engine/_kernel.py) against the reference loop (simulator.py +
scheduler.py + cache/block.py + the policy classes): the same per-request times, hits and
preemptions to the last bit, for every policy it runs, under every scheduler setting and
timing model it accepts; the same errors; and the reference wherever it does not apply.

CI runs this file compiled and with NUMBA_DISABLE_JIT=1 (the same source, interpreted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixlab.errors import CapacityError, ConfigError
from prefixlab.model.timing import TimingModel, make_timing
from prefixlab.policies.base import make_policy
from prefixlab.policies.opt_online import OPTOnline
from prefixlab.runner import _fast
from prefixlab.runner.engine import EngineConfig, EngineResult, simulate
from prefixlab.runner.engine import simulator as sim
from prefixlab.workload.generators import GENERATORS, generate_sessions
from prefixlab.workload.trace import Request, Trace


class MyOPTOnline(OPTOnline):
    """A subclass may change any hook: it takes the generic path."""


POLICIES = [
    "lru",
    "fifo",
    "vllm",
    "lfu",
    "mru",
    "sglang-lru",
    "hashtable",
    "sieve",
    "arc",
    "s3fifo",
    "lecar",
    "opt",
    "wa",
    "wa-atc25",
    "unicache",
    "lpc-oracle",
    "opt-online",
    "unicache-opt",
]
TIMING = "power:a=0.000144543,b=0.992,c=1.034+tpot:s=0.02"
ARRAYS = ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "hit_tokens", "num_preemptions")


def _mix(n: int = 160) -> Trace:
    return GENERATORS["mix"].fn(
        trace=1, num_requests=n, duration_s=n / 5.0, seed=3, system_tokens=0, system_pool="per-task"
    )


def assert_same(a: EngineResult, b: EngineResult) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert np.array_equal(x, y, equal_nan=True), name
    ma = {k: v for k, v in a.metrics.items() if k != "elapsed_s"}
    mb = {k: v for k, v in b.metrics.items() if k != "elapsed_s"}
    assert ma == mb
    assert a.num_steps == b.num_steps and a.policy == b.policy and a.timing == b.timing


def both(
    trace: Trace, policy: str, cfg: EngineConfig, timing: str | TimingModel = TIMING
) -> EngineResult:
    t = make_timing(timing) if isinstance(timing, str) else timing
    fast = simulate(trace, policy, cfg, t)
    ref = simulate(trace, policy, cfg, t, fast=False)
    assert_same(fast, ref)
    return fast


CONFIGS = {
    "pressure": EngineConfig(capacity_blocks=700, block_tokens=16),
    "whole-prompts": EngineConfig(
        capacity_blocks=2500, block_tokens=16, max_num_seqs=6, chunked_prefill=False
    ),
    "free-pool-cap": EngineConfig(
        capacity_blocks=1000, block_tokens=16, max_free_blocks=60, cache_while_running=False
    ),
    "closed-loop": EngineConfig(
        capacity_blocks=800, block_tokens=16, closed_loop=True, max_num_batched_tokens=1024
    ),
    "gated": EngineConfig(capacity_blocks=800, block_tokens=16, gated=True),
}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_gives_the_reference_results_under_memory_pressure(policy: str) -> None:
    res = both(_mix(), policy, CONFIGS["pressure"])
    assert res.metrics["num_preemptions"] > 0  # the pool is small enough to preempt


@pytest.mark.parametrize("name", [c for c in CONFIGS if c != "pressure"])
@pytest.mark.parametrize(
    "policy", ["lru", "fifo", "opt", "arc", "unicache", "lfu", "opt-online", "unicache-opt"]
)
def test_scheduler_settings(policy: str, name: str) -> None:
    both(_mix(), policy, CONFIGS[name])


def test_sessions_with_think_times_closed_loop() -> None:
    trace = generate_sessions(
        num_sessions=25, session_rate_per_s=1.0, mean_output_tokens=40, seed=1
    )
    trace.think_s[::2] = np.linspace(0.0, 3.0, trace.think_s[::2].shape[0])  # the rest: gaps
    for cfg in (
        EngineConfig(capacity_blocks=3000, block_tokens=16, closed_loop=True),
        EngineConfig(capacity_blocks=3000, block_tokens=16),
    ):
        both(trace, "lru", cfg)


@pytest.mark.parametrize(
    "timing",
    [
        "tpot:s=0.01",
        "power:preset=llama-3.2-1b-a100",
        "power:a=2e-5,b=0.9,c=1.1+tpot:s=0.03",
        "table",
    ],
)
def test_timing_models(timing: str, tmp_path: Path) -> None:
    if timing == "table":
        csv = tmp_path / "t.csv"
        csv.write_text("input_tokens,ttft_s\n100,0.02\n1000,0.09\n4000,0.5\n")
        timing = f"table:path={csv}+tpot:s=0.02"
    res = both(
        _mix(120),
        "lru",
        EngineConfig(capacity_blocks=900, block_tokens=16, max_num_batched_tokens=512),
        timing,
    )
    assert res.metrics["makespan_s"] > 0


def test_single_row_table(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("input_tokens,ttft_s\n500,0.05\n")
    both(_mix(60), "fifo", EngineConfig(capacity_blocks=900, block_tokens=16), f"table:path={csv}")


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b", "jamba-1.5-mini"])
@pytest.mark.parametrize(
    "spec",
    ["roofline", "power:preset=llama-3.1-8b-h100+roofline", "roofline:mfu=0.4,mbu=0.6+tpot:s=0.02"],
)
def test_roofline_runs_compiled_with_the_references_times(model: str, spec: str) -> None:
    """A roofline (alone, pricing the mixed step; as the decode under a power law; as the
    prefill under a TPOT) runs in the compiled engine with the reference's step times to
    the bit: dense, MoE (experts touched per step, in expectation) and hybrid models."""
    t = make_timing(spec, model=model, gpu="h100")
    codes = sim.timing_codes(t)
    assert codes is not None and codes[0][2] == (spec == "roofline")
    cfg = EngineConfig(capacity_blocks=900, block_tokens=16, max_num_batched_tokens=512)
    res = both(_mix(120), "lru", cfg, t)
    assert res.metrics["makespan_s"] > 0


def test_roofline_step_by_hand() -> None:
    """The kernel's roofline against Roofline.step_s on one mixed step of an MoE model:
    two chunks (300 new after 0, 200 new after 1,000 cached) and three decodes."""
    from prefixlab.runner.engine import _kernel as K

    t = make_timing("roofline", model="mixtral-8x7b", gpu="h100")
    tcode, tpar, tt, ts = sim.timing_codes(t)  # type: ignore[misc]
    cn, cc = np.array([300, 200]), np.array([0, 1000])
    dctx = np.array([50, 4000, 7])
    want = t.step_s([(300, 0, 0), (200, 1000, 1000)], [50, 4000, 7])
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 2, 3, dctx) == want
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 0, 3, dctx) == t.step_s(
        [], [50, 4000, 7]
    )
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 2, 0, dctx) == t.step_s(
        [(300, 0, 0), (200, 1000, 1000)], []
    )
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 0, 0, dctx) == 0.0


def test_observers_take_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[int] = []
    monkeypatch.setattr(sim, "_simulate_compiled", lambda *a: called.append(1))
    trace, cfg = _mix(40), EngineConfig(capacity_blocks=2000, block_tokens=16)
    events: list[Any] = []

    class Obs:
        def on_event(self, e: Any) -> None:
            events.append(e)

    simulate(trace, "lru", cfg, make_timing(TIMING), observers=[Obs()])
    simulate(trace, "lru", cfg, make_timing(TIMING), check_every=5)
    simulate(trace, MyOPTOnline(), cfg, make_timing(TIMING))  # a subclass: generic path
    radix = EngineConfig(capacity_blocks=2000, block_tokens=16, structure="radix")
    simulate(trace, MyOPTOnline(), radix, make_timing(TIMING))
    simulate(trace, "lru", radix, make_timing(TIMING), check_every=5)
    assert not called and events
    simulate(trace, "lru", cfg, make_timing(TIMING))
    simulate(trace, "lru", radix, make_timing(TIMING))
    assert called == [1, 1]


# ----------------------------------------------------------------------------- radix
#: every built-in policy that applies to the radix structure
RADIX_POLICIES = [
    "lru",
    "fifo",
    "lfu",
    "mru",
    "sglang-lru",
    "hashtable",
    "sieve",
    "arc",
    "s3fifo",
    "lecar",
    "opt",
    "lpc-oracle",
    "opt-online",
]
RADIX = {
    "pressure": EngineConfig(capacity_blocks=700, block_tokens=16, structure="radix"),
    "spare-pages": EngineConfig(
        capacity_blocks=700, block_tokens=16, structure="radix", spare_blocks=1
    ),
    "whole-prompts": EngineConfig(
        capacity_blocks=2500,
        block_tokens=16,
        structure="radix",
        max_num_seqs=6,
        chunked_prefill=False,
    ),
    "cache-at-finish": EngineConfig(
        capacity_blocks=900,
        block_tokens=16,
        structure="radix",
        cache_while_running=False,
        spare_blocks=2,
    ),
    "closed-loop": EngineConfig(
        capacity_blocks=800,
        block_tokens=16,
        structure="radix",
        closed_loop=True,
        max_num_batched_tokens=1024,
    ),
    "token-pages": EngineConfig(capacity_blocks=9000, block_tokens=1, structure="radix"),
}


@pytest.mark.parametrize("policy", RADIX_POLICIES)
def test_radix_every_policy_runs_compiled_with_the_reference_results(policy: str) -> None:
    cfg = RADIX["pressure"]
    pol = make_policy(policy, "radix")
    assert sim._compiled_applies(pol, cfg.replay_config(), (), 0)
    res = both(_mix(), policy, cfg)
    assert res.metrics["num_preemptions"] > 0 and res.metrics["num_evictions"] > 0


@pytest.mark.parametrize("name", [c for c in RADIX if c != "pressure"])
@pytest.mark.parametrize("policy", ["lru", "opt", "arc", "lfu", "sieve", "opt-online"])
def test_radix_scheduler_settings(policy: str, name: str) -> None:
    trace = _mix(100) if name == "token-pages" else _mix()
    both(trace, policy, RADIX[name])


def test_radix_sessions_and_roofline() -> None:
    trace = generate_sessions(
        num_sessions=30, session_rate_per_s=4.0, mean_output_tokens=60, seed=2
    )
    cfg = EngineConfig(capacity_blocks=400, block_tokens=16, structure="radix", spare_blocks=1)
    res = both(trace, "lru", cfg, make_timing("roofline", model="llama-3.1-8b", gpu="h100"))
    assert res.metrics["token_hit_ratio"] > 0.2  # sessions share their history


def test_radix_errors_are_the_reference_errors() -> None:
    trace = Trace.from_requests([_req(0.0, 32, 4), _req(1.0, 200, 4)])
    msg = _same_error(
        trace, EngineConfig(capacity_blocks=8, block_tokens=16, structure="radix"), CapacityError
    )
    assert "request 1 needs 13 blocks" in msg


def test_radix_hand_example_compiled() -> None:
    """Pages of 4 tokens, a pool of 4 (LINEAR timing: a prefill step takes its new tokens'
    count in seconds, a decode step 1 s). r0 = [1..8] + 2 output tokens reserves 3 pages
    and caches its 2 prompt pages at t=8; r1 = [1..4, 30..33] (arrived at 0.5) needs 2
    more pages beside its 1-page hit and fits only when r0 finishes at t=9: its match splits
    r0's 2-page edge into p0 (shared) and r0's p1. With spare_blocks=1 (SGLang's allocator
    keeps a page free after each reservation) r1's reservation leaves none free, so r0's p1,
    the only unlocked leaf, is evicted: r2 = [1..8, 50] at t=40 then hits 4 tokens, not 8,
    and prefills 5 tokens instead of 1; its own reservation of 2 pages leaves none free
    either, so r1's p1 goes too (2 pages evicted)."""
    a = list(range(1, 9))
    trace = Trace.from_requests(
        [_tok(0.0, a, 2), _tok(0.5, [1, 2, 3, 4, 30, 31, 32, 33], 2), _tok(40.0, [*a, 50], 1)]
    )
    for spare, hits, first in (
        (0, [0, 4, 8], [8.0, 13.0, 41.0]),
        (1, [0, 4, 4], [8.0, 13.0, 45.0]),
    ):
        cfg = EngineConfig(capacity_blocks=4, block_tokens=4, structure="radix", spare_blocks=spare)
        res = both(trace, "lru", cfg, LINEAR)
        assert res.hit_tokens.tolist() == hits
        assert res.scheduled_s.tolist() == [0.0, 9.0, 40.0]
        assert res.first_token_s.tolist() == first
        assert res.finish_s.tolist() == [9.0, 14.0, first[2]]
        assert res.metrics["num_evictions"] == 2 * spare


def test_engine_codes() -> None:
    """Keyed policies keep their heap under the engine (release order is not key order)."""
    for name in ("sglang-lru", "hashtable", "lfu", "mru", "opt"):
        assert _fast.engine_code(make_policy(name, "block")) == _fast.KEYED
    assert _fast.engine_code(make_policy("opt-online", "block")) == _fast.ARRAY
    assert _fast.engine_code(make_policy("unicache-opt", "block")) == _fast.ARRAY
    assert _fast.engine_code(MyOPTOnline()) == -1
    assert _fast.kernel_code(make_policy("opt-online", "block")) == -1  # no queue in a replay
    assert _fast.engine_code(make_policy("lru", "block")) == _fast.LRU


def _req(t: float, n_in: int, out: int, **kw: Any) -> Request:
    return Request(
        arrival_s=t,
        input_length=n_in,
        output_length=out,
        input_tokens=np.arange(n_in, dtype=np.int64),
        **kw,
    )


def _same_error(trace: Trace, cfg: EngineConfig, kind: type[Exception]) -> str:
    """The error both paths raise (the same message); returns it."""
    msgs = []
    for fast in (True, False):
        with pytest.raises(kind) as err:
            simulate(trace, "lru", cfg, make_timing(TIMING), fast=fast)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]
    return msgs[0]


def test_capacity_error_is_the_reference_error() -> None:
    trace = Trace.from_requests([_req(0.0, 32, 4), _req(1.0, 200, 4)])
    msg = _same_error(trace, EngineConfig(capacity_blocks=8, block_tokens=16), CapacityError)
    assert "request 1 needs 13 blocks" in msg


def test_negative_think_time_is_the_reference_error() -> None:
    reqs = [
        _req(0.0, 20, 2, session_id="s", turn=0),
        _req(1.0, 30, 2, session_id="s", turn=1, think_s=1.0),
    ]
    trace = Trace.from_requests(reqs)
    trace.think_s[1] = -5.0  # past the trace's own check, as a caller could
    cfg = EngineConfig(capacity_blocks=50, block_tokens=16, closed_loop=True)
    assert "before now" in _same_error(trace, cfg, ConfigError)


def test_deterministic() -> None:
    trace, cfg = _mix(80), CONFIGS["pressure"]
    a = simulate(trace, "lecar", cfg, make_timing(TIMING))
    b = simulate(trace, "lecar", cfg, make_timing(TIMING))
    assert_same(a, b)


def test_negative_arrival_is_the_reference_error() -> None:
    trace = Trace.from_requests([_req(-1.0, 20, 2), _req(0.0, 20, 2)])
    msg = _same_error(trace, EngineConfig(capacity_blocks=50, block_tokens=16), ConfigError)
    assert msg == "cannot schedule an event at -1.0 s, before now (0.0 s)"


@pytest.mark.parametrize("fast", [True, False])
def test_progress_reports_finished_requests(fast: bool) -> None:
    trace, cfg = _mix(120), CONFIGS["pressure"]
    seen: list[tuple[int, int]] = []
    res = simulate(
        trace,
        "lru",
        cfg,
        make_timing(TIMING),
        fast=fast,
        on_progress=lambda d, t: seen.append((d, t)),
    )
    assert seen and seen[-1] == (120, 120)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert_same(res, simulate(trace, "lru", cfg, make_timing(TIMING), fast=not fast))


def test_a_request_beyond_any_pool_is_a_capacity_error_not_an_allocation() -> None:
    trace = Trace.from_requests([_req(0.0, 32, 4), _req(1.0, 40, 10**12)])
    msg = _same_error(trace, EngineConfig(capacity_blocks=100, block_tokens=16), CapacityError)
    assert "request 1 needs 62500000003 blocks" in msg


def test_limits_beyond_int64_mean_no_limit() -> None:
    cfg = EngineConfig(
        capacity_blocks=900, block_tokens=16, max_num_seqs=2**64, max_num_batched_tokens=2**63
    )
    both(_mix(60), "lru", cfg)


def test_nan_arrival_is_refused_on_both_paths() -> None:
    trace = Trace.from_requests([_req(0.0, 20, 2), _req(float("nan"), 20, 2)])
    msg = _same_error(trace, EngineConfig(capacity_blocks=50, block_tokens=16), ConfigError)
    assert msg == "request 1: arrival_s is NaN"


@pytest.mark.parametrize("policy", ["lecar", "unicache"])
def test_the_policy_object_ends_with_the_reference_state(policy: str) -> None:
    trace, cfg = _mix(120), CONFIGS["pressure"]
    fast, ref = make_policy(policy, "block"), make_policy(policy, "block")
    simulate(trace, fast, cfg, make_timing(TIMING))
    simulate(trace, ref, cfg, make_timing(TIMING), fast=False)
    assert fast.state[0].shape[0] == ref.state[0].shape[0]  # type: ignore[attr-defined]
    attr = "w_lru" if policy == "lecar" else "alpha"
    assert np.array_equal(getattr(fast, attr), getattr(ref, attr))


LINEAR = "power:a=1,b=1,c=1+tpot:s=1"  # prefill = total new tokens; decode = 1 s


def _tok(t: float, ids: list[int], out: int) -> Request:
    return Request(arrival_s=t, input_length=len(ids), output_length=out, input_tokens=ids)


def test_hand_computed_timeline_compiled() -> None:
    """test_engine.py's hand-computed timeline (see its docstring), on the compiled engine:
    r1 hits r0's two prompt blocks while r0 still decodes."""
    a = list(range(1, 9))
    trace = Trace.from_requests(
        [_tok(0.0, a, 3), _tok(8.5, [*a, 20, 21, 22, 23], 2), _tok(30.0, [*a, 20, 21, 22, 23], 1)]
    )
    res = both(trace, "lru", EngineConfig(capacity_blocks=64, block_tokens=4), LINEAR)
    assert res.scheduled_s.tolist() == [0.0, 9.0, 30.0]
    assert res.first_token_s.tolist() == [8.0, 14.0, 34.0]
    assert res.finish_s.tolist() == [14.0, 15.0, 34.0]
    assert res.hit_tokens.tolist() == [0, 8, 8] and res.num_steps == 5
    late = both(
        trace,
        "lru",
        EngineConfig(capacity_blocks=64, block_tokens=4, cache_while_running=False),
        LINEAR,
    )
    assert late.hit_tokens.tolist() == [0, 0, 8]
    assert late.finish_s.tolist() == [22.0, 23.0, 34.0]


def test_preemption_hand_example_compiled() -> None:
    """Pool of 5 blocks of 4 tokens; r1, admitted second, cannot grow and is preempted."""
    trace = Trace.from_requests([_tok(0.0, [1, 2, 3, 4], 8), _tok(0.0, [5, 6, 7, 8], 8)])
    res = both(trace, "lru", EngineConfig(capacity_blocks=5, block_tokens=4), LINEAR)
    assert res.num_preemptions.tolist() == [0, 1]
    assert res.finish_s[0] < res.finish_s[1] and res.scheduled_s.tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- hybrid
HYBRID_POLICIES = [
    "vanilla",
    "sglang+",
    "sglang+:branch=input,chunk_tokens=4",
    "marconi:alpha=1",
    "marconi:alpha=0.5,recency=last-access,efficiency=node",
    "marconi:alpha_step=0.5,bootstrap_multiplier=2,retune_every=40",
    "vllm+",
    "vllm+:partial_blocks=false,sizing=estimate",
]
HYBRID_TIMING = make_timing(["roofline"], "marconi-hybrid-7b", "h100")


def _hybrid(gb: float, model: str = "marconi-hybrid-7b", **kw: Any) -> EngineConfig:
    return EngineConfig(
        capacity_blocks=1, structure="hybrid", capacity_bytes=int(gb * 1e9), model=model, **kw
    )


@pytest.mark.parametrize("policy", HYBRID_POLICIES)
def test_hybrid_every_policy_runs_compiled_with_the_reference_results(policy: str) -> None:
    """The mix under a budget that evicts all along (and tuned Marconi tunes, retunes)."""
    trace = GENERATORS["mix"].fn(trace=3, num_requests=160)
    res = both(trace, policy, _hybrid(2, max_num_seqs=32), HYBRID_TIMING)
    if policy != "vanilla":
        assert res.metrics["token_hit_ratio"] > 0
    if "alpha_step" in policy:
        assert len(res.metrics["alpha_history"]) >= 2


@pytest.mark.parametrize("model", ["marconi-hybrid-7b", "llama-3.1-8b", "mamba2-2.7b"])
@pytest.mark.parametrize("factor", [1.05, 1.3, 4.0])
def test_hybrid_tight_budgets_compiled(model: str, factor: float) -> None:
    """Budgets a little above the longest request (test_hybrid_engine.py's): the hit taken
    as a miss when its locked path leaves no room, preemptions; on a hybrid model, a
    Transformer (KV reused in slices and whole blocks) and a pure SSM model."""
    from prefixlab.model import get_model

    spec = get_model(model)
    trace = GENERATORS["sessions"].fn(num_sessions=6, preset="agentic", session_rate_per_s=50.0)
    need = int((trace.input_length + trace.output_length).max())
    cap = (need + 32) * spec.kv_bytes_per_token + spec.state_bytes_per_checkpoint
    timing = make_timing(["roofline"], model, "h100")
    for policy in ("marconi:alpha=1", "sglang+", "vllm+"):
        both(trace, policy, _hybrid(cap * factor / 1e9, model, max_num_seqs=8), timing)


def _seq(t: float, ids: list[int], out: list[int]) -> Request:
    return Request(
        arrival_s=t,
        input_length=len(ids),
        output_length=len(out),
        input_tokens=ids,
        output_tokens=out,
    )


def test_hybrid_hand_example_compiled() -> None:
    """Four requests one after another, a budget that never evicts. r0 stores 12 tokens
    (input 1..10, output 11, 12) with a state at 12. r1 extends them: it reuses 12. r2
    leaves r0's edge after token 6: nothing reusable, but judicious admission (sglang+)
    checkpoints the branch point at 6, so r3, sharing those 6 tokens, reuses 6. vLLM+
    (a state per 32-token block, and one at a partial block's end) has none at 6."""
    a = list(range(1, 11))
    trace = Trace.from_requests(
        [
            _seq(0.0, a, [11, 12]),
            _seq(100.0, [*a, 11, 12, 13], [14]),
            _seq(200.0, [1, 2, 3, 4, 5, 6, 99, 98], [97]),
            _seq(300.0, [1, 2, 3, 4, 5, 6, 50], [51]),
        ]
    )
    cfg = _hybrid(10)
    assert both(trace, "sglang+", cfg, LINEAR).hit_tokens.tolist() == [0, 12, 0, 6]
    assert both(trace, "vllm+", cfg, LINEAR).hit_tokens.tolist() == [0, 12, 0, 0]
    # one at a time, a second per new prompt token and per decode step: r0 prefills 10
    # tokens (first token at 10 s) and decodes its second (11 s); r1 prefills 13 - 12 = 1
    res = both(trace, "marconi:alpha=1", cfg, LINEAR)
    assert res.first_token_s.tolist() == [10.0, 101.0, 208.0, 301.0]
    assert res.finish_s.tolist() == [11.0, 101.0, 208.0, 301.0]
    assert res.hit_tokens.tolist() == [0, 12, 0, 6]


def test_hybrid_tuning_reports_progress_from_its_thread() -> None:
    """Tuned Marconi's tuner is Python, called back from the compiled kernel; with a
    progress callback the kernel runs on a thread of its own."""
    trace = GENERATORS["mix"].fn(trace=3, num_requests=120)
    seen: list[int] = []
    pol = "marconi:alpha_step=0.5,bootstrap_multiplier=2"
    t = HYBRID_TIMING
    fast = simulate(trace, pol, _hybrid(2), t, on_progress=lambda d, n: seen.append(d))
    assert_same(fast, simulate(trace, pol, _hybrid(2), t, fast=False))
    assert seen and seen[-1] == 120 and len(fast.metrics["alpha_history"]) == 1


def test_hybrid_compiled_applies_to_built_in_policies_only() -> None:
    from prefixlab.policies.hybrid import Marconi

    class MyMarconi(Marconi):
        name = "my-marconi"

    assert sim._hybrid_compiled_applies(Marconi(alpha=1.0), [], 0)
    assert not sim._hybrid_compiled_applies(MyMarconi(alpha=1.0), [], 0)
    assert not sim._hybrid_compiled_applies(Marconi(alpha=1.0), [], 1)
