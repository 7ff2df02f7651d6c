"""Progress bars (issue 5): drawn on stderr for long loops on a terminal, never with --quiet
or off a terminal, and never in the results."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import prefixlab.cli.common as common
from prefixlab.cli.main import app

GEN = "gen:sessions:num_sessions=4"


def _terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=buf, force_terminal=True, width=120))
    return buf


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (
            [
                "replay",
                GEN,
                "--block-tokens",
                "16",
                "--capacity-blocks",
                "3000",
                "-p",
                "lru",
                "-p",
                "fifo",
            ],
            "policies",
        ),
        (
            [
                "simulate",
                GEN,
                "--block-tokens",
                "16",
                "--capacity-blocks",
                "3000",
                "-p",
                "lru",
                "--timing",
                "power:preset=llama-3.1-8b-h100+tpot:s=0.02",
            ],
            "requests",
        ),
        (
            ["compare", GEN, "--block-tokens", "16", "-c", "3000", "-p", "lru", "-p", "fifo"],
            "cells",
        ),
    ],
)
def test_bar_on_a_terminal_and_none_with_quiet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], label: str
) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    buf = _terminal(monkeypatch)
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    drawn = buf.getvalue()
    # the bar (label, n/total, elapsed time) was drawn on the (fake) terminal's stderr...
    assert label in drawn and "0:00:0" in drawn
    assert "0:00:0" not in plain.stdout  # ...and kept out of the output
    buf = _terminal(monkeypatch)
    quiet = runner.invoke(app, [*args, "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert buf.getvalue() == ""


def test_no_bar_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=buf, force_terminal=False))
    with common.progress_bar("cells") as advance:
        assert advance is None
    assert buf.getvalue() == ""
