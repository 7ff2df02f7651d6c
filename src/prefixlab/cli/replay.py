"""CLI commands ``replay`` and ``policies``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from prefixlab.cli.common import (
    AdmissionOpt,
    Advance,
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
    load_shown,
    make_policies,
    print_json,
    progress_bar,
    resolve_capacity_blocks,
    warn,
    with_loader_options,
)
from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.metrics.per_request import PerRequestFiles, write_per_request
from prefixlab.policies.base import EvictionPolicy, catalog, catalog_markdown
from prefixlab.policies.block_admission import check_structure
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.runner.replay import (
    ReplayConfig,
    ReplayResult,
    capped_message,
    capped_warning,
    replay,
)
from prefixlab.runner.stream import NotStreamable, StreamSummary, peek, replay_stream, streamable
from prefixlab.workload.loaders.base import iter_chunks
from prefixlab.workload.sources import TIME_OPTIONS
from prefixlab.workload.trace import Trace


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


_PolicyOpt = Annotated[
    list[str], typer.Option("--policy", "-p", help="Policy spec (repeatable), e.g. lru.")
]
_CapacityBlocksOpt = Annotated[int | None, typer.Option(help="Cache capacity in blocks.")]
_ModelOpt = Annotated[str | None, typer.Option(help="Model preset for byte sizes.")]
_StructureOpt = Annotated[
    str,
    typer.Option(
        help="Cache structure: block, radix, or hybrid (KV + SSM states; needs --model "
        "and --capacity-bytes; policies vanilla, vllm+, sglang+, marconi)."
    ),
]
_MaxFreeBlocksOpt = Annotated[
    int | None, typer.Option(help="Bound on cached unreferenced blocks (block cache).")
]
_CachePartialOpt = Annotated[
    bool, typer.Option(help="Also cache each sequence's trailing partial block.")
]
_MinRecomputeOpt = Annotated[
    int, typer.Option(help="Tokens of each prompt always recomputed (vLLM: 1).")
]
_JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON list.")]
_PerRequestOpt = Annotated[
    Path | None, typer.Option(help="Write per-request CSV (index,hit_tokens,input_tokens).")
]
_StreamOpt = Annotated[
    bool,
    typer.Option(
        help="Read a large trace file in chunks when its format and the policies allow "
        "(memory bounded by the cache, not the trace; same results); --no-stream loads "
        "it whole."
    ),
]


@with_loader_options
def replay_cmd(
    trace: TraceArg,
    policy: _PolicyOpt,
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    capacity_blocks: _CapacityBlocksOpt = None,
    capacity_bytes: CapacityBytesOpt = None,
    model: _ModelOpt = None,
    structure: _StructureOpt = "block",
    max_free_blocks: _MaxFreeBlocksOpt = None,
    cache_partial: _CachePartialOpt = False,
    min_recompute_tokens: _MinRecomputeOpt = 1,
    admission: AdmissionOpt = "all",
    as_json: _JsonOpt = False,
    per_request: _PerRequestOpt = None,
    stream: _StreamOpt = True,
    quiet: QuietOpt = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Replay a trace through a prefix cache under each policy and compare hit ratios."""
    source = (trace, fmt, load or {})
    if structure == "hybrid":
        try:
            check_structure(admission, structure)
        except PrefixlabError as exc:
            fail(str(exc))
        _replay_hybrid_cmd(
            source, policy, model, capacity_bytes, capacity_blocks, as_json, per_request, quiet
        )
        return
    config_for = _config_maker(
        capacity_blocks,
        capacity_bytes,
        model,
        structure,
        block_tokens,
        max_free_blocks,
        cache_partial,
        min_recompute_tokens,
        admission,
    )
    try:
        results, about, written = _replay_results(
            source, policy, block_tokens, config_for, quiet, per_request, stream
        )
    except PrefixlabError as exc:
        fail(str(exc))
        return
    rows = [r.as_dict() for r in results]
    _print_replay(rows, as_json, _result_table, [], about, written)


def _config_maker(
    capacity_blocks: int | None,
    capacity_bytes: int | None,
    model: str | None,
    structure: str,
    block_tokens: int | None,
    max_free_blocks: int | None,
    cache_partial: bool,
    min_recompute_tokens: int,
    admission: str = "all",
) -> Callable[[int], ReplayConfig]:
    """The replay's settings for the trace's block size, checked, from the options."""

    def config_for(bt: int) -> ReplayConfig:
        config = ReplayConfig(
            capacity_blocks=resolve_capacity_blocks(capacity_blocks, capacity_bytes, model, bt),
            structure=structure,
            block_tokens=block_tokens,
            max_free_blocks=max_free_blocks,
            cache_partial=cache_partial,
            min_recompute_tokens=min_recompute_tokens,
            model=model,
            admission=admission,
        )
        config.validate()
        return config

    return config_for


