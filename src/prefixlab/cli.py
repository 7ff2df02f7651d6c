"""Command-line interface: a thin shell (parse -> build -> run -> write)."""

from __future__ import annotations

import csv
import dataclasses
import inspect
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from prefixlab import (
    cli_analyze,
    cli_engine,
    cli_experiments,
    cli_experts,
    cli_lpc,
    cli_report,
    cli_reproduce,
)
from prefixlab.analysis import trace_stats
from prefixlab.cli_common import (
    BlockTokensOpt,
    CapacityBytesOpt,
    FitTable,
    FormatOpt,
    QuietOpt,
    TraceArg,
    block_tokens_of,
    console,
    each_policy,
    fail,
    guard_interrupts,
    load_shown,
    make_policies,
    progress_bar,
    resolve_capacity_blocks,
    warn,
    with_loader_options,
)
from prefixlab.cli_root import root
from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.io import temp_beside
from prefixlab.policies.base import describe, parameters, registered
from prefixlab.runner.hybrid import HybridConfig, HybridResult, replay_hybrid
from prefixlab.runner.replay import (
    ReplayConfig,
    ReplayResult,
    capped_message,
    capped_warning,
    replay,
)
from prefixlab.runner.stream import NotStreamable, StreamSummary, peek, replay_stream, streamable
from prefixlab.workload.generators import GENERATORS, GeneratorInfo
from prefixlab.workload.loaders.base import iter_chunks
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.loaders.parquet import write_parquet
from prefixlab.workload.trace import Trace

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Simulate and compare cache policies for LLM serving.",
)


app.callback()(root)  # --version


class PerRequestFiles:
    """Per-request CSVs (index,hit_tokens,input_tokens), one per policy: ``path`` itself
    for one policy, ``<stem>.<policy><suffix>`` beside it for several. Rows are written as
    they come (a streamed replay hands them a chunk at a time) to temp files beside their
    targets, renamed by :meth:`close` when the run is complete and removed by
    :meth:`abort` when it is not, so a failed run leaves no partial file."""

    def __init__(self, path: Path, specs: Sequence[str]) -> None:
        if not path.parent.resolve().is_dir():
            raise ConfigError(f"--per-request: folder {path.parent} does not exist")
        self.targets = [path]
        if len(specs) > 1:
            self.targets = []
            for spec in specs:
                safe = spec.replace(":", "_").replace(",", "_").replace("=", "-")
                self.targets.append(path.with_name(f"{path.stem}.{safe}{path.suffix or '.csv'}"))
        for target in self.targets:
            if target.is_dir():
                raise ConfigError(f"--per-request: {target} is a folder, not a file")
        self._tmps: list[Path] = []
        self._files: list[Any] = []
        try:
            for target in self.targets:
                fd, tmp = temp_beside(target)  # the umask's mode
                self._tmps.append(tmp)
                fh = os.fdopen(fd, "w", newline="")
                self._files.append((fh, csv.writer(fh)))
                self._files[-1][1].writerow(["index", "hit_tokens", "input_tokens"])
        except BaseException:
            self.abort()
            raise

    def rows(self, i: int, start: int, hits: Any, inputs: Any) -> None:
        """Policy i's rows for requests start, start + 1, ... (hit and input tokens)."""
        self._files[i][1].writerows(
            zip(range(start, start + len(hits)), hits.tolist(), inputs.tolist(), strict=True)
        )

    def close(self) -> list[Path]:
        """Every file complete: renamed to its target; returns the targets. If a rename
        fails, the temp files still there go (those already renamed stay complete)."""
        try:
            for fh, _ in self._files:
                fh.close()
            while self._tmps:
                os.replace(self._tmps[0], self.targets[len(self.targets) - len(self._tmps)])
                self._tmps.pop(0)
        except BaseException:
            self.abort()
            raise
        return list(self.targets)

    def abort(self) -> None:
        """The run failed: its temp files go."""
        for fh, _ in self._files:
            fh.close()
        for tmp in self._tmps:
            tmp.unlink(missing_ok=True)
        self._tmps = []


