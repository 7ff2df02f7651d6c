"""Helpers several test files share (compare traces; count overlapping intervals; the tiny
models of the hybrid cache tests, described in test_hybrid.py)."""

from __future__ import annotations

import numpy as np

from prefixlab.model.spec import ModelSpec
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


#: the hybrid cache tests' tiny models (test_hybrid.py's docstring counts their bytes)
HYB = ModelSpec(
    "tiny-hybrid",
    hidden_size=2,
    num_attention_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=1,
    num_ssm_layers=1,
    ssm_d_inner=1,
    ssm_d_state=2,
    ssm_conv_kernel=2,
)
TF = ModelSpec(
    "tiny-transformer",
    hidden_size=2,
    num_attention_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=1,
)
KV = 4  # bytes per token, both models
ST = 8  # bytes per checkpoint, HYB
