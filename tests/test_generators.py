"""Statistical checks of the seeded generators: parameters recovered from large samples."""

from __future__ import annotations

import numpy as np
import pytest

from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.generators.sessions import GAP_PRESETS


def _gaps(trace_session: list[str | None], arrival: np.ndarray) -> np.ndarray:
    by_session: dict[str | None, list[float]] = {}
    for s, t in zip(trace_session, arrival.tolist(), strict=True):
        by_session.setdefault(s, []).append(t)
    return np.concatenate([np.diff(np.sort(ts)) for ts in by_session.values() if len(ts) > 1])


@pytest.mark.parametrize("preset", ["chat", "agentic"])
def test_inter_turn_gaps_are_lognormal_with_the_preset(preset: str) -> None:
    tr = generate_sessions(
        num_sessions=3000, preset=preset, mean_turns=6, system_tokens=8, mean_user_tokens=4,
        mean_output_tokens=4, seed=21,
    )  # fmt: skip
    logs = np.log(_gaps(tr.session_id, tr.arrival_s))
    mu, sigma = GAP_PRESETS[preset]
    assert logs.size > 10_000
    assert logs.mean() == pytest.approx(mu, rel=0.05)
    assert logs.std() == pytest.approx(sigma, rel=0.05)


def test_session_starts_are_poisson_and_turns_geometric() -> None:
    rate, mean_turns = 2.0, 5.0
    tr = generate_sessions(
        num_sessions=4000, session_rate_per_s=rate, mean_turns=mean_turns, max_turns=1000,
        system_tokens=8, mean_user_tokens=4, mean_output_tokens=4, seed=5,
    )  # fmt: skip
    first = np.sort(tr.arrival_s[tr.turn == 0])
    inter = np.diff(first)
    assert inter.mean() == pytest.approx(1 / rate, rel=0.05)
    assert inter.std() == pytest.approx(1 / rate, rel=0.07)  # exponential: std == mean
    turns = np.bincount(np.unique(tr.session_id, return_counts=True)[1])
    num_turns = np.repeat(np.arange(turns.size), turns)
    assert num_turns.mean() == pytest.approx(mean_turns, rel=0.05)


def test_system_prompt_popularity_is_zipf() -> None:
    tr = generate_sessions(
        num_sessions=6000, num_system_prompts=4, system_zipf=1.0, system_tokens=16,
        mean_user_tokens=4, mean_output_tokens=4, mean_turns=1, max_turns=1, seed=8,
    )  # fmt: skip
    assert tr.input_tokens is not None
    vals, offs = tr.input_tokens
    heads = [tuple(vals[offs[i] : offs[i] + 16].tolist()) for i in range(len(tr))]
    _, counts = np.unique(np.array(heads), axis=0, return_counts=True)
    shares = np.sort(counts)[::-1] / counts.sum()
    want = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / sum([1, 1 / 2, 1 / 3, 1 / 4])
    assert np.abs(shares - want).max() < 0.02
