"""What the CLI's commands share: consoles, errors, common options and their parsing."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import sys
import typing
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text

from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.experiments.execute import BACKENDS
from prefixlab.experiments.summary import Summary
from prefixlab.model import capacity_blocks_for_bytes
from prefixlab.policies.base import PolicyT, make_policy_of
from prefixlab.registry import parse_spec
from prefixlab.workload.idcheck import IdConflictWarning
from prefixlab.workload.loaders.base import LOADERS
from prefixlab.workload.trace import Trace

err = Console(stderr=True)


def console() -> Console:
    """Standard output: the terminal's width; piped, ``COLUMNS`` when set, else 140 columns
    (rich assumes 80 off a terminal). Text lines are not wrapped (a path stays whole, to
    copy); tables fit the width."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console(soft_wrap=True)
    return Console(width=140, soft_wrap=True)


class FitTable(Table):
    """A table made for an 80-column terminal: no outer frame, and no column narrower than
    its widest word, so a number or a name is never cut ("200,0..."). When the table is
    wider than the terminal, the columns of single words (numbers, names) take exactly
    their widest cell (their headers wrap), and the columns of sentences share the rest,
    each at least its widest word."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("box", box.SIMPLE_HEAD)
        kwargs.setdefault("show_edge", False)
        kwargs.setdefault("pad_edge", False)
        kwargs.setdefault("padding", (0, 1, 0, 0))  # columns two spaces apart
        super().__init__(*args, **kwargs)
        #: per column: its widest cell, and whether every cell is a single word
        self._natural: list[int] = []
        self._single: list[bool] = []

    def add_column(self, header: Any = "", *args: Any, **kwargs: Any) -> None:
        super().add_column(header, *args, **kwargs)
        self._natural.append(0)
        self._single.append(True)
        _widen(self.columns[-1], header)

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for i, (column, cell) in enumerate(zip(self.columns, renderables, strict=False)):
            _widen(column, cell)
            if isinstance(cell, str):
                plain = Text.from_markup(cell).plain.strip()
                self._natural[i] = max(self._natural[i], cell_len(plain))
                self._single[i] = self._single[i] and " " not in plain

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self._width(console, options) > options.max_width:
            self._fit(console, options)
        yield from super().__rich_console__(console, options)

    def _width(self, console: Console, options: ConsoleOptions) -> int:
        """The table's width with no limit (its columns' fixed widths, where set)."""
        return Measurement.get(console, options.update_width(1 << 16), self).maximum

    def _fit(self, console: Console, options: ConsoleOptions) -> None:
        """Fixed widths for every column that fit the terminal, if the widest words do."""
        cols = self.columns
        lows = [c.min_width or 0 for c in cols]
        highs = [max(n, low) for n, low in zip(self._natural, lows, strict=True)]
        for column, low, high, one in zip(cols, lows, highs, self._single, strict=True):
            column.width = high if one else low
        spare = options.max_width - self._width(console, options)
        if spare < 0:  # even the widest words do not fit: rich's own squeeze
            for column in cols:
                column.width = None
            return
        wrap = [i for i, one in enumerate(self._single) if not one]
        want = sum(highs[i] - lows[i] for i in wrap) or 1
        for i in wrap:
            cols[i].width = lows[i] + min(highs[i] - lows[i], spare * (highs[i] - lows[i]) // want)


def cell(value: Any, fmt: Callable[[Any], str]) -> str:
    """A table cell: ``fmt(value)``, or "-" for a missing value (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt(value)


def secs(value: float) -> str:
    """Seconds in at most six characters, four significant digits up to 999 s: 0.785, 2.23,
    21.3, 213, 1,234 (a latency table then fits 80 columns); "-" for NaN or None."""
    if value is None or math.isnan(value):
        return "-"
    if value < 1:
        return f"{value:.3f}"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


#: how each form of summary column is written (:data:`prefixlab.experiments.summary.FORMS`)
FORMATS: dict[str, Callable[[Any], str]] = {
    "text": str,
    "count": "{:,}".format,
    "ratio": "{:.4f}".format,
    "percent": "{:.1%}".format,
    "secs": secs,
}


def summary_table(summary: Summary) -> Table:
    """A study's summary (any kind) as a table fitting the terminal: a section per group,
    each group's best value in bold green."""
    table = FitTable(title=summary.title)
    for col in summary.columns:
        table.add_column(col.header, justify="left" if col.form == "text" else "right")
    best = summary.best_rows()
    last: tuple[object, ...] | None = None
    for i, row in enumerate(summary.rows):
        key = summary.section(row)
        if last is not None and key != last:
            table.add_section()
        last = key
        cells = []
        for col in summary.columns:
            text = escape(cell(row[col.key], FORMATS[col.form]))
            if i in best and col.key == summary.best:
                text = f"[bold green]{text}[/]"
            cells.append(text)
        table.add_row(*cells)
    return table


def _widen(column: Column, cell: Any) -> None:
    """No narrower than the cell's widest word (a str cell; rich markup allowed)."""
    if isinstance(cell, str):
        plain = Text.from_markup(cell).plain
        widest = max((cell_len(word) for word in plain.split()), default=0)
        column.min_width = max(column.min_width or 0, widest)


#: advance(done, total, description): where a long loop reports how far it is
Advance = Callable[[int, int | None, str], None]

QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bars (for scripts and logs).")
]

