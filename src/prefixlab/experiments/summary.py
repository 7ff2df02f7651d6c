"""A results folder's summary: each (variant, capacity, policy) averaged over its seeds."""

from __future__ import annotations

import math
import statistics
from typing import Any


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def _sd(values: list[float]) -> float:
    """The sample standard deviation over seeds (NaN for fewer than two)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if len(vals) < 2:
        return math.nan
    return statistics.stdev(vals)


#: columns the summary averages over seeds (and gives the spread of, ``_sd``)
SUMMARY_MEANS = (
    "token_hit_ratio",
    "request_hit_ratio",
    "flops_saved_ratio",
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_qttft_s",
)


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sample standard deviation (``COLUMN_sd``) over seeds of each (variant,
    capacity, policy), in plan order."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["variant"], row["capacity_index"], row["policy_index"])
        groups.setdefault(key, []).append(row)
    out = []
    for group in groups.values():
        first = group[0]
        rec = {k: first[k] for k in ("variant", "capacity", "capacity_index", "policy", "runner")}
        rec["capacity_blocks"] = round(_mean([r["capacity_blocks"] for r in group]))
        rec["seeds"] = len(group)
        for col in SUMMARY_MEANS:
            rec[col] = _mean([r[col] for r in group])
            rec[f"{col}_sd"] = _sd([r[col] for r in group])
        out.append(rec)
    return out
