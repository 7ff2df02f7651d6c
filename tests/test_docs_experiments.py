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

from prefixlab.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "experiments.md"


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip().startswith("prefixlab ")]  # fmt: skip


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
