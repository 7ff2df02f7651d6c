"""Latency metrics of the engine runner (DESIGN §5), from per-request times.

* TTFT: prefill start (first scheduled) -> first token;
* QTTFT: arrival -> first token (queueing included);
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
    ttft = f - s
    qttft = f - a
    multi = out_tok >= 2
    tpot = np.full(a.shape[0], np.nan)
    tpot[multi] = (e[multi] - f[multi]) / (out_tok[multi] - 1)
    out: dict[str, float] = {}
    out.update(describe(ttft, "ttft_s"))
    out.update(describe(qttft, "qttft_s"))
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
