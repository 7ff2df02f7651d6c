"""Study kinds (prefixlab.studies): one registry tells results folders apart and writes
their report and figures, for every kind, through one call."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict, cast

import pytest

from prefixlab import studies
from prefixlab.configfile import ConfigModel, validate
from prefixlab.errors import ConfigError
from prefixlab.experiments import parse_config, run_sweep
from prefixlab.experiments.config import ExperimentConfig
from prefixlab.experiments.store import CellStore
from prefixlab.experiments.study import Study
from prefixlab.experiments.summary import Column, Summary, over_seeds
from prefixlab.experts.config import ExpertSweepConfig, parse_sweep_config
from prefixlab.experts.sweep import run_expert_sweep
from prefixlab.studies import (
    AnyStudy,
    StudyKind,
    build_report,
    get_kind,
    kind_of,
    kinds,
    register_kind,
    write_plots,
)
from prefixlab.types import Row
from tests.tables import table as table_of


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("studies")
    exp = parse_config(
        {
            "name": "tiny",
            "workload": {"source": "gen:sessions", "params": {"num_sessions": 6}},
            "cache": {"capacities": [1000, 4000]},
            "policies": ["lru", "fifo"],
        }
    )
    run_sweep(exp, root / "tiny")
    experts = parse_sweep_config(
        {
            "name": "zipf",
            "workload": {
                "trace": "gen:zipf",
                "params": {"num_layers": 2, "num_experts": 3, "num_tokens": 20},
            },
            "cache": {"capacities": [2, 4], "policies": ["lru", "opt"]},
        }
    )
    run_expert_sweep(experts, root / "zipf")
    return {"experiment": root / "tiny", "experts": root / "zipf"}


def test_the_kinds_and_their_config_models() -> None:
    assert list(kinds()) == ["experiment", "experts"]
    assert get_kind("experiment").config is ExperimentConfig
    assert get_kind("experts").config is ExpertSweepConfig
    with pytest.raises(
        ConfigError, match="unknown config kind 'fleet'; known: experiment, experts"
    ):
        get_kind("fleet")


def test_a_folder_is_told_by_its_resolved_config(folders: dict[str, Path]) -> None:
    for name, folder in folders.items():
        assert kind_of(folder).name == name
        assert kind_of(folder / "results.parquet").name == name  # a file: its folder


@pytest.mark.parametrize("name", ["experiment", "experts"])
def test_one_call_reports_and_plots_every_kind(
    folders: dict[str, Path], tmp_path: Path, name: str
) -> None:
    folder = folders[name]
    page = build_report(folder, tmp_path / f"{name}.html")
    html = page.read_text(encoding="utf-8")
    assert page == tmp_path / f"{name}.html" and html.startswith("<!DOCTYPE html>")
    # the kind's own report: expert sweeps show faults against OPT, experiments hit ratios
    assert ("faults / OPT" in html) == (name == "experts")
    pngs = write_plots(folder, tmp_path / "png")
    assert pngs and all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)
    assert {p.stem for p in pngs} == {s.slug for s in get_kind(name).figures(folder)}


# ------------------------------------------------------------------ a kind plugs in
class ToyConfig(ConfigModel):
    """A study of squares: a cell per (number, seed), its result ``n * n + seed``."""

    name: str = "toy"
    kind: Literal["toy"] = "toy"
    numbers: list[int]
    seeds: list[int] = [0]


@dataclass(frozen=True, slots=True)
class ToyCell:
    n: int
    seed: int

    @property
    def cell_id(self) -> str:
        return f"n{self.n}-s{self.seed}"

    def label(self) -> str:
        return f"n={self.n}"


class ToyDoc(TypedDict):
    rows: list[Row]


def toy_task(payload: object, cell: ToyCell) -> dict[str, object]:
    assert isinstance(payload, ToyConfig)
    return {"rows": [{"n": cell.n, "seed": cell.seed, "square": cell.n * cell.n + cell.seed}]}


class ToyStudy(Study[ToyCell, dict[str, object], CellStore]):
    config: ToyConfig

    def plan(self) -> list[ToyCell]:
        return [ToyCell(n, s) for n in self.config.numbers for s in self.config.seeds]

    def store(self, folder: Path) -> CellStore:
        return CellStore(folder)

    def check(self, todo: list[ToyCell]) -> None:
        if any(c.n < 0 for c in todo):
            raise ConfigError("numbers: expected non-negative numbers")

    def task(self) -> tuple[Callable[[object, ToyCell], dict[str, object]], object]:
        return toy_task, self.config

    def save(self, store: CellStore, result: dict[str, object], cell: ToyCell) -> None:
        store.write_cell(cell.cell_id, result)

    def consolidate(self, store: CellStore, cells: list[ToyCell]) -> dict[str, Path]:
        rows = [row for c in cells for row in store.read_cell(c.cell_id, ToyDoc)["rows"]]
        return store.write_tables({"results": rows}, [{"cell_id": c.cell_id} for c in cells])


def toy_summary(folder: Path) -> Summary:
    import pyarrow.parquet as pq

    rows = over_seeds(
        pq.read_table(folder / "results.parquet").to_pylist(),
        lambda r: r["n"],
        ("n",),
        ("square",),
    )
    cols = (Column("n", "n", "count"), Column("square", "square", "ratio"))
    return Summary("squares", (*cols, Column("square_sd", "± sd", "ratio")), rows, best="square")


def toy_report(folder: Path, out: Path | None) -> Path:
    path = out or folder / "report.html"
    path.write_text("<html>squares</html>", encoding="utf-8")
    return path


def toy_kind() -> StudyKind:
    return StudyKind(
        "toy",
        "squares",
        ToyConfig,
        lambda data, name: validate(ToyConfig, data),
        lambda cfg, detail: cast(AnyStudy, ToyStudy(cfg)),
        toy_summary,
        toy_report,
        lambda folder: [],
    )


@pytest.fixture()
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(studies, "_KINDS", dict(studies._KINDS))  # registered for this test
    register_kind("toy", toy_kind)


@pytest.mark.usefixtures("toy")
def test_a_registered_kind_runs_through_sweep_with_nothing_else(tmp_path: Path) -> None:
    """``prefixlab sweep``, resume, the store, the summary table and the report serve a
    kind the engine has never heard of: registering it is all it takes."""
    from typer.testing import CliRunner

    from prefixlab.cli.main import app

    config = tmp_path / "toy.toml"
    config.write_text('kind = "toy"\nnumbers = [1, 2, 3]\nseeds = [0, 2]\n', encoding="utf-8")
    out = tmp_path / "out"
    run = CliRunner().invoke(app, ["sweep", str(config), "-o", str(out)])
    assert run.exit_code == 0, run.output
    shown = {r["n"]: r for r in table_of(run.stdout)}
    # the mean and sd over seeds 0 and 2 of n*n + seed: n*n + 1 and sqrt(2)
    assert {n: r["square"] for n, r in shown.items()} == {
        "1": "2.0000",
        "2": "5.0000",
        "3": "10.0000",
    }
    assert {r["± sd"] for r in shown.values()} == {f"{2**0.5:.4f}"}
    assert "6 cells: 6 run, 0 already done" in run.stdout
    assert kind_of(out).name == "toy"
    assert (out / "report.html").read_text(encoding="utf-8") == "<html>squares</html>"
    # resume: a lost cell runs again, the others are kept
    (out / "cells" / "n2-s2.json").unlink()
    again = CliRunner().invoke(app, ["sweep", str(config), "-o", str(out)])
    assert "6 cells: 1 run, 5 already done" in again.stdout
    # the kind's check runs before any cell, through the same one-line error path
    config.write_text('kind = "toy"\nnumbers = [-1]\n', encoding="utf-8")
    bad = CliRunner().invoke(app, ["sweep", str(config), "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "numbers: expected non-negative numbers" in bad.output
    assert not list((tmp_path / "bad" / "cells").glob("*.json"))


@pytest.mark.usefixtures("toy")
def test_a_kind_registered_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="study kind 'toy' is registered already"):
        register_kind("toy", toy_kind)


def test_the_summary_marks_each_sections_best_lower_or_higher() -> None:
    rows: list[dict[str, object]] = [
        {"g": "a", "v": 0.5},
        {"g": "a", "v": 0.2},
        {"g": "b", "v": math.nan},
        {"g": "b", "v": 0.9},
        {"g": "b", "v": 0.9},
    ]
    cols = (Column("g", "g"), Column("v", "v", "ratio"))
    assert Summary("t", cols, rows, group=("g",), best="v").best_rows() == {0, 3, 4}
    low = Summary("t", cols, rows, group=("g",), best="v", lower_is_better=True)
    assert low.best_rows() == {1, 3, 4}
    assert Summary("t", cols, rows, best="v").best_rows() == {3, 4}
    assert Summary("t", cols, rows).best_rows() == set()
    # a bound (an offline optimum) is shown but never the best
    for r, b in zip(rows, (False, True, False, False, False), strict=True):
        r["bound"] = b
    low = Summary("t", cols, rows, group=("g",), best="v", lower_is_better=True, bound="bound")
    assert low.best_rows() == {0, 3, 4}


def test_over_seeds_keeps_first_seen_order_and_gives_the_sample_sd() -> None:
    rows: list[dict[str, object]] = [
        {"k": 2, "x": 1.0},
        {"k": 1, "x": 4.0},
        {"k": 2, "x": 3.0},
        {"k": 1, "x": None},
    ]
    out = over_seeds(rows, lambda r: r["k"], ("k",), ("x",))
    assert [r["k"] for r in out] == [2, 1]
    assert out[0] == {"k": 2, "seeds": 2, "x": 2.0, "x_sd": math.sqrt(2)}
    assert out[1]["x"] == 4.0 and math.isnan(float(str(out[1]["x_sd"])))
