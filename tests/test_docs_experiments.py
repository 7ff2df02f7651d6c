"""docs/experiments.md: every `prefixlab` command in its bash blocks runs, in order, in a
scratch folder (later commands read the results earlier ones wrote)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "experiments.md"


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith("prefixlab ")
    ]


def test_page_commands_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("duckdb")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    cmds = _commands()
    assert any(c.startswith("prefixlab sweep") for c in cmds)
    assert any(c.startswith("prefixlab results query") for c in cmds)
    for cmd in cmds:
        args = [str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(cmd)[1:]]
        if args[0] == "sweep":
            args.append("--quiet")
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{cmd}\n{result.output}"
    # what the page promises about the folders it made
    study = tmp_path / "results" / "mixed-study"
    rows = pq.read_table(study / "results.parquet").to_pylist()
    assert len(rows) == 3 * 4 * 2
    assert (study / "report.html").is_file() and (study / "plots").is_dir()
    assert os.listdir(study / "plots")
    compare = pq.read_table(tmp_path / "results" / "compare-sessions" / "results.parquet")
    assert compare.num_rows == 3 * 2


MARCONI = ROOT / "docs" / "marconi.md"


def test_marconi_page_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```bash\n(.*?)```", MARCONI.read_text(), flags=re.S)
    cmds = [
        ln.strip() for b in blocks for ln in b.splitlines() if ln.strip().startswith("prefixlab ")
    ]
    assert len(cmds) >= 3
    runner = CliRunner()
    for cmd in cmds:
        args = [str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(cmd)[1:]]
        if args[0] == "sweep":
            args += ["--quiet", "--no-report"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{cmd}\n{result.output}"
    # the table on the page is the sweep's: Marconi alpha=1 at 10 GB on the mixed workload
    rows = pq.read_table(tmp_path / "results" / "marconi-mixed" / "results.parquet").to_pylist()
    got = next(r for r in rows if r["policy"] == "marconi:alpha=1" and r["capacity"] == "10GB")
    assert f"{got['token_hit_ratio']:.3f}" == "0.592"
    assert "| 10 | 0.212 | 0.608 | 0.617 | 0.592 | 2.9x | +1.5% |" in MARCONI.read_text()


def test_lpc_page_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sklearn")
    monkeypatch.chdir(tmp_path)
    page = ROOT / "docs" / "lpc.md"
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
    cmds = [
        ln.strip() for b in blocks for ln in b.splitlines() if ln.strip().startswith("prefixlab ")
    ]
    assert [c.split()[1] for c in cmds] == ["lpc", "lpc", "replay"]
    runner = CliRunner()
    for cmd in cmds:
        result = runner.invoke(app, shlex.split(cmd)[1:])
        assert result.exit_code == 0, f"{cmd}\n{result.output}"
    assert (tmp_path / "lpc-model.npz").is_file()
