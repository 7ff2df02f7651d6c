"""``prefixlab reproduce``: every reproduction runs at ci scale, and its table equals the
checked-in one (``tests/reproductions/<name>.csv``); the outputs are complete and stable.

After a deliberate change, refresh a table with
``prefixlab reproduce NAME --scale ci -o /tmp/r && cp /tmp/r/NAME/table.csv
tests/reproductions/NAME.csv``, and say why in the commit.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.reproduce import Claim, get_reproduction, reproductions, write_outcome
from prefixlab.reproduce.base import fmt_cell, to_csv

CHECKED = Path(__file__).resolve().parent / "reproductions"
NAMES = sorted(reproductions())


def test_every_reproduction_has_a_checked_table() -> None:
    assert NAMES
    assert sorted(p.stem for p in CHECKED.glob("*.csv")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_ci_table_equals_the_checked_in_one(name: str, tmp_path: Path) -> None:
    rep = get_reproduction(name)
    assert rep.paper and rep.target and rep.title
    outcome = rep.run("ci")
    written = write_outcome(rep, outcome, "ci", tmp_path)
    assert {p.name for p in written} >= {"table.csv", "table.md", "claims.csv", "claims.md"}
    assert (tmp_path / name / "table.csv").read_text() == (CHECKED / f"{name}.csv").read_text()
    assert outcome.claims and outcome.notes
    for claim in outcome.claims:  # every difference says why
        assert claim.verdict in ("agree", "differ", "n/a")
        assert claim.verdict != "differ" or claim.why
    if outcome.figure is not None:
        png = (tmp_path / name / "figure.png").read_bytes()
        assert png.startswith(b"\x89PNG")


def test_cli_lists_and_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["reproduce", "--json"])
    assert res.exit_code == 0
    import json

    assert [r["name"] for r in json.loads(res.stdout)] == NAMES
    bad = runner.invoke(app, ["reproduce", "nope"])
    assert bad.exit_code == 2 and "unknown reproduction 'nope'" in bad.output
    bad = runner.invoke(app, ["reproduce", NAMES[0], "--scale", "huge"])
    assert bad.exit_code == 2 and "scale must be one of ci, paper" in bad.output


def test_tables_are_written_to_fixed_digits() -> None:
    assert fmt_cell(0.123456789) == "0.123457" and fmt_cell(None) == "" and fmt_cell(3) == "3"
    text = to_csv([{"a": 1.0, "b": "x,y"}, {"a": 2.5, "c": None}])
    assert list(csv.reader(io.StringIO(text))) == [
        ["a", "b", "c"],
        ["1", "x,y", ""],
        ["2.5", "", ""],
    ]
    with pytest.raises(ValueError, match="needs its reason"):
        Claim("x", "Sec. 1", "1", "2", "differ")
    with pytest.raises(ConfigError, match="unknown reproduction"):
        get_reproduction("nope")


@pytest.mark.parametrize("name", NAMES)
def test_paper_scale_outputs_are_checked_in_and_documented(name: str) -> None:
    docs = Path(__file__).resolve().parents[1] / "docs"
    folder = docs / "reproductions" / name
    for fname in ("table.csv", "table.md", "claims.csv", "claims.md"):
        assert (folder / fname).is_file(), f"{name}: run it at --scale paper into docs/"
    assert "scale `paper`" in (folder / "table.md").read_text()
    assert f"**`{name}`**" in (docs / "reproductions.md").read_text()
