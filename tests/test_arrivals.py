"""The arrival models (``workload/arrivals.py``): session and LPC arrivals recovered from
large fixed-seed samples (tolerances are the project's 5% on fitted parameters or a few
standard errors of the estimate at the sample size used), LPC's bound on active
conversations, known (measured) gaps against drawn ones, closed-loop think times, and the
``make_arrivals`` spec parser with its one-line errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from prefixlab.errors import ConfigError
from prefixlab.workload.arrivals import (
    GAP_PRESETS,
    LPCArrivals,
    SessionArrivals,
    make_arrivals,
    max_concurrent,
)
from tests.helpers import half_open_peak


def _schedule_many(
    model: Any, n: int, seed: int, turns: tuple[int, int] = (1, 6), decode: float = 30.0
) -> tuple[list[float], list[float], list[np.ndarray]]:
    """Starts, ends (last turn + the session's output at ``decode`` tok/s) and gaps."""
    rng = np.random.default_rng(seed)
    starts, ends, gaps = [], [], []
    for _ in range(n):
        num_turns = int(rng.integers(turns[0], turns[1] + 1))
        out_tokens = int(rng.integers(10, 400))
        times, g = model.schedule(num_turns, rng, output_tokens=out_tokens)
        assert times.shape == (num_turns,) and g[0] == 0.0
        assert np.allclose(times, times[0] + np.cumsum(g))
        starts.append(float(times[0]))
        ends.append(float(times[-1]) + out_tokens / decode)
        gaps.append(g[1:])
    return starts, ends, gaps


@pytest.mark.parametrize("preset", ["chat", "agentic"])
def test_session_arrivals_recover_rate_and_lognormal_preset(preset: str) -> None:
    rate = 0.5
    model = SessionArrivals(session_rate_per_s=rate, preset=preset)
    starts, _, gaps = _schedule_many(model, 6000, seed=11, turns=(4, 6))
    inter = np.diff(starts)
    assert np.all(inter > 0)
    assert inter.mean() == pytest.approx(1 / rate, rel=0.05)
    assert inter.std() == pytest.approx(1 / rate, rel=0.07)  # exponential: std == mean
    logs = np.log(np.concatenate(gaps))
    assert logs.size > 15_000
    mu, sigma = GAP_PRESETS[preset]
    assert logs.mean() == pytest.approx(mu, rel=0.05)
    assert logs.std() == pytest.approx(sigma, rel=0.05)


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({"gap_mu": 2.5, "gap_sigma": 0.4}, (2.5, 0.4)),
        ({"preset": "agentic", "gap_mu": 3.0, "gap_sigma": 0.7}, (3.0, 0.7)),
        ({"preset": "agentic", "gap_mu": 3.0}, (3.0, GAP_PRESETS["agentic"][1])),
        ({"gap_sigma": 0.5}, (GAP_PRESETS["chat"][0], 0.5)),
    ],
)
def test_session_arrivals_explicit_gap_parameters(
    kwargs: dict[str, Any], want: tuple[float, float]
) -> None:
    model = SessionArrivals(**kwargs)
    assert model.mu_sigma == want
    _, _, gaps = _schedule_many(model, 4000, seed=12, turns=(5, 6))
    logs = np.log(np.concatenate(gaps))
    assert logs.mean() == pytest.approx(want[0], rel=0.05)
    assert logs.std() == pytest.approx(want[1], rel=0.05)


def test_lpc_arrivals_gaps_exponential_and_start_spacing_with_large_n_conv() -> None:
    lam, rate = 40.0, 4.0
    model = LPCArrivals(lambda_chat=lam, n_conv=10**9, session_rate_per_s=rate)
    starts, ends, gaps = _schedule_many(model, 6000, seed=13)
    g = np.concatenate(gaps)
    assert g.size > 10_000
    assert g.mean() == pytest.approx(lam, rel=0.05)
    assert g.std() == pytest.approx(lam, rel=0.05)  # exponential: std == mean
    inter = np.diff(starts)
    assert np.all(inter >= 0)
    assert inter.mean() == pytest.approx(1 / rate, rel=0.05)
    # Never held back: far more than a handful are active at once.
    assert max_concurrent(starts, ends) > 20
    assert half_open_peak(starts, ends) > 20


@pytest.mark.parametrize("n_conv", [1, 3, 8])
def test_lpc_arrivals_small_n_conv_bounds_active_conversations(n_conv: int) -> None:
    rate = 5.0
    model = LPCArrivals(lambda_chat=10.0, n_conv=n_conv, session_rate_per_s=rate)
    starts, ends, _ = _schedule_many(model, 1500, seed=14)
    assert np.all(np.diff(starts) >= 0)
    # The bound binds (demand far exceeds n_conv) and is never exceeded.
    assert half_open_peak(starts, ends) == n_conv
    # Held back: starts are spread out much more than 1 / rate.
    assert np.diff(starts).mean() > 3 / rate


def test_lpc_arrivals_max_concurrent_never_exceeds_n_conv() -> None:
    n_conv = 3
    model = LPCArrivals(lambda_chat=10.0, n_conv=n_conv, session_rate_per_s=5.0)
    starts, ends, _ = _schedule_many(model, 500, seed=14)
    assert max_concurrent(starts, ends) <= n_conv


def test_max_concurrent_basic_counts() -> None:
    assert max_concurrent([0, 1, 2], [10, 3, 4]) == 3
    assert max_concurrent([0, 5], [1, 6]) == 1
    assert max_concurrent([], []) == 0


