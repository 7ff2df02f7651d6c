"""CLI group ``trace``: stats, convert, generate."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from prefixlab.analysis import trace_stats
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
from prefixlab.workload.generators import GENERATORS, GeneratorInfo
from prefixlab.workload.loaders.write import output_format, write_trace
from prefixlab.workload.trace import Trace

trace_app = typer.Typer(no_args_is_help=True, help="Inspect and convert traces.")


@trace_app.command("stats")
@with_loader_options
def trace_stats_cmd(
    trace: TraceArg,
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Requests, sessions, tasks, length percentiles, arrival span and the hit ceiling."""
    try:
        kwargs = load or {}
        tr = load_shown(trace, fmt, kwargs)
        block_tokens_of(tr, block_tokens)
        stats = trace_stats(tr, block_tokens)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    if as_json:
        print_json(stats)
        return
    table = FitTable(title=f"trace {stats['name']}", show_header=False)
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        if isinstance(value, dict):
            value = ", ".join(
                f"{k} {v:,.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items()
            )
        elif isinstance(value, float):
            value = f"{value:,.4f}"
        elif isinstance(value, int):
            value = f"{value:,}"
        table.add_row(key, str(value))
    console().print(table)


OutOpt = Annotated[
    Path, typer.Option("--out", "-o", help="Output file: .parquet for Parquet, else JSONL.")
]
ToOpt = Annotated[
    str | None, typer.Option("--to", help="Output format: native (JSONL) or parquet.")
]


@trace_app.command("convert")
@with_loader_options
def trace_convert_cmd(
    trace: TraceArg,
    out: OutOpt,
    fmt: FormatOpt = "native",
    to: ToOpt = None,
    load: dict[str, Any] | None = None,
) -> None:
    """Convert any supported trace to native JSONL or Parquet (atomically written)."""
    try:
        kwargs = load or {}
        output_format(out, to)
        tr = load_shown(trace, fmt, kwargs)
        write_trace(tr, out, to)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    console().print(f"wrote {len(tr):,} requests to {out}")


generate_app = typer.Typer(
    no_args_is_help=True,
    help="Generate a seeded workload and write it (one command per generator).",
)
trace_app.add_typer(generate_app, name="generate")


def _generate_command(info: GeneratorInfo[Trace]) -> Callable[..., None]:
    """A command whose flags are the generator's parameters (--num-sessions, --preset...)."""
    fields = dataclasses.fields(info.params)

    def command(**kwargs: Any) -> None:
        out: Path = kwargs.pop("out")
        to: str | None = kwargs.pop("to")
        given = {k: v for k, v in kwargs.items() if v is not None}
        try:
            output_format(out, to)
            tr = info.fn(**given)
            write_trace(tr, out, to)
        except PrefixlabError as exc:
            fail(str(exc))
            return
        console().print(f"wrote {len(tr):,} requests to {out}")

    params = [
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=OutOpt),
        inspect.Parameter("to", inspect.Parameter.KEYWORD_ONLY, annotation=ToOpt, default=None),
    ]
    for f in fields:
        kind = type(f.default) if f.default is not None else float
        flag = "--" + f.name.replace("_", "-")
        decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
        hint = f.metadata.get("help", "")
        option = typer.Option(*decls, help=f"{hint} (default {f.default})", show_default=False)
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[kind | None, option],
                default=None,
            )
        )
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = f"{info.summary} Parameters as named in the paper; see docs/workloads."
    return command


for _info in GENERATORS.values():
    generate_app.command(_info.name)(_generate_command(_info))


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