def _write_per_request(path: Path, results: Sequence[ReplayResult | HybridResult]) -> list[Path]:
    """Per-request CSVs of finished runs (one per policy)."""
    files = PerRequestFiles(path, [res.policy for res in results])
    try:
        for i, res in enumerate(results):
            files.rows(i, 0, res.hit_tokens, res.input_tokens)
    except BaseException:
        files.abort()
        raise
    return files.close()


def _result_table(rows: list[dict[str, Any]]) -> Table:
    """The replay table; the structure goes to the title when every row shares it."""
    structures = sorted({row["structure"] for row in rows})
    one = len(structures) == 1
    title = f"prefix cache replay ({structures[0]} structure)" if one else "prefix cache replay"
    table = FitTable(title=title, show_lines=False)
    cols = [("policy", "policy", "{}")]
    if not one:
        cols.append(("structure", "structure", "{}"))
    cols += [
        ("capacity_blocks", "blocks", "{:,}"),
        ("token_hit_ratio", "token hit", "{:.4f}"),
        ("request_hit_ratio", "req hit", "{:.4f}"),
        ("block_hit_ratio", "block hit", "{:.4f}"),
        ("num_evictions", "evicted", "{:,}"),
        ("elapsed_s", "time s", "{:.2f}"),
        ("blocks_per_s", "blocks/s", "{:,.0f}"),
    ]
    for _, title, _ in cols:
        table.add_column(title, justify="left" if title in ("policy", "structure") else "right")
    for row in rows:
        table.add_row(*(fmt.format(row[key]) for key, _, fmt in cols))
    return table


