"""CLI commands of experiments: ``compare``, ``sweep``, ``demo`` and ``results``."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer

from prefixlab.cli.common import (
    AddressOpt,
    BackendOpt,
    BlockTokensOpt,
    DetailOpt,
    FitTable,
    FormatOpt,
    JobsOpt,
    QuietPathOpt,
    ReportOpt,
    ResultsOpt,
    TraceArg,
    console,
    err,
    fail,
    print_json,
    progress_bar,
    resumable,
    secs,
    summary_table,
    with_loader_options,
)
from prefixlab.configfile import ConfigModel, read_config_file, schema
from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.experiments.config import (
    config_from_text,
    parse_config,
)
from prefixlab.experiments.store import TABLES, find_results, query, read_json, read_table
from prefixlab.experiments.study import Progress, StudyCell, SweepSummary, run_study


@contextmanager
def cell_progress(quiet: bool) -> Iterator[Progress[StudyCell] | None]:
    """The sweep's progress over cells (see :func:`progress_bar`)."""
    with progress_bar("cells", quiet) as advance:
        if advance is None:
            yield None
            return
        bar = advance

        def update(done: int, total: int, cell: StudyCell | None) -> None:
            bar(done, total, cell.label() if cell else "")

        yield update


def execute(
    cfg: ConfigModel,
    out: Path | None,
    *,
    jobs: int,
    quiet: bool,
    backend: str = "local",
    address: str | None = None,
    detail: bool = False,
    report: bool = True,
    flags: bool = False,
) -> None:
    """Run the study of a config of any kind into ``out`` (default ``results/NAME``),
    write its report, then print its summary table (``quiet``: the folder only).
    ``flags``: errors name compare's flags, not config keys."""
    from prefixlab.studies import kind_for

    kind = kind_for(cfg)
    name = str(getattr(cfg, "name", kind.name))
    folder = out if out is not None else Path("results") / name
    try:
        study = kind.study(cfg, detail)
        with resumable(folder), cell_progress(quiet) as progress:
            summary = run_study(
                study, folder, jobs=jobs, backend=backend, address=address, progress=progress
            )
        report_path = kind.report(folder, None) if report else None
        table = None if quiet else kind.summary(folder)
    except PrefixlabError as exc:
        fail(_flag_names(str(exc)) if flags else str(exc))
        return
    if table is None:
        typer.echo(str(folder))
        return
    out_console = console()
    out_console.print(summary_table(table))
    out_console.print(_footer(summary, report_path), markup=False, highlight=False)


def _footer(summary: SweepSummary[StudyCell], report: Path | None) -> str:
    n = len(summary.cells)
    text = (
        f"{n} cells: {len(summary.ran)} run, {len(summary.skipped)} already done "
        f"({summary.wall_s:.1f} s)\nresults: {summary.folder}/results.parquet (and .csv)"
    )
    if report is not None:
        text += f"\nreport:  {report}"
    return text


# ------------------------------------------------------------------ commands
def sweep_cmd(
    config: Annotated[
        Path, typer.Argument(help="Study config (.toml, .yaml): an experiment, or experts.")
    ],
    out: ResultsOpt = None,
    jobs: JobsOpt = 1,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    detail: DetailOpt = False,
    quiet: QuietPathOpt = False,
    report: ReportOpt = True,
) -> None:
    """Run a study (experiment or experts); finished cells are kept, so a rerun resumes."""
    try:
        cfg = load_study(config)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    execute(
        cfg,
        out,
        jobs=jobs,
        quiet=quiet,
        backend=backend,
        address=address,
        detail=detail,
        report=report,
    )


def load_study(config: Path) -> ConfigModel:
    """A study config file, validated by its kind's rules (named after the file)."""
    from prefixlab.studies import config_kind, get_kind

    data, path = read_config_file(config)
    return get_kind(config_kind(data)).load(data, path.stem)


_INT = re.compile(r"^\d+$")


