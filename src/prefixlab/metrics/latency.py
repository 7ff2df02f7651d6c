"""Latency metrics of the engine runner (DESIGN §5), from per-request times.

* TTFT: arrival -> first token, queueing included (vLLM's ``time_to_first_token``; the
  QTTFT of UniCache's tables);
* prefill: first scheduled -> first token, preemptions included (vLLM's ``prefill_time``);
* queue: arrival -> first scheduled (vLLM's ``queued_time``);
* TPOT: (finish - first token) / (output tokens - 1), requests with >= 2 output tokens;
* end-to-end: arrival -> finish;
* throughput: output tokens / makespan (``total_throughput_tokens_per_s`` counts input
  tokens too); makespan: first arrival -> last finish.

Each latency gets mean, P5, P50, P95 and P99; every metric can be broken down by task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from prefixlab.types import B1, F64, I64

PERCENTILES = (5, 50, 95, 99)


def describe(values: F64, name: str) -> dict[str, float]:
    """``mean_<name>``, ``p5_<name>`` ... ``p99_<name>`` (NaN-free values only)."""
    v = values[~np.isnan(values)]
    if not v.shape[0]:
        return {f"mean_{name}": float("nan"), **{f"p{p}_{name}": float("nan") for p in PERCENTILES}}
    out = {f"mean_{name}": float(v.mean())}
    qs = np.percentile(v, PERCENTILES)
    out.update({f"p{p}_{name}": float(q) for p, q in zip(PERCENTILES, qs, strict=True)})
    return out


def latency_summary(
    arrival_s: F64,
    scheduled_s: F64,
    first_token_s: F64,
    finish_s: F64,
    input_tokens: I64,
    output_tokens: I64,
    rows: B1 | None = None,
) -> dict[str, float]:
    """The latency and throughput figures of the requests selected by ``rows``."""
    sel = np.ones(arrival_s.shape[0], dtype=bool) if rows is None else rows
    a, s, f, e = arrival_s[sel], scheduled_s[sel], first_token_s[sel], finish_s[sel]
    out_tok = output_tokens[sel]
    multi = out_tok >= 2
    tpot = np.full(a.shape[0], np.nan)
    tpot[multi] = (e[multi] - f[multi]) / (out_tok[multi] - 1)
    out: dict[str, float] = {}
    out.update(describe(f - a, "ttft_s"))
    out.update(describe(f - s, "prefill_s"))
    out.update(describe(s - a, "queue_s"))
    out.update(describe(tpot, "tpot_s"))
    out.update(describe(e - a, "e2e_s"))
    makespan = float(e.max() - a.min()) if a.shape[0] else 0.0
    out["makespan_s"] = makespan
    out["throughput_tokens_per_s"] = float(out_tok.sum()) / makespan if makespan > 0 else 0.0
    total = float(out_tok.sum() + input_tokens[sel].sum())
    out["total_throughput_tokens_per_s"] = total / makespan if makespan > 0 else 0.0
    return out


def by_task(
    tasks: Sequence[str | None], compute: Callable[[B1], dict[str, float]]
) -> dict[str, dict[str, float]]:
    """``compute(rows)`` for each task label's requests (label ``-`` for none)."""
    labels = np.array([t if t is not None else "-" for t in tasks], dtype=object)
    return {str(t): compute(labels == t) for t in sorted(set(labels.tolist()))}


#: the share of the requests, by arrival, whose waits are compared (first and last)
TENTH = 0.1


def overload(arrival_s: F64, scheduled_s: F64, first_token_s: F64, finish_s: F64) -> str | None:
    """A warning with the numbers when the offered load outran the simulated hardware, so
    the queue grew while requests arrived and the latencies describe that queue, not the
    policy; None otherwise.

    Overloaded means both: the requests were served (first arrival to last finish) at
    under 90% of the rate they arrived at, and the wait before prefill of the last tenth of
    arrivals is over ten times that of the first tenth, and over ten times the median
    prefill (a queue that grew, not a burst served as it came)."""
    n = int(arrival_s.shape[0])
    if n < 20:
        return None
    order = np.argsort(arrival_s, kind="stable")
    a, w = arrival_s[order], (scheduled_s - arrival_s)[order]
    span = float(a[-1] - a[0])
    done = float(finish_s.max() - a[0])
    if span <= 0 or done <= 0:
        return None
    offered, served = (n - 1) / span, n / done
    k = max(1, int(n * TENTH))
    first, last = float(w[:k].mean()), float(w[-k:].mean())
    prefill = float(np.median(first_token_s - scheduled_s))
    if served >= 0.9 * offered or last <= 10 * max(first, prefill):
        return None
    return (
        f"overloaded: requests arrive at {offered:,.3g}/s but were served at {served:,.3g}/s; "
        f"the wait before prefill grew from {first:,.3g} s (first tenth of arrivals) to "
        f"{last:,.3g} s (last tenth), so latencies measure a queue that never drained. "
        "Lower the load (--time-scale, --request-rate) or add capacity"
    )
