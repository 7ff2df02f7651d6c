"""CLI commands of trace analysis: ``analyze reuse`` (tables, JSON, plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from prefixlab.analysis.reuse import ALL, POSITION_LABELS, ReuseAnalysis, analyze_reuse
from prefixlab.cli.common import (
    BlockTokensOpt,
    FitTable,
    FormatOpt,
    TraceArg,
    block_tokens_of,
    console,
    fail,
    load_shown,
    print_json,
    with_loader_options,
)
from prefixlab.errors import PrefixlabError

analyze_app = typer.Typer(
    no_args_is_help=True,
    help="Analyse a trace: block reuse by session, task, phase and position; gaps; headroom.",
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _attribution_table(a: ReuseAnalysis) -> Table:
    table = FitTable(title="reuses by where the reused block came from (most recent holder)")
    for col in (
        "task",
        "lookup blocks",
        "reuses",
        "reused",
        "intra session",
        "inter session",
        "intra task",
        "inter task",
    ):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task in a.groups():
        at = a.attribution[task]
        d = at.as_dict()
        table.add_row(
            task,
            f"{at.num_lookup_blocks:,}",
            f"{at.num_reuses:,}",
            _pct(d["reuse_share_of_lookups"]),
            _pct(d["intra_session_share"]),
            _pct(d["inter_session_share"]),
            _pct(d["intra_task_share"]),
            _pct(d["inter_task_share"]),
            end_section=task == ALL,
        )
    return table


def _phase_table(a: ReuseAnalysis) -> Table:
    table = FitTable(title="stored blocks reused later, by phase")
    for col in ("task", "prefill stored", "prefill reused", "decode stored", "decode reused"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task in a.groups():
        p = a.phase[task]
        table.add_row(
            task,
            f"{p.num_prefill_stored:,}",
            _pct(p.prefill_reuse_fraction),
            f"{p.num_decode_stored:,}",
            _pct(p.decode_reuse_fraction),
            end_section=task == ALL,
        )
    return table


def _position_table(a: ReuseAnalysis) -> Table:
    """One row per block position bucket, one column per task (positions outnumber the
    tasks of a trace, and an 80-column terminal holds few columns)."""
    table = FitTable(title="reuse probability of stored prefill blocks by block position")
    table.add_column("position")
    tasks = list(a.groups())
    for task in tasks:
        table.add_column(task, justify="right")
    for i, label in enumerate(POSITION_LABELS):
        table.add_row(label, *(_pct(a.position[task].probability[i]) for task in tasks))
    return table


def _gaps_table(a: ReuseAnalysis) -> Table:
    table = FitTable(title="inter-turn gaps (arrival to arrival) and their log-normal fit")
    for col in (
        "task",
        "gaps",
        "zero",
        "mu",
        "sigma",
        "median (s)",
        "p90 (s)",
        "fit median (s)",
        "fit p90 (s)",
        "KS",
    ):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task, g in a.gaps.items():
        table.add_row(
            task,
            f"{g.num_gaps:,}",
            f"{g.num_zero_gaps:,}",
            _num(g.mu),
            _num(g.sigma),
            _num(g.median_s, "{:,.2f}"),
            _num(g.p90_s, "{:,.2f}"),
            _num(g.fit_median_s, "{:,.2f}"),
            _num(g.fit_p90_s, "{:,.2f}"),
            _num(g.ks_distance),
        )
    return table


def _print_tables(a: ReuseAnalysis, out: Console) -> None:
    out.print(
        f"trace: {a.name} ({a.num_requests:,} requests, {a.num_sessions:,} sessions, "
        f"{a.form} form, {a.block_tokens}-token blocks)"
    )
    out.print(_attribution_table(a))
    if not a.num_sessions:
        out.print("no request has a session: every reuse counts as inter-session")
    out.print(_phase_table(a))
    out.print(_position_table(a))
    if a.gaps:
        out.print(_gaps_table(a))
    else:
        out.print("inter-turn gaps: none (no session has two requests)")
    h = a.headroom.as_dict()
    line = f"headroom: infinite cache {_pct(h['infinite_token_hit_ratio'])} token hit"
    if h["capacity_blocks"] is not None:
        line += (
            f"; at {h['capacity_blocks']:,} blocks OPT {_pct(h['opt_token_hit_ratio'])}, "
            f"LRU {_pct(h['lru_token_hit_ratio'])} (OPT - LRU {h['opt_minus_lru']:+.1%}, "
            f"infinite - OPT {h['infinite_minus_opt']:+.1%})"
        )
    out.print(line)


@with_loader_options
def reuse_cmd(
    trace: TraceArg,
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    capacity_blocks: Annotated[
        int | None, typer.Option(help="Cache size (blocks) for the LRU and OPT headroom.")
    ] = None,
    plots: Annotated[
        Path | None, typer.Option(help="Write one PNG per analysis into this folder.")
    ] = None,
    dpi: Annotated[int, typer.Option(min=1, help="Resolution of the plots.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Block reuse: intra/inter session and task, prefill vs decode, by position; inter-turn
    gaps with a log-normal fit; the hit-ratio headroom (infinite cache, OPT, LRU)."""
    try:
        tr = load_shown(trace, fmt, load or {})
        block_tokens_of(tr, block_tokens)
        result = analyze_reuse(tr, block_tokens, capacity_blocks)
        written: list[Path] = []
        if plots is not None:
            from prefixlab.analysis.reuse_plots import write_reuse_plots  # matplotlib: lazily

            written = write_reuse_plots(result, plots, dpi)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    if as_json:
        out = result.as_dict() | {"plots": [str(p) for p in written]}
        print_json(out)
        return
    con = console()
    _print_tables(result, con)
    for path in written:
        con.print(f"plot: {path}")


def register(app: typer.Typer) -> None:
    analyze_app.command("reuse")(reuse_cmd)
    app.add_typer(analyze_app, name="analyze")
