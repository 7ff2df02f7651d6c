"""Results folders written before the TTFT rename (``ttft_s`` then meant first schedule to
first token, ``qttft_s`` arrival to first token) read under today's names everywhere: the
tables, SQL queries, and a resumed run that reuses the old cells."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.experiments.schema import (
    RENAMES,
    is_old,
    select_list,
    upgrade_names,
    upgrade_row,
    upgrade_table,
)
from prefixlab.experiments.store import query, read_table

runner = CliRunner()

ARGS = [
    "compare",
    "gen:sessions:num_sessions=6",
    *("-p", "lru", "-p", "fifo", "-c", "0.5ws", "--block-tokens", "16"),
    *("--runner", "engine", "--model", "llama-3.1-8b", "--gpu", "h100"),
    *("--timing", "power:preset=llama-3.1-8b-h100", "--timing", "tpot:s=0.02"),
    "--detail",
]
TABLES = ("results", "breakdown", "cdf", "requests")
OLD = {new: old for old, new in RENAMES.items()}


# ------------------------------------------------------------------ the renames
def test_an_old_row_swaps_its_two_ttft_names() -> None:
    old = {"policy": "lru", "mean_ttft_s": 0.2, "p5_ttft_s": 0.1, "mean_qttft_s": 3.0}
    assert upgrade_row(old) == {
        "policy": "lru",
        "mean_prefill_s": 0.2,
        "p5_prefill_s": 0.1,
        "mean_ttft_s": 3.0,
    }
    assert upgrade_names(["quantile", "ttft_s", "qttft_s"]) == ["quantile", "prefill_s", "ttft_s"]


def test_an_old_breakdown_row_is_old_without_a_qttft() -> None:
    # the old breakdown kept only the prefill-only figure, under the TTFT name
    assert upgrade_row({"group": "a", "mean_ttft_s": 0.5, "p95_ttft_s": 0.9}) == {
        "group": "a",
        "mean_prefill_s": 0.5,
        "p95_prefill_s": 0.9,
    }


@pytest.mark.parametrize(
    "names",
    [
        ["mean_ttft_s", "mean_prefill_s", "mean_queue_s"],  # today's
        ["quantile", "ttft_s", "prefill_s"],
        ["policy", "token_hit_ratio"],  # no latency at all (replay)
        [],
    ],
)
def test_new_names_are_left_alone(names: list[str]) -> None:
    assert not is_old(names)
    assert upgrade_names(names) == names
    table = pa.table({n: [1.0] for n in names}) if names else pa.table({})
    assert upgrade_table(table) is table


def test_the_sql_select_list_renames_old_columns_and_quotes_them() -> None:
    assert select_list(["a b", "mean_ttft_s", "mean_qttft_s"]) == (
        '"a b" as "a b", "mean_ttft_s" as "mean_prefill_s", "mean_qttft_s" as "mean_ttft_s"'
    )
    assert select_list(['x"y']) == '"x""y" as "x""y"'


# ------------------------------------------------------------------ an old folder
def _age(names: list[str], breakdown: bool = False) -> dict[str, str | None]:
    """New name -> its name in a folder written before the rename (None: it had none)."""
    out: dict[str, str | None] = {}
    for n in names:
        old: str | None = OLD.get(n, n)
        if "queue" in n or (n == "p5_ttft_s") or (breakdown and old and "qttft" in old):
            old = None  # no queue time, no P5 of QTTFT, no QTTFT in the breakdown
        out[n] = old
    return out


def _age_doc(path: Path) -> None:
    doc = json.loads(path.read_text())
    for key in ("row", "breakdown", "cdf"):
        rows = [doc[key]] if key == "row" else doc[key]
        aged = []
        for r in rows:
            names = _age(list(r), breakdown=key == "breakdown")
            aged.append({names[k]: v for k, v in r.items() if names[k] is not None})
        doc[key] = aged[0] if key == "row" else aged
    path.write_text(json.dumps(doc))


def _age_table(path: Path, breakdown: bool = False) -> None:
    t = pq.read_table(path)
    names = _age(t.column_names, breakdown)
    t = t.select([n for n in t.column_names if names[n] is not None])
    pq.write_table(t.rename_columns([str(names[n]) for n in t.column_names]), path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A results folder of today and the same folder as the old version wrote it."""
    base = tmp_path_factory.mktemp("schema")
    new, old = base / "new", base / "old"
    result = runner.invoke(app, [*ARGS, "--out", str(new)])
    assert result.exit_code == 0, result.output
    shutil.copytree(new, old)
    for cell in (old / "cells").glob("*.json"):
        _age_doc(cell)
    for req in (old / "cells").glob("*.requests.parquet"):
        _age_table(req)
    for name in TABLES:
        _age_table(old / f"{name}.parquet", breakdown=name == "breakdown")
    assert "mean_qttft_s" in pq.read_schema(old / "results.parquet").names
    return new, old


def _same(a: object, b: object) -> bool:
    return json.dumps(a) == json.dumps(b)  # NaN equals NaN


@pytest.mark.parametrize("name", TABLES)
def test_an_old_folder_reads_under_todays_names(folders: tuple[Path, Path], name: str) -> None:
    new, old = folders
    got, want = read_table(old, name).to_pylist(), read_table(new, name).to_pylist()
    assert len(got) == len(want)
    lost = {"mean_queue_s", "p95_queue_s", "queue_s", "p5_ttft_s"}
    if name == "breakdown":
        lost |= {"mean_ttft_s", "p95_ttft_s"}
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w) - lost
        assert all(_same(g[k], w[k]) for k in g), name
    if name != "breakdown":  # the arrival-to-first-token time is the old QTTFT
        assert any(r.get("mean_ttft_s", r.get("ttft_s")) != r.get("mean_prefill_s") for r in got)


def test_sql_over_an_old_folder_uses_todays_names(folders: tuple[Path, Path]) -> None:
    new, old = folders
    sql = "select policy, mean_ttft_s, p95_ttft_s, mean_prefill_s from results order by policy"
    assert query(old, sql) == query(new, sql)
    sql = "select quantile, ttft_s, prefill_s from cdf order by cell_id, quantile"
    assert query(old, sql) == query(new, sql)


def test_sql_naming_qttft_says_what_it_is_called_now(folders: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="QTTFT is ttft_s now"):
        query(folders[0], "select mean_qttft_s from results")


def test_resuming_an_old_folder_reuses_its_cells_under_todays_names(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    new, old = folders
    resumed = tmp_path / "resumed"
    shutil.copytree(old, resumed)
    result = runner.invoke(app, [*ARGS, "--out", str(resumed)])
    assert result.exit_code == 0, result.output
    assert "2 cells: 0 run, 2 already done" in " ".join(result.output.split())
    raw = pq.read_table(resumed / "results.parquet").to_pylist()  # consolidated again
    want = pq.read_table(new / "results.parquet").to_pylist()
    for g, w in zip(raw, want, strict=True):
        for k in ("mean_ttft_s", "p99_ttft_s", "mean_prefill_s", "p5_prefill_s"):
            assert _same(g[k], w[k]), k
        assert g["mean_queue_s"] is None or math.isnan(g["mean_queue_s"])  # never stored
        assert g["mean_ttft_s"] > g["mean_prefill_s"]
    detail = pq.read_table(resumed / "requests.parquet")
    assert "qttft_s" not in detail.column_names
    assert detail.column("ttft_s").to_pylist() == read_table(new, "requests")["ttft_s"].to_pylist()
