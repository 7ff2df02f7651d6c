"""The entry point's light top-level help equals the real app's, and imports nothing heavy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer.main

from prefixlab.cli import entry as cli_entry
from prefixlab.cli.main import app


def _real_listing() -> dict[str, str]:
    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    out = {}
    for name in group.list_commands(ctx):  # type: ignore[attr-defined]
        cmd = group.get_command(ctx, name)  # type: ignore[attr-defined]
        assert cmd is not None
        if not cmd.hidden:
            out[name] = (cmd.short_help or cmd.help or "").split("\n\n")[0]
    return out


def test_the_table_is_the_real_commands_in_order() -> None:
    assert list(cli_entry.COMMANDS.items()) == list(_real_listing().items())
    assert typer.main.get_command(app).help == cli_entry.HELP


def _run(entry: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.argv = ['prefixlab', *{args!r}]; {entry}"
    env = {**os.environ, "COLUMNS": "90", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("args", [[], ["--help"]])
def test_the_light_help_prints_what_the_app_prints(args: list[str]) -> None:
    real = _run("from prefixlab.cli.main import app; app()", args)
    light = _run("from prefixlab.cli.entry import main; main()", args)
    assert (light.stdout, light.stderr) == (real.stdout, real.stderr)
    assert "replay" in real.stdout + real.stderr
    assert light.returncode == real.returncode == (0 if args else 2)


def test_the_help_imports_neither_numpy_nor_the_commands() -> None:
    code = (
        "import sys; sys.argv = ['prefixlab', '--help']\n"
        "from prefixlab.cli.entry import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'"
        " or m.startswith('prefixlab.cli.')"
        " and m not in ('prefixlab.cli.entry', 'prefixlab.cli.root'))\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Commands" in proc.stdout and "simulate" in proc.stdout
    assert proc.stderr.strip() == "0 []"


def test_a_command_still_runs_through_the_real_app() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prefixlab", "policies", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"name": "lru"' in proc.stdout
