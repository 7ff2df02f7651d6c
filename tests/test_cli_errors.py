"""Every command's user mistakes are one line (issue 19): ``error: ...`` on stderr, exit
status 2, no traceback. The table names one missing input per command and, where a
command reads a file, one malformed file; a command added without a row fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app

runner = CliRunner()
#: commands that read no input a user can get wrong (their options are click's to check)
NO_INPUT = {"policies", "demo", "experts policies"}
MISSING = "/nonexistent/x.jsonl"
#: command -> (arguments with a missing input, a fragment of the error)
MISSING_INPUT: dict[str, tuple[list[str], str]] = {
    "replay": (["replay", MISSING, "-p", "lru", "--capacity-blocks", "10"], "not found"),
    "simulate": (
        ["simulate", MISSING, "-p", "lru", "--capacity-blocks", "10", "--timing", "tpot:s=0.02"],
        "not found",
    ),
    "fit-timing": (["fit-timing", "/nonexistent/t.csv"], "timing CSV not found"),
    "models": (["models", "/nonexistent/m.json"], "model file /nonexistent/m.json"),
    "plan": (
        [
            "plan",
            MISSING,
            "--slo-p95-ttft",
            "1",
            "--capacity-blocks",
            "10",
            "--timing",
            "tpot:s=0.02",
        ],
        "not found",
    ),
    "compare": (["compare", MISSING, "-p", "lru", "-c", "10"], "not found"),
    "sweep": (["sweep", "/nonexistent/s.toml"], "config file not found"),
    "schema": (["schema", "fleet"], "unknown config kind 'fleet'"),
    "report": (["report", "/nonexistent/r"], "no results.parquet here"),
    "plot": (["plot", "/nonexistent/r"], "no results.parquet here"),
    "reproduce": (["reproduce", "nope"], "unknown reproduction 'nope'"),
    "trace stats": (["trace", "stats", MISSING], "not found"),
    "trace convert": (["trace", "convert", MISSING, "-o", "/tmp/out.jsonl"], "not found"),
    "trace generate lpc": (
        ["trace", "generate", "lpc", "--num-conversations", "0", "-o", "/tmp/g.jsonl"],
        "num_conversations must be >= 1",
    ),
    "trace generate templated": (
        ["trace", "generate", "templated", "--num-requests", "0", "-o", "/tmp/g.jsonl"],
        "num_requests must be >= 1",
    ),
    "trace generate mix": (
        ["trace", "generate", "mix", "--num-requests", "0", "-o", "/tmp/g.jsonl"],
        "num_requests must be >= 1",
    ),
    "trace generate random-pool": (
        ["trace", "generate", "random-pool", "--num-requests", "0", "-o", "/tmp/g.jsonl"],
        "num_requests must be >= 1",
    ),
    "trace generate sessions": (
        ["trace", "generate", "sessions", "--num-sessions", "0", "-o", "/tmp/g.jsonl"],
        "num_sessions must be >= 1",
    ),
    "results list": (["results", "list", "/nonexistent/r"], "no such folder"),
    "results show": (["results", "show", "/nonexistent/r"], "no results.parquet here"),
    "results query": (["results", "query", "/nonexistent/r", "select 1"], "no results.parquet"),
    "lpc train": (["lpc", "train", MISSING, "-o", "/tmp/m"], "not found"),
    "lpc eval": (["lpc", "eval", MISSING, "--model", "/nonexistent/m"], "no LPC model here"),
    "analyze reuse": (["analyze", "reuse", MISSING], "not found"),
    "experts generate": (["experts", "generate", "nope"], "unknown expert generator 'nope'"),
    "experts info": (["experts", "info", "/nonexistent/t.npz"], "not found"),
    "experts simulate": (
        ["experts", "simulate", "/nonexistent/t.npz", "-k", "2", "-p", "lru"],
        "not found",
    ),
    "experts sweep": (["experts", "sweep", "/nonexistent/s.toml"], "config file not found"),
    "experts record": (
        ["experts", "record", "--model", "/nonexistent/m", "--prompts", "/nonexistent/p.txt"],
        "prompts file not found",
    ),
}


def _leaf_commands() -> set[str]:
    import typer.main

    def walk(cmd: object, path: list[str]) -> list[str]:
        subs = getattr(cmd, "commands", None)
        if subs:
            return [n for name, sub in subs.items() for n in walk(sub, [*path, name])]
        return [" ".join(path)]

    return set(walk(typer.main.get_command(app), []))


def _assert_one_line(args: list[str], fragment: str) -> None:
    res = runner.invoke(app, args)
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert len(out.splitlines()) == 1 and out.startswith("error: "), out
    assert fragment in out and "Traceback" not in out, out


def test_every_command_has_a_row() -> None:
    assert _leaf_commands() == set(MISSING_INPUT) | NO_INPUT


@pytest.mark.parametrize("command", sorted(MISSING_INPUT))
def test_a_missing_input_is_one_line(command: str) -> None:
    _assert_one_line(*MISSING_INPUT[command])


@pytest.fixture
def bad_trace(tmp_path: Path) -> str:
    """Line 2 has a string where input_length is a count."""
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"input_tokens": [1, 2, 3], "output_length": 1}\n'
        '{"input_length": "many", "output_length": 1, "hash_ids": [1]}\n',
        encoding="utf-8",
    )
    return str(p)


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "{t}", "-p", "lru", "--capacity-blocks", "10", "--block-tokens", "2"],
        [
            "simulate",
            "{t}",
            "-p",
            "lru",
            "--capacity-blocks",
            "10",
            "--block-tokens",
            "2",
            "--timing",
            "tpot:s=0.02",
        ],
        ["compare", "{t}", "-p", "lru", "-c", "10", "--block-tokens", "2"],
        ["trace", "stats", "{t}", "--block-tokens", "2"],
        ["trace", "convert", "{t}", "-o", "{d}/out.jsonl"],
        ["analyze", "reuse", "{t}", "--block-tokens", "2"],
        ["lpc", "train", "{t}", "-o", "{d}/m"],
    ],
    ids=lambda a: " ".join(a[:2]) if a[0] == "trace" else a[0],
)
def test_a_malformed_trace_line_is_one_line_naming_file_and_line(
    bad_trace: str, args: list[str]
) -> None:
    folder = str(Path(bad_trace).parent)
    filled = [a.format(t=bad_trace, d=folder) for a in args]
    _assert_one_line(filled, f"{bad_trace}:2: field 'input_length'")


@pytest.mark.parametrize("command", ["sweep", "experts sweep"])
def test_a_bad_config_value_is_one_line_naming_the_key(command: str, tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    if command == "sweep":
        text = (
            'policies = ["lru"]\n[workload]\nsource = "gen:sessions"\n[cache]\ncapacities = [0]\n'
        )
    else:
        text = '[workload]\ntrace = "gen:zipf"\n[cache]\ncapacities = [0]\npolicies = ["lru"]\n'
    p.write_text(text, encoding="utf-8")
    _assert_one_line([*command.split(), str(p)], "cache.capacities[0]: ")
