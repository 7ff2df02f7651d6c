"""The sessions generator (workload/generators/sessions.py) through open_trace (gen: sources):
deterministic, multi-turn, bad parameters."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.errors import ConfigError
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.sources import open_trace

runner = CliRunner()


# ---------------------------------------------------------------- generator + sources
def test_sessions_generator_deterministic_and_multi_turn() -> None:
    a = generate_sessions(num_sessions=20, seed=3)
    b = open_trace("gen:sessions:num_sessions=20,seed=3")
    assert a.input_tokens is not None and b.input_tokens is not None
    assert np.array_equal(a.input_tokens[0], b.input_tokens[0])
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.all(np.diff(a.arrival_s) >= 0)
    # Turn k+1's input starts with turn k's input and output.
    by_session: dict[str | None, list[int]] = {}
    for i in range(len(a)):
        by_session.setdefault(a.session_id[i], []).append(i)
    checked = 0
    for idx in by_session.values():
        for prev, nxt in itertools.pairwise(idx):
            p, n = a[prev], a[nxt]
            assert p.input_tokens is not None and p.output_tokens is not None
            history = list(p.input_tokens) + list(p.output_tokens)
            assert list(n.input_tokens or [])[: len(history)] == history
            assert n.turn == p.turn + 1
            checked += 1
    assert checked > 10
    c = generate_sessions(num_sessions=20, seed=4)
    assert c.input_tokens is not None
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_generator_bad_parameters() -> None:
    with pytest.raises(ConfigError, match="no parameter 'sesions'"):
        open_trace("gen:sessions:sesions=3")
    with pytest.raises(ConfigError, match="preset"):
        generate_sessions(preset="video")
    with pytest.raises(ConfigError, match="unknown generator"):
        open_trace("gen:nothing")
