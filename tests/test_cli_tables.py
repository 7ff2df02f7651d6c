"""Tables fit an 80-column terminal: no line wider, no word cut, none left out.

Each command runs twice, at 80 and at 300 columns (``COLUMNS``, which the console honours
when piped). At 80, every line fits, nothing ends in an ellipsis, and every word of the wide
output (headers, names, numbers) is still there: rich crops a table that cannot shrink
enough, and a cropped column loses words.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from tests.tables import table_lines, tables

MOONCAKE = Path(__file__).resolve().parents[2] / "shared/data/mooncake/conversation_trace.jsonl"
GEN = "gen:sessions:num_sessions=8,seed=3"
#: words whose value changes from run to run (wall-clock times and speeds)
TIMED = {"replay", "compare"}

COMMANDS = [
    [
        "replay",
        GEN,
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "200000",
        "-p",
        "lru",
        "-p",
        "lecar:seed=1",
        "-p",
        "s3fifo",
        "-p",
        "opt",
    ],
    [
        "replay",
        GEN,
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "300",
        "-p",
        "lru",
        "--structure",
        "radix",
    ],
    [
        "replay",
        GEN,
        "--block-tokens",
        "16",
        "--structure",
        "hybrid",
        "--model",
        "marconi-7b",
        "--capacity-bytes",
        "8GB",
        "-p",
        "vllm+",
        "-p",
        "marconi",
    ],
    [
        "simulate",
        GEN,
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "20000",
        "-p",
        "lru",
        "-p",
        "opt",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--by-task",
    ],
    ["policies"],
    ["trace", "stats", GEN, "--block-tokens", "16"],
    ["analyze", "reuse", GEN, "--block-tokens", "16"],
    ["reproduce"],
    ["experts", "policies"],
    [
        "experts",
        "simulate",
        "gen:zipf:num_layers=3,num_experts=4,num_tokens=60,seed=2",
        "-k",
        "2",
        "-k",
        "6",
    ],
]


def _run(args: list[str], columns: int, cwd: Path) -> str:
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _words(text: str, timed: bool) -> set[str]:
    words = {w for w in text.split() if set(w) - set("─━")}  # not the rule under a header
    if timed:  # wall-clock seconds and speeds change between runs
        words = {w for w in words if not re.fullmatch(r"\(?[\d,.]+", w)}
    return words


def _check(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    narrow, wide = _run(args, 80, tmp_path), _run(args, 300, tmp_path)
    long = [line for line in table_lines(narrow) if len(line) > 80]
    assert not long, "\n".join(long)
    assert "…" not in narrow
    timed = args[0] in TIMED
    lost = _words(wide, timed) - _words(narrow, timed)
    assert not lost, f"cut at 80 columns: {sorted(lost)}\n{narrow}"
    assert tables(narrow), "no table found"


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_a_table_fits_80_columns(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(args, tmp_path, monkeypatch)


def test_the_sweep_summary_fits_with_its_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compare over two seeds: the mean and the spread of the token hit ratio, in 80
    columns; the spread is the sample standard deviation of the seeds' rows."""
    out = tmp_path / "cmp"
    args = [
        "compare",
        "gen:sessions:num_sessions=12",
        "-p",
        "lru",
        "-p",
        "s3fifo",
        "-c",
        "0.3ws",
        "-c",
        "4000",
        "--block-tokens",
        "16",
        "--out",
        str(out),
        "--no-report",
        "--seed",
        "0",
        "--seed",
        "1",
    ]
    _check(args, tmp_path, monkeypatch)
    import statistics

    from prefixlab.experiments import read_table

    rows = read_table(out).to_pylist()
    header, body = tables(_run(args, 300, tmp_path))[0]
    assert header[:6] == ["capacity", "blocks", "policy", "token hit", "± sd", "req hit"]
    for cells in body:
        capacity, _, policy, mean, sd = cells[:5]
        hits = [
            r["token_hit_ratio"]
            for r in rows
            if r["capacity"] == capacity and r["policy"] == policy
        ]
        assert len(hits) == 2
        assert mean == f"{statistics.mean(hits):.4f}" and sd == f"{statistics.stdev(hits):.4f}"
    assert "mean and sd of 2 seeds" in _run(args, 300, tmp_path)
    _check(["results", "show", str(out)], tmp_path, monkeypatch)


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="needs ../shared/data")
def test_wide_numbers_of_a_real_trace_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [
        "replay",
        str(MOONCAKE),
        "-f",
        "mooncake",
        "--limit",
        "2000",
        "--capacity-blocks",
        "2000",
        "-p",
        "lru",
        "-p",
        "opt",
        "-p",
        "lecar:seed=1",
    ]
    _check(args, tmp_path, monkeypatch)
