"""Summary statistics of a trace, including the infinite-cache hit ratio.

``infinite_cache_token_hit_ratio`` is the replay hit ratio with unbounded capacity (nothing
is ever evicted): the ceiling any policy can reach on this trace and block size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import Trace

PERCENTILES = (5, 50, 95, 99)


def _percentiles(values: np.ndarray) -> dict[str, float]:
    out = {"mean": float(values.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(values, p))
    out["max"] = float(values.max())
    return out


def trace_stats(trace: Trace, block_tokens: int | None = None) -> dict[str, Any]:
    """Requests, sessions, tasks, length percentiles, arrival span and the hit ceiling."""
    layout = trace.block_layout(block_tokens)
    # Room for every block the trace ever holds: nothing is evicted.
    unbounded = int(layout.num_blocks_held.sum()) + 1
    ceiling = replay(
        trace, "lru", ReplayConfig(capacity_blocks=unbounded, block_tokens=block_tokens)
    )
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
        "num_distinct_blocks": layout.num_distinct_keys,
        "infinite_cache_token_hit_ratio": ceiling.metrics["token_hit_ratio"],
    }