def _replay_results(
    source: tuple[str, str, dict[str, Any]],
    specs: list[str],
    block_tokens: int | None,
    config_for: Callable[[int], ReplayConfig],
    quiet: bool,
    per_request: Path | None,
    stream: bool,
) -> tuple[list[ReplayResult], tuple[str, int, int], list[Path]]:
    """Each policy's replay of the trace ``source`` (its path, format and loader keywords),
    streamed when it can be, else loaded whole; with the trace's name, requests and input
    tokens, and the per-request files written."""
    trace, fmt, kwargs = source
    streamed = None
    if stream:
        streamed = _replay_streamed(
            trace, fmt, kwargs, specs, block_tokens, config_for, quiet, per_request
        )
    if streamed is not None:
        results, seen, written = streamed
        return results, (seen.name, seen.num_requests, seen.num_input_tokens), written
    tr = load_shown(trace, fmt, kwargs, quiet)
    bt = block_tokens_of(tr, block_tokens)
    config = config_for(bt)
    policies = make_policies(specs, config.structure, EvictionPolicy)
    note = capped_warning(tr, bt, config.min_recompute_tokens)
    if note:
        warn(note)
    if per_request is not None and not per_request.parent.resolve().is_dir():
        raise ConfigError(f"--per-request: folder {per_request.parent} does not exist")
    results = each_policy(policies, lambda pol: replay(tr, pol, config), quiet)
    about = (tr.name, len(tr), int(tr.input_length.sum()))
    written = write_per_request(per_request, results) if per_request else []
    return results, about, written


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
    if trace.startswith("gen:") or any(k in kwargs for k in TIME_OPTIONS):
        return None  # (retiming needs the whole trace's span)
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
            policies = make_policies(specs, config.structure, EvictionPolicy)
            if not all(streamable(pol, config) for pol in policies):
                return None
            on_chunk = _chunk_reporter(advance, size)
            results, seen, written = _stream_policies(
                first[1], policies, config, on_chunk, per_request
            )
        except NotStreamable:
            return None
    note = capped_message(
        seen.num_capped, seen.num_requests, seen.block_tokens, config.min_recompute_tokens
    )
    if note:
        warn(note)
    return results, seen, written


def _chunk_reporter(advance: Advance | None, size: int) -> Callable[[int, int], None]:
    """Feeds the progress bar with the megabytes read of a file of ``size`` bytes."""

    def on_chunk(requests: int, nbytes: int) -> None:
        if advance is not None and nbytes > 0:
            advance(nbytes >> 20, size >> 20, f"{requests:,} requests")
        elif advance is not None:  # a loader that cannot tell how far it is
            advance(0, None, f"{requests:,} requests")

    return on_chunk


def _stream_policies(
    chunks: Iterator[tuple[Trace, int]],
    policies: list[EvictionPolicy],
    config: ReplayConfig,
    on_chunk: Callable[[int, int], None],
    per_request: Path | None,
) -> tuple[list[ReplayResult], StreamSummary, list[Path]]:
    """``replay_stream``, writing the per-request files as it goes (none left half-written
    when it fails)."""
    files = None
    if per_request is not None:
        files = PerRequestFiles(per_request, [pol.spec() for pol in policies])
    try:
        results, seen = replay_stream(
            chunks,
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
        print_json(rows)
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
    source: tuple[str, str, dict[str, Any]],
    policy: list[str],
    model: str | None,
    capacity_bytes: int | None,
    capacity_blocks: int | None,
    as_json: bool,
    per_request: Path | None,
    quiet: bool,
) -> None:
    """``replay --structure hybrid``: Marconi's contract, one byte budget for KV and states;
    ``source``: the trace's path, format and loader keywords."""
    trace, fmt, load = source
    try:
        if capacity_blocks is not None:
            raise ConfigError("the hybrid structure's capacity is in bytes: give --capacity-bytes")
        if capacity_bytes is None or model is None:
            raise ConfigError("--structure hybrid needs --model and --capacity-bytes")
        config = HybridConfig(capacity_bytes=capacity_bytes, model=model)
        config.validate()
        from prefixlab.policies.hybrid import HybridPolicy

        policies = make_policies(policy, "hybrid", HybridPolicy)
        if per_request is not None and not per_request.parent.resolve().is_dir():
            raise ConfigError(f"--per-request: folder {per_request.parent} does not exist")
        tr = load_shown(trace, fmt, load, quiet)
        results = each_policy(policies, lambda pol: replay_hybrid(tr, pol, config), quiet)
        written = write_per_request(per_request, results) if per_request else []
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


def policies_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the docs table.")] = False,
) -> None:
    """List every registered policy with its parameters and a one-line description."""
    if markdown:
        sys.stdout.write(catalog_markdown())
        return
    entries = catalog()
    if as_json:
        print_json(entries)
        return
    table = FitTable(title="registered policies")
    for col in ("name", "structures", "parameters", "description"):
        table.add_column(col)
    for e in entries:
        params = ", ".join(f"{k}={v}" for k, v in e["parameters"].items()) or "-"
        table.add_row(str(e["name"]), ",".join(e["structures"]), params, str(e["description"]))
    console().print(table)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
    app.command("policies")(policies_cmd)
