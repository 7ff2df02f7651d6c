"""The ``prefixlab`` application: the root command and every command group, registered in
the order of the listing (``prefixlab --help``)."""

from __future__ import annotations

import typer

from prefixlab.cli import (
    analyze,
    engine,
    experiments,
    experts,
    lpc,
    models,
    plan,
    replay,
    report,
    reproduce,
    trace,
)
from prefixlab.cli.common import guard_interrupts
from prefixlab.cli.root import root

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Simulate and compare cache policies for LLM serving.",
)
app.callback()(root)  # --version
for group in (
    replay,
    models,
    trace,
    engine,
    plan,
    experiments,
    report,
    lpc,
    analyze,
    experts,
    reproduce,
):
    group.register(app)
guard_interrupts(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
