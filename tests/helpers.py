"""Helpers several test files share (compare traces; count overlapping intervals)."""

from __future__ import annotations

import numpy as np

from prefixlab.workload.trace import Trace


def assert_identical(a: Trace, b: Trace) -> None:
    """Every column equal, floats bit for bit (NaN think times included)."""
    assert len(a) == len(b)
    assert a.arrival_s.tobytes() == b.arrival_s.tobytes()
    assert a.think_s.tobytes() == b.think_s.tobytes()
    for col in ("input_length", "output_length", "turn"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    for col in ("session_id", "task", "prompt_text", "extra_key"):
        assert getattr(a, col) == getattr(b, col), col
    assert (a.input_tokens is None) == (b.input_tokens is None)
    if a.input_tokens is not None and b.input_tokens is not None:
        for x, y in zip(a.input_tokens, b.input_tokens, strict=True):
            assert np.array_equal(x, y)
    assert (a.output_tokens is None) == (b.output_tokens is None)
    if a.output_tokens is not None and b.output_tokens is not None:
        for x, y in zip(a.output_tokens, b.output_tokens, strict=True):
            assert np.array_equal(x, y)


def content_equal(a: Trace, b: Trace) -> bool:
    """Same requests, same order (Request objects compared field by field)."""
    return len(a) == len(b) and list(a) == list(b)


def half_open_peak(starts: list[float], ends: list[float]) -> int:
    """Peak of active intervals [start, end): at a tie an end is processed before a start."""
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    active = best = 0
    for _, delta in events:
        active += delta
        best = max(best, active)
    return best
