"""Summary statistics of a trace, including the infinite-cache hit ratio.

``infinite_cache_token_hit_ratio`` is the replay hit ratio with unbounded capacity (nothing
is ever evicted): the ceiling any policy can reach on this trace and block size.
"""

from __future__ import annotations

import numpy as np

from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.types import Row
from prefixlab.workload.trace import Trace

PERCENTILES = (5, 50, 95, 99)


def _percentiles(values: np.ndarray) -> dict[str, float]:
    out = {"mean": float(values.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(values, p))
    out["max"] = float(values.max())
    return out


def infinite_cache_token_hit_ratio(trace: Trace, block_tokens: int | None = None) -> float:
    """The replay token hit ratio with room for every block the trace ever holds."""
    unbounded = int(trace.block_layout(block_tokens).num_blocks_held.sum()) + 1
    config = ReplayConfig(capacity_blocks=unbounded, block_tokens=block_tokens)
    return float(replay(trace, "lru", config).metrics["token_hit_ratio"])


def trace_stats(trace: Trace, block_tokens: int | None = None) -> Row:
    """Requests, sessions, tasks, length percentiles, arrival span and the hit ceiling."""
    layout = trace.block_layout(block_tokens)
    sessions = {s for s in trace.session_id if s is not None}
    tasks: dict[str, int] = {}
    for t in trace.task:
        if t is not None:
            tasks[t] = tasks.get(t, 0) + 1
    return {
        "name": trace.name,
        "num_requests": len(trace),
        "num_sessions": len(sessions),
        "tasks": dict(sorted(tasks.items())),
        "form": "hash" if trace.is_hash_form else "token",
        "block_tokens": layout.block_tokens,
        "num_input_tokens": int(trace.input_length.sum()),
        "num_output_tokens": int(trace.output_length.sum()),
        "input_length": _percentiles(trace.input_length),
        "output_length": _percentiles(trace.output_length),
        "arrival_span_s": float(trace.arrival_s.max() - trace.arrival_s.min()),
        # what --request-rate would change: (requests - 1) / span (NaN: no span)
        "request_rate_per_s": trace.request_rate(),
        "num_distinct_blocks": layout.num_distinct_keys,
        "infinite_cache_token_hit_ratio": infinite_cache_token_hit_ratio(trace, block_tokens),
        "session_prefix_share": session_prefix_share(trace),
    }


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def session_prefix_share(trace: Trace) -> float | None:
    """Of the input tokens of every call but a session's first, the fraction that repeats the
    start of the session's previous call's sequence (its input, plus its output when known).

    This is what an agent or chat session offers a prefix cache from one call to the next
    (token form; hash form counts whole shared blocks). None without multi-call sessions.
    """
    vals: np.ndarray
    if trace.is_hash_form:
        assert trace.hash_ids is not None and trace.block_tokens is not None
        vals, offs = trace.hash_ids
        unit = trace.block_tokens
    else:
        vals, offs = trace.sequence_tokens()
        unit = 1
    last: dict[str, int] = {}
    shared = total = 0
    for r in np.argsort(trace.arrival_s, kind="stable").tolist():
        sid = trace.session_id[r]
        if sid is None:
            continue
        prev = last.get(sid)
        last[sid] = r
        if prev is None:
            continue
        common = _common_prefix(vals[offs[r] : offs[r + 1]], vals[offs[prev] : offs[prev + 1]])
        shared += min(common * unit, int(trace.input_length[r]))
        total += int(trace.input_length[r])
    return shared / total if total else None