# the options of a sweep (prefixlab sweep, compare, experts sweep)
ResultsOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="Results folder (default results/NAME).")
]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="Worker processes (or Ray CPUs).")]
BackendOpt = Annotated[str, typer.Option(help=f"Where cells run: {', '.join(BACKENDS)}.")]
AddressOpt = Annotated[
    str | None, typer.Option(help="Ray cluster to join (auto, ray://host:10001).")
]
DetailOpt = Annotated[bool, typer.Option("--detail", help="Also store per-request rows.")]
QuietPathOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress or table: print the results path.")
]
ReportOpt = Annotated[bool, typer.Option(help="Write report.html beside the results.")]


@contextmanager
def progress_bar(what: str, quiet: bool = False) -> Iterator[Advance | None]:
    """A progress bar on stderr for a long loop; None with --quiet or off a terminal (so
    logs and pipes stay clean)."""
    if quiet or not err.is_terminal:
        yield None
        return
    bar = Progress(
        TextColumn(f"[bold]{escape(what)}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=True,
    )
    task = bar.add_task("", total=None)

    def advance(done: int, total: int | None, description: str = "") -> None:
        bar.update(task, completed=done, total=total, description=escape(description))

    with bar:
        yield advance


def load_shown(trace: str, fmt: str, kwargs: dict[str, Any], quiet: bool = False) -> Trace:
    """``open_trace``, with a progress bar over the file's megabytes from the first second
    (formats read front to back report as they go; the others show the time spent)."""
    from pathlib import Path

    from prefixlab.workload.loaders.base import load_progress
    from prefixlab.workload.sources import open_trace

    path = Path(trace)
    name = path.name if not trace.startswith("gen:") else trace
    with progress_bar(f"loading {name} (MB)", quiet) as advance:

        def report(done: int, total: int) -> None:
            if advance is not None:
                advance(done >> 20, total >> 20, "")

        with load_progress(report if advance is not None else None):
            return open_trace(trace, fmt, **kwargs)


R = typing.TypeVar("R")


def each_policy(policies: list[PolicyT], run: Callable[[PolicyT], R], quiet: bool) -> list[R]:
    """``run`` for each policy, in order, with a progress bar over the policies."""
    results = []
    with progress_bar("policies", quiet) as advance:
        for i, pol in enumerate(policies):
            if advance is not None:
                advance(i, len(policies), pol.spec())
            results.append(run(pol))
    return results


# Options shared by several commands.
TraceArg = Annotated[str, typer.Argument(help="Trace file, or gen:NAME[:k=v,...] to generate.")]
FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help=f"Trace format: {', '.join(sorted(LOADERS))}.")
]
BlockTokensOpt = Annotated[int | None, typer.Option(help="Tokens per block (token-form traces).")]
LimitOpt = Annotated[int | None, typer.Option(help="Keep at most this many requests.")]
AdmissionOpt = Annotated[
    str,
    typer.Option(
        help="Which new blocks the block or radix cache keeps: all (every engine), or "
        "seen:n=2 (a block from its n-th computation); see docs/policies.md."
    ),
]


def parse_size(text: str) -> int:
    """A size in bytes as the command line gives it: a number of bytes, or one with a unit
    (``8GB`` = 8e9, ``8GiB`` = 8 * 2**30), as experiment configs take capacities."""
    from prefixlab.configfile import parse_bytes

    t = text.strip()
    size = int(t) if t.isdigit() else parse_bytes(t)
    if size is None or size <= 0:
        raise typer.BadParameter(
            f"{text!r} is not a size: give bytes (8000000000) or a number with a unit "
            "(8GB, 8GiB, 512MiB)"
        )
    return size


