"""Study kinds (prefixlab.studies): one registry tells results folders apart and writes
their report and figures, for every kind, through one call."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixlab.errors import ConfigError
from prefixlab.experiments import parse_config, run_sweep
from prefixlab.experiments.config import ExperimentConfig
from prefixlab.experts.config import ExpertSweepConfig, parse_sweep_config
from prefixlab.experts.sweep import run_expert_sweep
from prefixlab.studies import build_report, get_kind, kind_of, kinds, write_plots


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