@with_loader_options
def compare_cmd(
    trace: TraceArg,
    policy: Annotated[list[str], typer.Option("--policy", "-p", help="Policy spec (repeatable).")],
    capacity: Annotated[
        list[str],
        typer.Option(
            "--capacity",
            "-c",
            help="Capacity (repeatable): blocks, 0.5ws (of the working set) or 0.7A "
            "(of GPU memory after weights).",
        ),
    ],
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    runner: Annotated[str, typer.Option(help="replay, or engine for latencies.")] = "replay",
    structure: Annotated[str, typer.Option(help="Cache structure: block or radix.")] = "block",
    model: Annotated[str | None, typer.Option(help="Model preset (FLOPs, 'A').")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU preset (roofline, 'A').")] = None,
    timing: Annotated[
        list[str] | None, typer.Option(help="Timing spec for the engine (see simulate).")
    ] = None,
    seed: Annotated[list[int] | None, typer.Option(help="Seed (repeatable).")] = None,
    name: Annotated[str, typer.Option(help="Experiment name.")] = "compare",
    out: ResultsOpt = None,
    jobs: JobsOpt = 1,
    detail: DetailOpt = False,
    quiet: QuietPathOpt = False,
    report: ReportOpt = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Compare policies on one workload at one or more capacities: a table, and results."""
    data = _compare_data(
        trace, fmt, load or {}, policy, capacity, block_tokens, runner, structure, seed, name
    )
    data["model"] = {k: v for k, v in (("name", model), ("gpu", gpu), ("timing", timing)) if v}
    try:
        cfg = parse_config(data)
    except PrefixlabError as exc:
        fail(_flag_names(str(exc)))
        return
    execute(cfg, out, jobs=jobs, quiet=quiet, detail=detail, report=report, flags=True)


def _compare_data(
    trace: str,
    fmt: str,
    load: dict[str, Any],
    policy: list[str],
    capacity: list[str],
    block_tokens: int | None,
    runner: str,
    structure: str,
    seed: list[int] | None,
    name: str,
) -> dict[str, Any]:
    """The experiment config of compare's flags (less the model's)."""
    data: dict[str, Any] = {
        "name": name,
        "workload": {"source": trace, "format": fmt, "params": dict(load)},
        "cache": {
            "structure": structure,
            "capacities": [int(c) if _INT.match(c) else c for c in capacity],
        },
        "policies": policy,
        "runner": {"kind": runner},
        "seeds": seed or [0],
    }
    if block_tokens is not None:
        data["cache"]["block_tokens"] = block_tokens
    return data


def _flag_names(message: str) -> str:
    """Config key names in a compare error read as the flags the user typed."""
    for key, flag in (
        ("cache.capacities", "--capacity"),
        ("runner.kind", "--runner"),
        ("cache.structure", "--structure"),
        ("policies", "--policy"),
        ("model.timing", "--timing"),
        ("model.name", "--model"),
        ("model.gpu", "--gpu"),
    ):
        message = message.replace(key, flag)
    return message


def demo_cmd(
    out: ResultsOpt = None,
    jobs: JobsOpt = 2,
    num_requests: Annotated[
        int, typer.Option(min=500, help="Requests of the workload (500 or more).")
    ] = 1000,
    quiet: QuietPathOpt = False,
) -> None:
    """The built-in tour: a multi-turn + templated mix, the classic policies and OPT,
    on the serving engine; ends with the table and the path of the HTML report."""
    text = resources.files("prefixlab.experiments").joinpath("demo.toml").read_text("utf-8")
    cfg = config_from_text(text, "demo")
    data = cfg.model_dump()
    data["workload"]["params"]["num_requests"] = num_requests
    cfg = parse_config(data)
    if not quiet:
        err.print(
            f"demo: {cfg.workload.source} ({cfg.workload.params.get('num_requests')} requests), "
            f"{len(cfg.policies)} policies x {len(cfg.cache.capacities)} capacities on the "
            f"engine runner, {jobs} jobs"
        )
    execute(cfg, out, jobs=jobs, quiet=quiet)


# ------------------------------------------------------------------ results
results_app = typer.Typer(no_args_is_help=True, help="List and query saved results.")


@results_app.command("list")
def results_list_cmd(
    folder: Annotated[Path, typer.Argument(help="Folder holding results folders.")] = Path(
        "results"
    ),
) -> None:
    """Every results folder under FOLDER: name, runner, cells, policies, capacities."""
    from prefixlab.studies import kind_of

    if not folder.is_dir():
        fail(f"{folder}: no such folder")
        return
    found = sorted(p.parent for p in folder.rglob("results.parquet"))
    if not found:
        fail(f"{folder}: no results folders (run `prefixlab sweep` or `compare`)")
        return
    table = FitTable(title=f"results under {folder}")
    for head in ("folder", "study", "runner", "rows", "policies", "capacities", "seeds"):
        table.add_column(head, justify="right" if head in ("rows", "seeds") else "left")
    for path in found:
        rows = read_table(path).to_pylist()
        first = rows[0] if rows else {}
        kind = kind_of(path).name  # an expert-cache study's rows have no runner
        table.add_row(
            str(path),
            str(first.get("experiment") or read_json(path, "config.resolved.json").get("name")),
            str(first.get("runner", kind)),
            f"{len(rows):,}",
            ", ".join(dict.fromkeys(r["policy"] for r in rows)),
            ", ".join(dict.fromkeys(str(r["capacity"]) for r in rows)),
            str(len({r["seed"] for r in rows})),
        )
    console().print(table)


@results_app.command("show")
def results_show_cmd(
    results: Annotated[Path, typer.Argument(help="A results folder.")],
    table: Annotated[str, typer.Option(help=f"Table: {', '.join(TABLES)}.")] = "results",
    columns: Annotated[
        str | None, typer.Option(help="Comma-separated columns (default: the main ones).")
    ] = None,
    where: Annotated[
        list[str] | None, typer.Option(help="column=value filter (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(min=0, help="Rows at most.")] = 50,
    csv: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")] = False,
) -> None:
    """Print rows of a results table, filtered (no SQL engine needed)."""
    try:
        rows, cols = _selected(results, table, columns, where)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    rows = rows[:limit]
    if not columns:  # the default set, less the columns with nothing to show
        cols = [c for c in cols if any(_cell(r[c]) not in ("", "-") for r in rows)] or cols
    if csv:
        import csv as _csv
        import sys

        w = _csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([r[c] for c in cols])
        return
    out = FitTable(title=f"{find_results(results)}: {table} ({len(rows)} rows shown)")
    for c in cols:
        out.add_column(
            SHORT_HEADERS.get(c, c),
            justify="left" if isinstance(rows[0][c] if rows else "", str) else "right",
        )
    for r in rows:
        out.add_row(*(_shown(c, r[c]) for c in cols))
    console().print(out)


def _selected(
    results: Path, table: str, columns: str | None, where: list[str] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``table`` that pass the ``--where`` filters, and the columns to show
    (``--columns``, or the table's main ones); a column it lacks is a ConfigError."""
    t = read_table(results, table)
    names = t.column_names
    cols = [c.strip() for c in columns.split(",")] if columns else _default_columns(table, names)
    for c in cols:
        if c not in names:
            raise ConfigError(f"--columns: no column '{c}' in {table}; it has: {', '.join(names)}")
    rows = t.to_pylist()
    for cond in where or ():
        key, eq, value = cond.partition("=")
        if not eq or key not in names:
            raise ConfigError(f"--where {cond!r}: expected column=value with a column of {table}")
        rows = [r for r in rows if str(r[key]) == value]
    return rows, cols


#: the headers of ``results show`` tables for long column names (so a table of the
#: default columns fits 80 columns; CSV output keeps the column names)
SHORT_HEADERS = {
    "capacity_blocks": "blocks",
    "capacity_bytes": "bytes",
    "token_hit_ratio": "token hit",
    "request_hit_ratio": "req hit",
    "block_hit_ratio": "block hit",
    "flops_saved_ratio": "FLOPs saved",
    "mean_ttft_s": "TTFT mean s",
    "p50_ttft_s": "TTFT P50 s",
    "p95_ttft_s": "TTFT P95 s",
    "p99_ttft_s": "TTFT P99 s",
    "mean_prefill_s": "prefill mean s",
    "p95_prefill_s": "prefill P95 s",
    "num_requests": "requests",
}


def _shown(column: str, value: object) -> str:
    """A table cell: ratios to four places, seconds as the summary tables write them (at
    most six characters), other numbers to six significant digits; "-" for NaN."""
    if isinstance(value, float) and not math.isnan(value):
        if column.endswith("_ratio"):
            return f"{value:.4f}"
        if column.endswith("_s"):
            return secs(value)
    return _cell(value)


def _default_columns(table: str, names: list[str]) -> list[str]:
    wanted = {
        "results": [
            "variant",
            "capacity",
            "capacity_blocks",
            "policy",
            "seed",
            "token_hit_ratio",
            "request_hit_ratio",
            "flops_saved_ratio",
            "mean_ttft_s",
            "p95_ttft_s",
            "mean_prefill_s",
        ],
        "breakdown": [
            "capacity",
            "policy",
            "seed",
            "dimension",
            "group",
            "num_requests",
            "token_hit_ratio",
            "p95_ttft_s",
        ],
        "cdf": ["capacity", "policy", "seed", "quantile", "ttft_s", "prefill_s"],
    }.get(table, names[:10])
    return [c for c in wanted if c in names]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else str(value)


@results_app.command("query")
def results_query_cmd(
    results: Annotated[Path, typer.Argument(help="A results folder.")],
    sql: Annotated[
        str,
        typer.Argument(
            help="SQL over the tables results, breakdown, cdf, "
            'requests, e.g. "select policy, avg(token_hit_ratio) '
            'from results group by policy".'
        ),
    ],
    csv: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")] = False,
) -> None:
    """Run SQL (DuckDB) over a results folder's tables."""
    try:
        rows, names = query(results, sql)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    if csv:
        import csv as _csv
        import sys

        w = _csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(names)
        w.writerows(rows)
        return
    out = FitTable()
    for n in names:
        out.add_column(n)
    for r in rows:
        out.add_row(*(_cell(v) for v in r))
    console().print(out)


def schema_cmd(
    kind: Annotated[str, typer.Argument(help="experiment (prefix or hybrid cache) or experts.")],
) -> None:
    """Print the JSON Schema of a config file kind (for editors and validators)."""
    from prefixlab.studies import get_kind

    try:
        config = get_kind(kind).config
    except PrefixlabError as exc:
        fail(str(exc))
        return
    print_json(schema(config))


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
    app.command("sweep")(sweep_cmd)
    app.command("demo")(demo_cmd)
    app.add_typer(results_app, name="results")
    app.command("schema")(schema_cmd)