CapacityBytesOpt = Annotated[
    int | None,
    typer.Option(
        parser=parse_size,
        metavar="SIZE",
        help="Cache capacity in bytes, or with a unit: 8GB, 8GiB (needs --model).",
    ),
]
SampleOpt = Annotated[
    float | None, typer.Option(help="Keep this fraction of sessions (whole sessions, seeded).")
]
SampleSeedOpt = Annotated[int, typer.Option(help="Seed of --sample.")]
StartOpt = Annotated[float | None, typer.Option(help="Keep arrivals at or after this time (s).")]
EndOpt = Annotated[float | None, typer.Option(help="Keep arrivals before this time (s).")]
TimeScaleOpt = Annotated[
    float | None,
    typer.Option(help="Multiply the time between arrivals (0.1: ten times the load); any trace."),
]
RequestRateOpt = Annotated[
    float | None,
    typer.Option(help="Retime arrivals to this many requests per second over the trace's span."),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(help="Tokenizer for text formats: llama3, qwen3, cl100k, o200k, hf:PATH, ..."),
]
ArrivalOpt = Annotated[
    str | None,
    typer.Option(help="Arrival model for text formats, e.g. lpc:lambda_chat=100 or sessions."),
]
IdConflictsOpt = Annotated[
    str | None,
    typer.Option(
        "--id-conflicts",
        metavar="error|warn|ignore",
        help="A hash id under another parent than before: refuse the trace (error, the "
        "default), load it and warn with their count (warn), or do not check (ignore: no "
        "table of ids, a streamed replay's memory stays flat).",
    ),
]
LoadOpt = Annotated[
    list[str] | None,
    typer.Option("--load-opt", help="Other loader option key=value (repeatable), e.g. side=b."),
]


def load_kwargs(
    limit: int | None,
    sample: float | None,
    sample_seed: int,
    start_s: float | None,
    end_s: float | None,
    tokenizer: str | None,
    arrival: str | None,
    load_opt: list[str] | None,
    id_conflicts: str | None = None,
    time_scale: float | None = None,
    request_rate: float | None = None,
) -> dict[str, Any]:
    """Loader keywords from the shared options; only those the user gave."""
    kw: dict[str, Any] = {}
    for key, value in (
        ("limit", limit),
        ("sample", sample),
        ("start_s", start_s),
        ("end_s", end_s),
        ("time_scale", time_scale),
        ("request_rate", request_rate),
        ("tokenizer", tokenizer),
        ("arrival", arrival),
        ("id_conflicts", id_conflicts),
    ):
        if value is not None:
            kw[key] = value
    if sample is not None:
        kw["sample_seed"] = sample_seed
    for item in load_opt or ():
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"--load-opt expects key=value, got {item!r}")
        kw.update(parse_spec("opt:" + item, "--load-opt")[1])
    return kw


def block_tokens_of(tr: Trace, block_tokens: int | None) -> int:
    """The block size: the trace's own (hash form) or --block-tokens (token form)."""
    bt = tr.block_tokens if tr.is_hash_form else block_tokens
    if bt is None:
        raise ConfigError("this token-form trace needs --block-tokens")
    return bt


def print_json(doc: object) -> None:
    """``--json`` on every command: one JSON document on stdout, an array of rows or one
    object, indented. NaN and infinities (a TPOT with no second token, a ratio over
    nothing) are written as null, which JSON has; numpy scalars as numbers; anything else
    JSON lacks (paths, dates) as its text."""
    sys.stdout.write(json.dumps(_plain(doc), indent=2, allow_nan=False, default=str) + "\n")


def _plain(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item):  # a numpy scalar
        return _plain(item())
    return value


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def resolve_capacity_blocks(
    capacity_blocks: int | None, capacity_bytes: int | None, model: str | None, block_tokens: int
) -> int:
    if (capacity_blocks is None) == (capacity_bytes is None):
        raise ConfigError(
            "give exactly one of --capacity-blocks or --capacity-bytes (or neither, with "
            "--model and --gpu: the KV budget left after the weights)"
        )
    if capacity_blocks is not None:
        return capacity_blocks
    assert capacity_bytes is not None
    if model is None:
        raise ConfigError("--capacity-bytes needs --model to know the KV bytes per block")
    return capacity_blocks_for_bytes(capacity_bytes, model, block_tokens)


