"""Latency names of stored results, old and new, so a results folder written before the
rename reads under today's names.

Before this version, ``ttft_s`` meant first scheduled -> first token and ``qttft_s``
arrival -> first token. Today ``ttft_s`` is arrival -> first token (what serving engineers
and vLLM's ``time_to_first_token`` mean), ``prefill_s`` is first scheduled -> first token
(vLLM's ``prefill_time``) and ``qttft_s`` is gone. Cell ids do not depend on metric names,
so a resumed old folder reuses its cells: every read of stored results goes through
:func:`upgrade_names` (cell files, per-request Parquet, consolidated tables, SQL views),
or a prefill-only figure would show up under ``mean_ttft_s``. Nothing on disk is rewritten
on read; a resumed run consolidates new tables under the new names.

A set of columns is old when it names a TTFT and no prefill time: every table written
today carries both (the breakdown, the CDF, the request detail and the result rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

#: the statistics a latency is described by in stored rows
STATS = ("mean", "p5", "p50", "p95", "p99")


def _renames() -> dict[str, str]:
    out = {"ttft_s": "prefill_s", "qttft_s": "ttft_s"}
    for s in STATS:
        out[f"{s}_ttft_s"] = f"{s}_prefill_s"
        out[f"{s}_qttft_s"] = f"{s}_ttft_s"
    return out


#: old column name -> new, applied all at once (the two TTFT names swap meaning)
RENAMES = _renames()

V = TypeVar("V")


def is_old(names: Iterable[str]) -> bool:
    """Whether columns ``names`` are in the old latency naming."""
    names = list(names)
    return any("ttft_s" in n for n in names) and not any(n.endswith("prefill_s") for n in names)


def upgrade_names(names: Iterable[str]) -> list[str]:
    """``names`` under today's latency names (unchanged when they already are)."""
    names = list(names)
    return [RENAMES.get(n, n) for n in names] if is_old(names) else names


def upgrade_row(row: Mapping[str, V]) -> dict[str, V]:
    """A stored row (a dict) under today's names, the values untouched."""
    return dict(zip(upgrade_names(row), row.values(), strict=True))


def upgrade_table(table: pa.Table) -> pa.Table:
    """A stored table under today's names (the same table when already new)."""
    names = upgrade_names(table.column_names)
    return table if names == table.column_names else table.rename_columns(names)


def select_list(names: Iterable[str]) -> str:
    """A DuckDB select list reading columns ``names`` under today's names."""
    names = list(names)
    return ", ".join(
        f"{_quote(old)} as {_quote(new)}"
        for old, new in zip(names, upgrade_names(names), strict=True)
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
