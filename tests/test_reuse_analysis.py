"""`analyze reuse`: hand-computed counts, a naive reference, the issue's acceptance claims."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab.analysis import (
    analyze_reuse,
    fit_lognormal,
    headroom,
    lognormal_cdf,
    reuse_sources,
    session_gaps,
    trace_stats,
)
from prefixlab.analysis.reuse import ALL, POSITION_BINS, position_bin
from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload import load_trace
from prefixlab.workload.arrivals import GAP_PRESETS
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Request, Trace, to_hash_form

BT = 2


def _req(
    t: float,
    sid: str | None,
    task: str | None,
    inp: list[int],
    out: list[int] | None,
    out_len: int | None = None,
) -> Request:
    return Request(
        arrival_s=t,
        input_length=len(inp),
        output_length=len(out) if out is not None else (out_len or 0),
        session_id=sid,
        task=task,
        input_tokens=inp,
        output_tokens=out,
    )


def tiny() -> Trace:
    """Five requests, 2-token blocks (keys named by their prefix; lookups capped at
    (input - 1) // 2 blocks)::

        r0 A chat  in 1 2|3 4|5   out 6 7   blocks [12][34][56]      lookup 2, phase P P D
        r1 A chat  in 1 2|3 4|5 6|7 8 out 9 [12][34][56][78]    lookup 3: all from r0
        r2 B qa    in 1 2|3 4|9 9 out 8 8   [12][34][99][88]    lookup 2: from r1
        r3 - -     in 1 2|7 7     (no output tokens) [12][77]   lookup 1: from r2
        r4 A chat  in 1 2|3 4|9 9|5 5 out - [12][34][99][55]    lookup 3: r3, r2, r2
    """
    return Trace.from_requests(
        [
            _req(0.0, "A", "chat", [1, 2, 3, 4, 5], [6, 7]),
            _req(1.0, "A", "chat", [1, 2, 3, 4, 5, 6, 7, 8], [9]),
            _req(2.0, "B", "qa", [1, 2, 3, 4, 9, 9], [8, 8]),
            _req(3.0, None, None, [1, 2, 7, 7], None, out_len=3),
            _req(5.0, "A", "chat", [1, 2, 3, 4, 9, 9, 5, 5], []),
        ]
    )


def test_tiny_attribution_counts() -> None:
    a = analyze_reuse(tiny(), BT)
    assert list(a.attribution) == [ALL, "chat", "qa", "(none)"]
    d = {t: at.as_dict() for t, at in a.attribution.items()}
    assert d[ALL]["num_lookup_blocks"] == 11 and d[ALL]["num_reuses"] == 9
    # Only r1's three reuses come from its own session (r0); r4's come from r3 and r2, the
    # most recent holders, though its session stored blocks 0 and 1 before them.
    assert (d[ALL]["num_intra_session"], d[ALL]["num_inter_session"]) == (3, 6)
    assert (d[ALL]["num_intra_task"], d[ALL]["num_inter_task"]) == (3, 6)
    assert d[ALL]["intra_session_share"] == pytest.approx(3 / 9)
    assert (d["chat"]["num_reuses"], d["chat"]["num_intra_session"]) == (6, 3)
    assert d["chat"]["num_lookup_blocks"] == 2 + 3 + 3
    assert (d["qa"]["num_reuses"], d["qa"]["num_intra_task"]) == (2, 0)
    assert (d["(none)"]["num_reuses"], d["(none)"]["num_inter_session"]) == (1, 1)
    layout = tiny().block_layout(BT)
    assert reuse_sources(layout).tolist() == [
        -1,
        -1,
        -1,  # r0: nothing before it (block 2 is not a lookup block)
        0,
        0,
        0,
        -1,  # r1
        1,
        1,
        -1,
        -1,  # r2
        2,
        -1,  # r3
        3,
        2,
        2,
        -1,  # r4
    ]


def test_tiny_phase_and_position() -> None:
    a = analyze_reuse(tiny(), BT)
    # Reused later = a later request looks the key up. r0's decode block [5 6] is r1's input.
    ph = {
        t: (p.num_prefill_stored, p.num_prefill_reused, p.num_decode_stored, p.num_decode_reused)
        for t, p in a.phase.items()
    }
    assert ph == {
        ALL: (15, 8, 2, 1),
        "chat": (10, 4, 1, 1),
        "qa": (3, 3, 1, 0),
        "(none)": (2, 1, 0, 0),
    }
    assert a.phase["qa"].decode_reuse_fraction == 0.0
    assert a.phase["(none)"].decode_reuse_fraction is None
    pos = a.position[ALL]
    assert pos.num_stored == (5, 5, 3, 2, 0, 0, 0, 0, 0, 0)
    assert pos.num_reused == (4, 3, 1, 0, 0, 0, 0, 0, 0, 0)
    assert pos.probability[:4] == (0.8, 0.6, 1 / 3, 0.0) and pos.probability[4] is None
    assert a.position["chat"].num_stored[:4] == (3, 3, 2, 2)
    assert a.position["chat"].num_reused[:4] == (2, 2, 0, 0)


def test_tiny_gaps_and_headroom() -> None:
    a = analyze_reuse(tiny(), BT, capacity_blocks=5)
    assert list(a.gaps) == ["chat"]  # session B has one request; r3 has none
    g = a.gaps["chat"]
    assert g.num_gaps == 2 and g.gaps_s.tolist() == [1.0, 4.0]
    assert g.mu == pytest.approx(math.log(4) / 2) and g.sigma == pytest.approx(math.log(4) / 2)
    h = a.headroom
    # Infinite cache: the 9 reused blocks, 2 tokens each, of 31 input tokens.
    assert h.infinite_token_hit_ratio == pytest.approx(18 / 31)
    assert h.capacity_blocks == 5
    assert h.lru_token_hit_ratio is not None and h.opt_token_hit_ratio is not None
    assert h.lru_token_hit_ratio <= h.opt_token_hit_ratio <= h.infinite_token_hit_ratio
    assert json.loads(json.dumps(a.as_dict()))["headroom"]["capacity_blocks"] == 5


def test_hash_form_gives_the_same_analysis() -> None:
    token = analyze_reuse(tiny(), BT, capacity_blocks=5).as_dict()
    hashed = analyze_reuse(to_hash_form(tiny(), BT), capacity_blocks=5).as_dict()
    assert hashed.pop("form") == "hash" and token.pop("form") == "token"
    assert hashed == token


def test_position_bins() -> None:
    pos = np.array([0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 10**6])
    assert position_bin(pos).tolist() == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    for i, (lo, hi) in enumerate(POSITION_BINS):
        assert position_bin(np.array([lo]))[0] == i
        if hi is not None:
            assert position_bin(np.array([hi]))[0] == i


def test_lognormal_fit_against_numpy() -> None:
    gaps = np.array([0.5, 1.0, 2.0, 3.0, 10.0, 0.0, 40.0])
    g = fit_lognormal(gaps)
    logs = np.log(gaps[gaps > 0])
    assert g.num_gaps == 6 and g.num_zero_gaps == 1
    assert g.mu is not None and g.sigma is not None and g.ks_distance is not None
    assert g.mu == pytest.approx(float(np.mean(logs)))
    assert g.sigma == pytest.approx(float(np.std(logs)))  # MLE: population std
    assert g.median_s == pytest.approx(2.5) and g.fit_median_s == pytest.approx(math.exp(g.mu))
    assert g.p90_s == pytest.approx(float(np.percentile(gaps[gaps > 0], 90)))
    # CDF: 1/2 at the median, Phi(1) one sigma above it.
    cdf = lognormal_cdf(np.array([math.exp(g.mu), math.exp(g.mu + g.sigma), 0.0]), g.mu, g.sigma)
    assert cdf.tolist() == pytest.approx([0.5, 0.8413447460685429, 0.0])
    pos = np.sort(gaps[gaps > 0])
    fitted = [0.5 * (1 + math.erf((math.log(x) - g.mu) / (g.sigma * math.sqrt(2)))) for x in pos]
    ks = max(
        max(abs(np.mean(pos <= x) - f), abs(np.mean(pos < x) - f))
        for x, f in zip(pos, fitted, strict=True)
    )
    assert g.ks_distance == pytest.approx(ks)
    assert fit_lognormal(np.array([3.0])).mu is None


def test_session_gaps_sort_by_arrival_and_take_the_later_task() -> None:
    tr = Trace.from_requests(
        [
            _req(10.0, "s", "chat", [1, 2], None),
            _req(4.0, "s", "agentic", [1, 2], None),
            _req(5.0, "t", "chat", [3, 4], None),
            _req(6.0, "s", "chat", [1, 2, 5], None),
        ]
    )
    gaps = session_gaps(tr)
    assert {k: v.tolist() for k, v in gaps.items()} == {"chat": [2.0, 4.0]}


# ----------------------------------------------------------- against a naive reference
def naive(trace: Trace, bt: int) -> tuple[list[int], list[bool]]:
    """Per block: the attributed source request (-1 none), and whether it is reused later."""
    layout = trace.block_layout(bt)
    last: dict[int, int] = {}
    sources: list[int] = []
    lookups: list[list[int]] = []
    for r in range(len(trace)):
        keys = layout.request_keys(r).tolist()
        nl = int(layout.num_lookup_blocks[r])
        sources += [last.get(k, -1) if j < nl else -1 for j, k in enumerate(keys)]
        lookups.append(keys[:nl])
        for k in keys:
            last[k] = r
    later = [
        any(k in lookups[s] for s in range(r + 1, len(trace)))
        for r in range(len(trace))
        for k in layout.request_keys(r).tolist()
    ]
    return sources, later


@st.composite
def small_traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(1, 12))
    reqs = []
    for i in range(n):
        inp = draw(st.lists(st.integers(0, 2), min_size=1, max_size=9))
        out = draw(st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=4)))
        sid = draw(st.sampled_from([None, "a", "b"]))
        task = draw(st.sampled_from([None, "x", "y"]))
        reqs.append(_req(float(i), sid, task, inp, out, out_len=draw(st.integers(0, 3))))
    return Trace.from_requests(reqs)


@settings(max_examples=150, deadline=None)
@given(small_traces(), st.integers(1, 3))
def test_vectorised_matches_naive(trace: Trace, bt: int) -> None:
    sources, later = naive(trace, bt)
    assert reuse_sources(trace.block_layout(bt)).tolist() == sources
    a = analyze_reuse(trace, bt)
    layout = trace.block_layout(bt)
    src = np.array(sources, dtype=np.int64)
    req = np.repeat(np.arange(len(trace)), np.diff(layout.key_offsets))
    sess = trace.session_id
    intra = sum(
        1
        for s, r in zip(src.tolist(), req.tolist(), strict=True)
        if s >= 0 and sess[r] is not None and sess[s] == sess[r]
    )
    intra_task = sum(
        1
        for s, r in zip(src.tolist(), req.tolist(), strict=True)
        if s >= 0 and trace.task[s] == trace.task[r]
    )
    at = a.attribution[ALL]
    assert (at.num_reuses, at.num_intra_session, at.num_intra_task) == (
        int((src >= 0).sum()),
        intra,
        intra_task,
    )
    phase = a.phase[ALL]
    assert phase.num_prefill_reused + phase.num_decode_reused == sum(later)
    assert sum(a.position[ALL].num_reused) == phase.num_prefill_reused
    # Chained keys: the reuses are exactly an infinite cache's hit blocks.
    big = int(layout.num_blocks_held.sum()) + 1
    res = replay(trace, "lru", ReplayConfig(capacity_blocks=big, block_tokens=bt))
    assert at.num_reuses == res.metrics["num_hit_blocks"]
    assert at.num_lookup_blocks == res.metrics["num_lookup_blocks"]


# ----------------------------------------------------------- the acceptance claims
MULTI_TURN = ("chat", "agentic")
SINGLE_TURN = ("untemplated", "programming", "tool-use", "document-qa")


@pytest.mark.parametrize("mix", [1, 3])
def test_acceptance_on_generated_mix(mix: int) -> None:
    tr = GENERATORS["mix"].fn(trace=mix, num_requests=1500)
    a = analyze_reuse(tr, 16)
    for task in MULTI_TURN:
        share = a.attribution[task].as_dict()["intra_session_share"]
        assert share > 0.5, (task, share)
    for task in SINGLE_TURN:
        frac = a.phase[task].decode_reuse_fraction
        assert frac is not None and frac < 0.05, (task, frac)
    prob = [p for p in a.position[ALL].probability if p is not None]
    assert prob[0] > prob[-1]
    # The generator draws gaps from its presets: the fit finds them again.
    for task in MULTI_TURN:
        mu, sigma = GAP_PRESETS[task]
        assert a.gaps[task].mu == pytest.approx(mu, abs=0.25)
        assert a.gaps[task].sigma == pytest.approx(sigma, abs=0.25)


def test_acceptance_on_mooncake(mooncake_path: Path) -> None:
    tr = load_trace(mooncake_path, "mooncake")
    a = analyze_reuse(tr)
    at = a.attribution[ALL]
    # No sessions: every reuse is inter-session; the count is the infinite cache's hits
    # (54,063,104 tokens, the brute-force number of test_trace_stats).
    assert at.num_reuses * 512 == 54_063_104 and at.num_intra_session == 0
    assert a.num_sessions == 0 and a.gaps == {}
    assert a.phase[ALL].num_decode_stored == 0  # the ids cover the input only
    prob = a.position[ALL].probability
    assert prob[0] > 0.999 and prob[0] > prob[1] > prob[-1]  # type: ignore[operator]
    # Pinned (docs/analysis.md quotes them): block 1 and the 128+ bin.
    assert prob[1] == pytest.approx(0.4336, abs=5e-5) and prob[-1] == pytest.approx(
        0.2794, abs=5e-5
    )
    assert a.headroom.infinite_token_hit_ratio == trace_stats(tr)["infinite_cache_token_hit_ratio"]


def test_headroom_capacity_errors() -> None:
    with pytest.raises(ConfigError, match="too small: request 1 holds 5 blocks"):
        headroom(tiny(), BT, capacity_blocks=4)
    with pytest.raises(ConfigError, match="must be positive"):
        analyze_reuse(tiny(), BT, capacity_blocks=0)
    with pytest.raises(ConfigError, match="block_tokens"):
        analyze_reuse(tiny())


# ----------------------------------------------------------- CLI
MIX = "gen:mix:num_requests=150"


def test_cli_json_and_plots(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "analyze",
            "reuse",
            MIX,
            "--block-tokens",
            "16",
            "--capacity-blocks",
            "2000",
            "--json",
            "--plots",
            str(tmp_path / "p"),
            "--dpi",
            "50",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"session_task_reuse", "phase_reuse", "position_reuse", "gaps", "headroom"} <= set(out)
    assert out["position_reuse"]["bins"][0] == "0" and out["position_reuse"]["bins"][-1] == "128+"
    assert set(out["gaps"]) == {"agentic", "chat"}
    h = out["headroom"]
    assert h["capacity_blocks"] == 2000
    assert h["opt_minus_lru"] == pytest.approx(h["opt_token_hit_ratio"] - h["lru_token_hit_ratio"])
    names = sorted(Path(p).name for p in out["plots"])
    assert names == [
        "reuse_gaps.png",
        "reuse_headroom.png",
        "reuse_phase.png",
        "reuse_position.png",
        "reuse_sessions.png",
    ]
    for p in out["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_tables() -> None:
    res = CliRunner().invoke(app, ["analyze", "reuse", MIX, "--block-tokens", "16"])
    assert res.exit_code == 0, res.output
    for text in ("intra session", "prefill reused", "128+", "log-normal", "infinite cache"):
        assert text in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--block-tokens", "16", "--capacity-blocks", "3"], "--capacity-blocks 3 is too small"),
        ([], "needs --block-tokens"),
        (["--block-tokens", "16", "--load-opt", "x"], "--load-opt expects key=value"),
    ],
)
def test_cli_errors_are_one_line(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["analyze", "reuse", MIX, *args])
    assert res.exit_code == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_missing_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["analyze", "reuse", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 2 and "not found" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