#: the options every trace-reading command takes, with their defaults
_LOADER_OPTIONS: dict[str, tuple[Any, Any]] = {
    "limit": (LimitOpt, None),
    "sample": (SampleOpt, None),
    "sample_seed": (SampleSeedOpt, 0),
    "start_s": (StartOpt, None),
    "end_s": (EndOpt, None),
    "time_scale": (TimeScaleOpt, None),
    "request_rate": (RequestRateOpt, None),
    "tokenizer": (TokenizerOpt, None),
    "arrival": (ArrivalOpt, None),
    "load_opt": (LoadOpt, None),
    "id_conflicts": (IdConflictsOpt, None),
}


def with_loader_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared loader flags (--limit, --sample, --start-s, --tokenizer...).

    The command declares a ``load: dict[str, Any]`` parameter instead of the eight flags; it
    receives the loader keywords the user gave (a bad ``--load-opt`` fails before it runs).
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    sig = inspect.signature(fn)
    params = [
        p.replace(annotation=hints[p.name]) for p in sig.parameters.values() if p.name != "load"
    ]
    params += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
        for name, (ann, default) in _LOADER_OPTIONS.items()
    ]

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> None:
        options = {
            name: kwargs.pop(name, default) for name, (_, default) in _LOADER_OPTIONS.items()
        }
        try:
            load = load_kwargs(**options)
        except PrefixlabError as exc:
            fail(str(exc))
            return
        with warnings.catch_warnings():
            # a trace loaded with --id-conflicts warn: one warning line, with the count
            warnings.simplefilter("always", IdConflictWarning)
            warnings.showwarning = _show_id_conflicts
            fn(*args, load=load, **kwargs)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return command


#: exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it)
INTERRUPTED = 130


def interrupted(message: str) -> typer.Exit:
    """Say what a Ctrl-C left behind, on stderr; raise the result (exit 130)."""
    err.print(f"[bold yellow]interrupted:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(INTERRUPTED)


def from_interrupt(exc: BaseException) -> bool:
    """Ctrl-C, or an error it caused: a ``KeyboardInterrupt`` raised while numba ran a
    compiled function's Python callback surfaces as a ``SystemError`` set on top of it."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextmanager
def resumable(folder: Path) -> Iterator[None]:
    """Within the block (a sweep into ``folder``), Ctrl-C says how many cells are saved and
    how to resume, and exits 130."""
    try:
        yield
    except BaseException as exc:
        if not from_interrupt(exc):
            raise
        saved = len(list((folder / "cells").glob("*.json")))
        cells = "1 finished cell is" if saved == 1 else f"{saved:,} finished cells are"
        raise interrupted(
            f"{cells} saved in {folder}; run the same command again to resume (finished "
            "cells are kept, only the others run)"
        ) from None


def guard_interrupts(group: typer.Typer) -> None:
    """Every command of ``group`` and its subgroups: Ctrl-C prints one line, not a
    traceback or click's "Aborted!", and exits 130. A command that saves as it goes
    (a sweep) says more, with :func:`resumable`, before this is reached."""
    for info in group.registered_commands:
        if info.callback is not None and not hasattr(info.callback, "__guarded__"):
            info.callback = _guarded(info.callback)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            guard_interrupts(sub.typer_instance)


def _guarded(fn: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except BaseException as exc:
            if not from_interrupt(exc):
                raise
            raise interrupted(
                "stopped before the end; no file of this run is half-written (each is "
                "written whole, or not at all): run it again"
            ) from None

    command.__guarded__ = True  # type: ignore[attr-defined]
    return command


def _show_id_conflicts(message: Warning | str, *args: Any, **kwargs: Any) -> None:
    warn(str(message))


def make_policies(specs: list[str], structure: str, kind: type[PolicyT]) -> list[PolicyT]:
    """The ``--policy`` options as policies of ``kind`` (:class:`EvictionPolicy` for the
    block and radix caches); one given twice is an error."""
    policies = [make_policy_of(kind, spec, structure) for spec in specs]
    names = [p.spec() for p in policies]
    if len(set(names)) != len(names):
        raise ConfigError(f"a policy is given twice: {', '.join(names)}")
    return policies
