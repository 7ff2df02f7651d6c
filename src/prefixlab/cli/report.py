"""CLI commands of the report layer: ``report`` (one HTML page) and ``plot`` (PNG files)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefixlab.cli.common import console, fail
from prefixlab.errors import PrefixlabError

ResultsArg = Annotated[str, typer.Argument(help="Results folder (or its results.parquet).")]


def report_cmd(
    results: ResultsArg,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="HTML file [default: RESULTS/report.html].")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the report's path.")
    ] = False,
) -> None:
    """Write a self-contained HTML report (tables, figures, config) of a results folder."""
    from prefixlab.studies import build_report

    try:
        path = build_report(results, out)
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    if quiet:
        print(path)
        return
    size_kb = path.stat().st_size / 1024
    console().print(
        f"report: {path} ({size_kb:,.0f} KB)", markup=False, highlight=False, soft_wrap=True
    )


def plot_cmd(
    results: ResultsArg,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder [default: RESULTS/plots].")
    ] = None,
) -> None:
    """Write the report's figures as PNG files, one per line printed."""
    from prefixlab.experiments.store import find_results
    from prefixlab.studies import write_plots

    try:
        folder = find_results(results)
        paths = write_plots(folder, out if out is not None else folder / "plots")
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    for path in paths:
        print(path)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
    app.command("plot")(plot_cmd)
