"""CLI command ``reproduce``: list the papers' reproductions, or run one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefixlab.cli.common import FitTable, console, err, fail, print_json
from prefixlab.errors import PrefixlabError
from prefixlab.reproduce import (
    Outcome,
    Reproduction,
    Scale,
    check_scale,
    get_reproduction,
    reproductions,
    write_outcome,
)


def reproduce_cmd(
    name: Annotated[
        str | None, typer.Argument(help="The reproduction to run; none lists them all.")
    ] = None,
    scale: Annotated[
        str, typer.Option(help="ci (seconds; checked in CI) or paper (the paper's size).")
    ] = "ci",
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for <name>/table, claims, figure.")
    ] = Path("reproductions"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Rerun a paper's table or figure with its setup; write ours beside the paper's."""
    if name is None:
        _list_reproductions(as_json)
        return
    try:
        sc = check_scale(scale)
        rep = get_reproduction(name)
        err.print(f"reproduce {name} ({rep.paper}, {rep.target}) at {sc} scale")
        outcome = rep.run(sc)
        written = write_outcome(rep, outcome, sc, out)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    if as_json:
        doc = {
            "name": name,
            "scale": sc,
            "table": outcome.table,
            "claims": [
                c.__dict__ if hasattr(c, "__dict__") else {f: getattr(c, f) for f in c.__slots__}
                for c in outcome.claims
            ],
            "files": [str(p) for p in written],
        }
        print_json(doc)
        return
    _print_outcome(rep, outcome, sc, written)


def _list_reproductions(as_json: bool) -> None:
    """Every reproduction: one JSON list, or a table."""
    rows = [
        {"name": n, "paper": c.paper, "target": c.target, "title": c.title}
        for n, c in reproductions().items()
    ]
    if as_json:
        print_json(rows)
        return
    table = FitTable(title="reproductions (prefixlab reproduce NAME --scale ci|paper)")
    for col in ("name", "paper", "target", "title"):
        table.add_column(col, overflow="fold")
    for row in rows:  # the paper's name; its file under ../shared/papers in --json
        paper = str(row["paper"]).split(" (")[0]
        table.add_row(row["name"], paper, row["target"], row["title"])
    console().print(table)


def _print_outcome(rep: Reproduction, outcome: Outcome, sc: Scale, written: list[Path]) -> None:
    """The paper's claims beside ours, as a table, and the files written."""
    cons = console()
    claims = FitTable(title=f"{rep.title}: the paper beside ours ({sc} scale)")
    for col in ("what", "where", "paper", "ours", "verdict"):
        claims.add_column(col, overflow="fold")
    for c in outcome.claims:
        claims.add_row(c.what, c.where, c.paper, c.ours, c.verdict)
    cons.print(claims)
    for path in written:
        cons.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("reproduce")(reproduce_cmd)