def test_known_gaps_override_drawn_gaps_without_shifting_the_stream() -> None:
    model_a = SessionArrivals(session_rate_per_s=1.0)
    model_b = SessionArrivals(session_rate_per_s=1.0)
    rng_a = np.random.default_rng(3)
    t_a, g_a = model_a.schedule(5, rng_a)
    rng_b = np.random.default_rng(3)
    t_b, g_b = model_b.schedule(5, rng_b, known=[123.0, 7.5, None, 0.25])
    assert g_b[0] == 0.0  # known[0] is ignored: the first turn has no gap
    assert g_b[1] == 7.5 and g_b[3] == 0.25
    assert g_b[2] == g_a[2] and g_b[4] == g_a[4]  # drawn gaps unchanged
    assert t_b[0] == t_a[0]
    # Open loop, a known (measured) think time is a floor under the drawn arrival gap.
    assert np.allclose(t_b, t_b[0] + np.cumsum(np.maximum(g_a, g_b)))
    # Same draws consumed: the next session is identical in both.
    t_a2, g_a2 = model_a.schedule(3, rng_a)
    t_b2, g_b2 = model_b.schedule(3, rng_b)
    assert np.array_equal(t_a2, t_b2) and np.array_equal(g_a2, g_b2)
    lpc = LPCArrivals(lambda_chat=50.0)
    _, g = lpc.schedule(3, np.random.default_rng(0), known=[None, 1.0, 2.0, 3.0, 4.0])
    assert g.tolist() == [0.0, 1.0, 2.0]


def test_open_loop_agent_gaps_are_drawn_closed_loop_are_measured() -> None:
    """Open loop: the drawn agentic gap, floored by the tool's time; closed loop: the tool's."""
    model = make_arrivals("sessions:preset=agentic")
    rng = np.random.default_rng(1)
    times, thinks = model.schedule(4, rng, known=[None, 0.2, None, 50.0])
    assert thinks[1] == 0.2 and thinks[3] == 50.0
    gaps = np.diff(times)
    assert gaps[0] >= 0.2 and gaps[2] >= 50.0 - 1e-9
    assert gaps[1] == thinks[2]  # no known time: the drawn gap is both


@pytest.mark.parametrize("cls", [SessionArrivals, LPCArrivals])
def test_closed_loop_think_times(cls: type) -> None:
    rng = np.random.default_rng(0)
    closed = cls(closed_loop=True)
    _, gaps = closed.schedule(4, rng)
    thinks = closed.think_times(gaps)
    assert thinks[0] is None
    assert thinks[1:] == [float(g) for g in gaps[1:]]
    assert all(t > 0 for t in thinks[1:])
    open_ = cls()
    assert open_.think_times(gaps) == [None] * 4


def test_make_arrivals_parses_specs_and_defaults() -> None:
    m = make_arrivals("sessions:session_rate_per_s=0.5,preset=agentic")
    assert isinstance(m, SessionArrivals)
    assert m.session_rate_per_s == 0.5 and m.preset == "agentic"
    m2 = make_arrivals("lpc:lambda_chat=50,n_conv=7", closed_loop=True, preset="x")
    assert isinstance(m2, LPCArrivals)
    assert (m2.lambda_chat, m2.n_conv, m2.closed_loop) == (50, 7, True)
    # The spec wins over the defaults; defaults the model lacks are ignored.
    m3 = make_arrivals("sessions:preset=chat", preset="agentic", n_conv=3)
    assert isinstance(m3, SessionArrivals) and m3.preset == "chat"
    assert make_arrivals("sessions", preset="agentic").preset == "agentic"  # type: ignore[attr-defined]
    assert make_arrivals(m2) is m2


def test_make_arrivals_rejects_unknown_model_and_parameter() -> None:
    with pytest.raises(ConfigError, match="unknown arrival model 'poisson'") as exc:
        make_arrivals("poisson:rate=1")
    assert "lpc" in str(exc.value) and "sessions" in str(exc.value)
    with pytest.raises(ConfigError, match="has no parameter 'nope'") as exc:
        make_arrivals("lpc:nope=1")
    for name in ("lambda_chat", "n_conv", "session_rate_per_s", "decode_tokens_per_s"):
        assert name in str(exc.value)


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("lpc:lambda_chat=-1", "lambda_chat"),
        ("lpc:lambda_chat=0", "lambda_chat"),
        ("lpc:n_conv=0", "n_conv"),
        ("lpc:n_conv=2.5", "n_conv"),
        ("lpc:decode_tokens_per_s=0", "decode_tokens_per_s"),
        ("lpc:session_rate_per_s=-3", "session_rate_per_s"),
        ("sessions:session_rate_per_s=0", "session_rate_per_s"),
        ("sessions:gap_sigma=0", "gap_sigma"),
        ("sessions:preset=slow", "preset"),
        ("sessions:gap_mu=abc", "gap_mu"),
    ],
)
def test_make_arrivals_rejects_bad_values(spec: str, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        make_arrivals(spec)


@pytest.mark.parametrize(
    "spec", ["sessions:closed_loop=maybe", "lpc:closed_loop=1", "sessions:gap_sigma=inf"]
)
def test_arrival_spec_values_are_checked(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"closed_loop must be true or false|finite"):
        make_arrivals(spec)