@app.command("replay")
@with_loader_options
def replay_cmd(
    trace: TraceArg,
    policy: Annotated[
        list[str], typer.Option("--policy", "-p", help="Policy spec (repeatable), e.g. lru.")
    ],
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    capacity_blocks: Annotated[int | None, typer.Option(help="Cache capacity in blocks.")] = None,
    capacity_bytes: CapacityBytesOpt = None,
    model: Annotated[str | None, typer.Option(help="Model preset for byte sizes.")] = None,
    structure: Annotated[
        str,
        typer.Option(
            help="Cache structure: block, radix, or hybrid (KV + SSM states; needs --model "
            "and --capacity-bytes; policies vanilla, vllm+, sglang+, marconi)."
        ),
    ] = "block",
    max_free_blocks: Annotated[
        int | None, typer.Option(help="Bound on cached unreferenced blocks (block cache).")
    ] = None,
    cache_partial: Annotated[
        bool, typer.Option(help="Also cache each sequence's trailing partial block.")
    ] = False,
    min_recompute_tokens: Annotated[
        int, typer.Option(help="Tokens of each prompt always recomputed (vLLM: 1).")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list.")] = False,
    per_request: Annotated[
        Path | None, typer.Option(help="Write per-request CSV (index,hit_tokens,input_tokens).")
    ] = None,
    stream: Annotated[
        bool,
        typer.Option(
            help="Read a large trace file in chunks when its format and the policies allow "
            "(memory bounded by the cache, not the trace; same results); --no-stream loads "
            "it whole."
        ),
    ] = True,
    quiet: QuietOpt = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Replay a trace through a prefix cache under each policy and compare hit ratios."""
    if structure == "hybrid":
        _replay_hybrid_cmd(
            trace,
            fmt,
            load or {},
            policy,
            model,
            capacity_bytes,
            capacity_blocks,
            as_json,
            per_request,
            quiet,
        )
        return

    def config_for(bt: int) -> ReplayConfig:
        config = ReplayConfig(
            capacity_blocks=resolve_capacity_blocks(capacity_blocks, capacity_bytes, model, bt),
            structure=structure,
            block_tokens=block_tokens,
            max_free_blocks=max_free_blocks,
            cache_partial=cache_partial,
            min_recompute_tokens=min_recompute_tokens,
            model=model,
        )
        config.validate()
        return config

    try:
        kwargs = load or {}
        streamed = None
        if stream:
            streamed = _replay_streamed(
                trace, fmt, kwargs, policy, block_tokens, config_for, quiet, per_request
            )
        if streamed is not None:
            results, seen, written = streamed
            about = (seen.name, seen.num_requests, seen.num_input_tokens)
        else:
            tr = load_shown(trace, fmt, kwargs, quiet)
            bt = block_tokens_of(tr, block_tokens)
            config = config_for(bt)
            policies = make_policies(policy, structure)
            note = capped_warning(tr, bt, min_recompute_tokens)
            if note:
                warn(note)
            if per_request is not None and not per_request.parent.resolve().is_dir():
                raise ConfigError(f"--per-request: folder {per_request.parent} does not exist")
            results = each_policy(policies, lambda pol: replay(tr, pol, config), quiet)
            about = (tr.name, len(tr), int(tr.input_length.sum()))
            written = _write_per_request(per_request, results) if per_request else []
    except PrefixlabError as exc:
        fail(str(exc))
        return
    rows = [r.as_dict() for r in results]
    _print_replay(rows, as_json, _result_table, [], about, written)


def _replay_streamed(
    trace: str,
    fmt: str,
    kwargs: dict[str, Any],
    specs: list[str],
    block_tokens: int | None,
    config_for: Callable[[int], ReplayConfig],
    quiet: bool,
    per_request: Path | None = None,
) -> tuple[list[ReplayResult], StreamSummary, list[Path]] | None:
    """``replay`` of a trace file read in chunks (``runner.stream``), with the per-request
    files written as it goes, or None when it cannot be streamed: then the caller loads
    the file whole, which sorts it or names a bad line."""
    if trace.startswith("gen:"):
        return None
    chunks = iter_chunks(trace, fmt, **kwargs)
    if chunks is None:
        return None
    size = max(Path(trace).stat().st_size, 1) if Path(trace).is_file() else 1
    with progress_bar("replay (streamed, MB)", quiet) as advance:
        try:
            first = peek(chunks)
            if first is None:  # nothing kept: the whole-file loader says why
                return None
            config = config_for(block_tokens_of(first[0], block_tokens))
            policies = make_policies(specs, config.structure)
            if not all(streamable(pol, config) for pol in policies):
                return None

            def on_chunk(requests: int, nbytes: int) -> None:
                if advance is not None and nbytes > 0:
                    advance(nbytes >> 20, size >> 20, f"{requests:,} requests")
                elif advance is not None:  # a loader that cannot tell how far it is
                    advance(0, None, f"{requests:,} requests")

            files = None
            if per_request is not None:
                files = PerRequestFiles(per_request, [pol.spec() for pol in policies])
            try:
                results, seen = replay_stream(
                    first[1],
                    policies,
                    config,
                    on_chunk,
                    on_rows=None if files is None else files.rows,
                )
            except BaseException:
                if files is not None:
                    files.abort()
                raise
            written = [] if files is None else files.close()
        except NotStreamable:
            return None
    note = capped_message(
        seen.num_capped, seen.num_requests, seen.block_tokens, config.min_recompute_tokens
    )
    if note:
        warn(note)
    return results, seen, written


def _print_replay(
    rows: list[dict[str, Any]],
    as_json: bool,
    table: Callable[[list[dict[str, Any]]], Table],
    notes: list[str],
    about: tuple[str, int, int],
    written: list[Path],
) -> None:
    """What ``replay`` prints: one JSON list, or the table, notes, trace and files;
    ``about``: the trace's name, requests and input tokens."""
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    out = console()
    out.print(table(rows))
    for line in notes:
        out.print(line)
    name, n, total = about
    out.print(f"trace: {name} ({n:,} requests, {total:,} input tokens)")
    for path in written:
        out.print(f"per-request detail: {path}")


def _hybrid_table(rows: list[dict[str, Any]]) -> Table:
    gb = rows[0]["capacity_bytes"] / 1e9
    table = FitTable(title=f"hybrid cache replay ({rows[0]['model']}, {gb:,.1f} GB)")
    cols = [
        ("policy", "policy", "{}"),
        ("token_hit_ratio", "token hit", "{:.4f}"),
        ("request_hit_ratio", "request hit", "{:.4f}"),
        ("flops_saved_ratio", "FLOPs saved", "{:.1%}"),
        ("num_checkpoints_written", "states written", "{:,}"),
        ("num_evicted_nodes", "evictions", "{:,}"),
        ("elapsed_s", "time (s)", "{:.2f}"),
    ]
    for _, title, _ in cols:
        table.add_column(title, justify="left" if title == "policy" else "right")
    for row in rows:
        table.add_row(*(f.format(row[k]) for k, _, f in cols))
    return table


def _replay_hybrid_cmd(
    trace: str,
    fmt: str,
    load: dict[str, Any],
    policy: list[str],
    model: str | None,
    capacity_bytes: int | None,
    capacity_blocks: int | None,
    as_json: bool,
    per_request: Path | None,
    quiet: bool,
) -> None:
    """``replay --structure hybrid``: Marconi's contract, one byte budget for KV and states."""
    try:
        if capacity_blocks is not None:
            raise ConfigError("the hybrid structure's capacity is in bytes: give --capacity-bytes")
        if capacity_bytes is None or model is None:
            raise ConfigError("--structure hybrid needs --model and --capacity-bytes")
        config = HybridConfig(capacity_bytes=capacity_bytes, model=model)
        config.validate()
        policies = make_policies(policy, "hybrid")
        if per_request is not None and not per_request.parent.resolve().is_dir():
            raise ConfigError(f"--per-request: folder {per_request.parent} does not exist")
        tr = load_shown(trace, fmt, load, quiet)
        results = each_policy(policies, lambda pol: replay_hybrid(tr, pol, config), quiet)
        written = _write_per_request(per_request, results) if per_request else []
    except PrefixlabError as exc:
        fail(str(exc))
        return
    rows = [r.as_dict() for r in results]
    notes = [
        f"{r['policy']}: alpha tuned to {r['alpha']:g} (after request {r['alpha_history'][0][0]})"
        for r in rows
        if "alpha_history" in r
    ]
    about = (tr.name, len(tr), int(tr.input_length.sum()))
    _print_replay(rows, as_json, _hybrid_table, notes, about, written)


def policies_markdown() -> str:
    """The docs' policy table, generated from the registry."""
    lines = [
        "| policy | structures | parameters | description |",
        "|---|---|---|---|",
    ]
    for name, cls in registered().items():
        params = ", ".join(f"`{k}={v}`" for k, v in parameters(cls).items()) or "-"
        lines.append(
            f"| `{name}` | {', '.join(sorted(cls.structures))} | {params} | {describe(cls)} |"
        )
    return "\n".join(lines) + "\n"


@app.command("policies")
def policies_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the docs table.")] = False,
) -> None:
    """List every registered policy with its parameters and a one-line description."""
    if markdown:
        sys.stdout.write(policies_markdown())
        return
    entries: list[dict[str, Any]] = [
        {
            "name": name,
            "structures": sorted(cls.structures),
            "parameters": dict(parameters(cls)),
            "description": describe(cls),
        }
        for name, cls in registered().items()
    ]
    if as_json:
        sys.stdout.write(json.dumps(entries, indent=2) + "\n")
        return
    table = FitTable(title="registered policies")
    for col in ("name", "structures", "parameters", "description"):
        table.add_column(col)
    for e in entries:
        params = ", ".join(f"{k}={v}" for k, v in e["parameters"].items()) or "-"
        table.add_row(str(e["name"]), ",".join(e["structures"]), params, str(e["description"]))
    console().print(table)


trace_app = typer.Typer(no_args_is_help=True, help="Inspect and convert traces.")
app.add_typer(trace_app, name="trace")


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
        sys.stdout.write(json.dumps(stats, indent=2) + "\n")
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
        _check_out(out, to)
        tr = load_shown(trace, fmt, kwargs)
        _write_trace(tr, out, to)
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
            _check_out(out, to)
            tr = info.fn(**given)
            _write_trace(tr, out, to)
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


def _check_out(out: Path, to: str | None) -> None:
    if not out.parent.resolve().is_dir():
        raise ConfigError(f"--out: folder {out.parent} does not exist")
    if to is not None and to not in ("native", "parquet"):
        raise ConfigError(f"--to must be native or parquet, got {to!r}")


def _write_trace(tr: Trace, out: Path, to: str | None = None) -> None:
    _check_out(out, to)
    if (to or ("parquet" if out.suffix == ".parquet" else "native")) == "parquet":
        write_parquet(tr, out)
    else:
        write_native(tr, out)


cli_engine.register(app)
cli_experiments.register(app)
cli_report.register(app)
cli_lpc.register(app)
cli_analyze.register(app)
cli_experts.register(app)
cli_reproduce.register(app)
guard_interrupts(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
