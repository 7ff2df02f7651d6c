"""A results folder's summary: each (variant, capacity, policy) averaged over its seeds,
with the spread, as a table any front end can draw (:class:`Summary`).

Every study kind says what its summary is (:attr:`prefixlab.studies.StudyKind.summary`);
the command line draws it (``prefixlab sweep``), the same way for every kind.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: a table row: column name -> value (str, int, float, bool or None)
Row = dict[str, object]

#: how a column's values are written (the front end maps each to a format)
FORMS = ("text", "count", "ratio", "percent", "secs")


@dataclass(frozen=True, slots=True)
class Column:
    """One column: the row key, its header and how its values are written (:data:`FORMS`:
    ``text`` left-aligned, ``count`` with thousands separators, ``ratio`` four decimals,
    ``percent`` one decimal, ``secs`` at most six characters)."""

    key: str
    header: str
    form: str = "text"


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary table: its title, columns and rows; a section per value of ``group``;
    the best value of ``best`` in each section marked (the highest, or the lowest with
    ``lower_is_better``), among the rows that are not bounds (rows whose ``bound`` key is
    true, such as an offline optimum, are shown but never marked)."""

    title: str
    columns: tuple[Column, ...]
    rows: list[Row]
    group: tuple[str, ...] = ()
    best: str | None = None
    lower_is_better: bool = False
    bound: str | None = None

    def best_rows(self) -> set[int]:
        """Indices of the rows holding their section's best value of ``best``."""
        if self.best is None:
            return set()
        top: dict[tuple[object, ...], float] = {}
        sign = -1.0 if self.lower_is_better else 1.0
        contenders = [
            (i, r) for i, r in enumerate(self.rows) if self.bound is None or not r[self.bound]
        ]
        for _, r in contenders:
            v = number(r[self.best])
            if not math.isnan(v):
                key = self.section(r)
                top[key] = max(top.get(key, -math.inf), sign * v)
        return {
            i
            for i, r in contenders
            if sign * number(r[self.best]) == top.get(self.section(r), math.nan)
        }

    def section(self, row: Row) -> tuple[object, ...]:
        return tuple(row[k] for k in self.group)


def number(value: object) -> float:
    """A value as a float (NaN for None or a non-number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def mean(values: Iterable[object]) -> float:
    """The mean of the values that are numbers (NaN if none)."""
    vals = [v for v in map(number, values) if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def sd(values: Iterable[object]) -> float:
    """The sample standard deviation over seeds (NaN for fewer than two values)."""
    vals = [v for v in map(number, values) if not math.isnan(v)]
    if len(vals) < 2:
        return math.nan
    return statistics.stdev(vals)


def over_seeds(
    rows: Iterable[Row],
    key: Callable[[Row], Hashable],
    keep: Iterable[str],
    metrics: Iterable[str],
) -> list[Row]:
    """One row per ``key`` (in first-seen order): the ``keep`` columns of its first row,
    ``seeds`` (how many rows), and for each metric its mean and ``METRIC_sd``."""
    groups: dict[Hashable, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    keep, metrics = list(keep), list(metrics)
    out = []
    for group in groups.values():
        rec: Row = {k: group[0][k] for k in keep}
        rec["seeds"] = len(group)
        for col in metrics:
            rec[col] = mean(r[col] for r in group)
            rec[f"{col}_sd"] = sd(r[col] for r in group)
        out.append(rec)
    return out


#: columns the summary averages over seeds (and gives the spread of, ``_sd``)
SUMMARY_MEANS = (
    "token_hit_ratio",
    "request_hit_ratio",
    "flops_saved_ratio",
    "mean_ttft_s",
    "p50_ttft_s",
    "p95_ttft_s",
    "p99_ttft_s",
    "mean_prefill_s",  # averaged too; the printed table leaves it out (80 columns)
)


def summary_rows(rows: list[Row]) -> list[Row]:
    """Mean and sample standard deviation (``COLUMN_sd``) over seeds of each (variant,
    capacity, policy), in plan order."""
    out = over_seeds(
        rows,
        lambda r: (r["variant"], r["capacity_index"], r["policy_index"]),
        ("variant", "capacity", "capacity_index", "policy", "runner"),
        ("capacity_blocks", *SUMMARY_MEANS),
    )
    for rec in out:  # the same for every seed but with a sampled trace
        rec["capacity_blocks"] = round(number(rec["capacity_blocks"]))
        del rec["capacity_blocks_sd"]
    return out


def _columns(rows: list[Row]) -> tuple[Column, ...]:
    """The columns the rows have values for."""
    cols: list[Column] = []
    if any(r["variant"] for r in rows):
        cols.append(Column("variant", "workload"))
    cols.append(Column("capacity", "capacity"))
    if any(number(r["capacity_blocks"]) >= 0 for r in rows):  # the hybrid cache: bytes only
        cols.append(Column("capacity_blocks", "blocks", "count"))
    cols += [Column("policy", "policy"), Column("token_hit_ratio", "token hit", "ratio")]
    if max(number(r["seeds"]) for r in rows) > 1:
        cols.append(Column("token_hit_ratio_sd", "± sd", "ratio"))
    cols.append(Column("request_hit_ratio", "req hit", "ratio"))
    if any(not math.isnan(number(r["flops_saved_ratio"])) for r in rows):
        cols.append(Column("flops_saved_ratio", "FLOPs saved", "percent"))
    if any(r["runner"] == "engine" for r in rows):
        cols += [
            Column("mean_ttft_s", "TTFT mean s", "secs"),
            Column("p50_ttft_s", "TTFT P50 s", "secs"),
            Column("p95_ttft_s", "TTFT P95 s", "secs"),
            Column("p99_ttft_s", "TTFT P99 s", "secs"),
        ]
    return tuple(cols)


def experiment_summary(folder: Path) -> Summary:
    """An experiment's answer: hit ratios, FLOPs saved and (engine) latency per capacity
    and policy, with the spread of the token hit ratio over seeds; the best token hit
    ratio of each (variant, capacity) marked."""
    from prefixlab.experiments.store import read_json, read_table

    rows = summary_rows(read_table(folder).to_pylist())
    name = str(read_json(folder, "config.resolved.json").get("name", folder.name))
    seeds = max(int(number(r["seeds"])) for r in rows)
    note = f" (mean and sd of {seeds} seeds)" if seeds > 1 else ""
    return Summary(
        f"{name}{note}",
        _columns(rows),
        rows,
        group=("variant", "capacity_index"),
        best="token_hit_ratio",
    )
