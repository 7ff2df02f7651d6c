"""CLI commands of the engine runner: ``simulate`` and ``fit-timing``."""

from __future__ import annotations

from collections.abc import Callable
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
    cell,
    console,
    err,
    fail,
    load_shown,
    make_policies,
    print_json,
    progress_bar,
    resolve_capacity_blocks,
    secs,
    warn,
    with_loader_options,
)
from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.metrics.latency import overload
from prefixlab.model.fit import fit_csv
from prefixlab.model.timing import GPU_PRESETS, TimingModel, make_timing
from prefixlab.policies.base import Policy
from prefixlab.runner.engine import EngineConfig, EngineResult, simulate
from prefixlab.runner.engine.tiers import tier_of
from prefixlab.runner.fleet import FleetConfig, FleetResult, simulate_fleet
from prefixlab.runner.replay import capped_warning
from prefixlab.workload.trace import Trace

#: the fields ``--json`` adds to the replay fields (the issue's contract), in order
LATENCY_FIELDS = (
    "mean_ttft_s",
    "p50_ttft_s",
    "p95_ttft_s",
    "p99_ttft_s",
    "mean_prefill_s",
    "p50_prefill_s",
    "p95_prefill_s",
    "mean_queue_s",
    "mean_tpot_s",
    "throughput_tokens_per_s",
    "makespan_s",
)


_PolicyOpt = Annotated[list[str], typer.Option("--policy", "-p", help="Policy spec (repeatable).")]
_ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="Model: a preset (prefixlab models) or a config.json path (roofline, bytes)."
    ),
]
_GpuOpt = Annotated[str | None, typer.Option(help=f"GPU preset: {', '.join(GPU_PRESETS)}.")]
_TimingOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="Timing spec (repeatable or joined with +): power:a=..,b=..,c=.. | "
        "power:preset=llama-3.2-1b-a100 | roofline:mfu=0.5 | table:path=ttft.csv | "
        "tpot:s=0.02. Default with --model and --gpu: roofline."
    ),
]
_CapacityBlocksOpt = Annotated[int | None, typer.Option(help="KV pool size in blocks.")]
_StructureOpt = Annotated[
    str,
    typer.Option(
        help="Cache structure: block, radix, or hybrid (KV + SSM states in "
        "--capacity-bytes for --model; policies vanilla, vllm+, sglang+, marconi)."
    ),
]
_MaxNumSeqsOpt = Annotated[int, typer.Option(help="Running requests at most.")]
_MaxBatchedOpt = Annotated[int, typer.Option(help="Token budget per step.")]
_ChunkedOpt = Annotated[
    bool, typer.Option(help="Split long prompts across steps (vLLM's chunked prefill).")
]
_ClosedLoopOpt = Annotated[
    bool, typer.Option(help="Next turn arrives a think time after the previous finishes.")
]
_GatedOpt = Annotated[
    bool,
    typer.Option(
        help="A session's turn arrives at its trace time, but not before the previous "
        "turn finishes (UniCache's simulator)."
    ),
]
_MinRecomputeOpt = Annotated[int, typer.Option(help="Prompt tokens always run.")]
_JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON list.")]
_ByTaskOpt = Annotated[bool, typer.Option(help="Also print a per-task table.")]
_ReplicasOpt = Annotated[
    int, typer.Option(help="Engine replicas behind a router, each with the capacity given.")
]
_TierOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tier",
        help="A KV tier below GPU memory (repeatable, top down): cpu or store, then "
        "size=64GB (needs --model) or blocks=N, policy=lru, write=through|back, gbps=25, "
        "latency_s=0, admission=all; policy.KEY=V and admission.KEY=V set their parameters.",
    ),
]
_OverlapOpt = Annotated[
    bool, typer.Option(help="Tier loads run under the prefill of the rest of the prompt.")
]
_TpOpt = Annotated[
    int,
    typer.Option(
        "--tp",
        "--tensor-parallel-size",
        min=1,
        help="Tensor-parallel GPUs per replica: the roofline runs on tp GPUs, and without "
        "a --capacity-* the KV pool is what tp GPUs hold after the weights.",
    ),
]
_GpuUtilOpt = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=1.0,
        help="Without a --capacity-*: the fraction of GPU memory for weights and KV "
        "(vLLM's gpu_memory_utilization); the KV pool is the rest after the weights.",
    ),
]
_SlidingRuleOpt = Annotated[
    str,
    typer.Option(
        help="How the cache keeps a model's sliding-window layers: window (the engine's "
        "rule: on the block structure vLLM's hybrid KV-cache manager, on the radix one "
        "SGLang's SWA radix cache) or full (every layer of every block, vLLM's "
        "--disable-hybrid-kv-cache-manager).",
    ),
]
_RouterOpt = Annotated[
    str,
    typer.Option(
        help="How arrivals are routed (with --replicas): round-robin, random, session, "
        "least-loaded, power-of-two, cache-aware, kv-aware (name:key=value,...)."
    ),
]


#: the options ``simulate`` passes to EngineConfig as they are
_PASSED = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill",
    "closed_loop",
    "gated",
    "min_recompute_tokens",
    "admission",
    "load_overlap",
)
#: and those ``simulate`` passes as well (``plan`` fixes them)
_CONFIGURED = (*_PASSED, "structure", "block_tokens", "model", "sliding_window_rule")


@with_loader_options
def simulate_cmd(
    trace: TraceArg,
    policy: _PolicyOpt,
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    model: _ModelOpt = None,
    gpu: _GpuOpt = None,
    timing: _TimingOpt = None,
    capacity_blocks: _CapacityBlocksOpt = None,
    capacity_bytes: CapacityBytesOpt = None,
    tp: _TpOpt = 1,
    gpu_memory_utilization: _GpuUtilOpt = 0.9,
    structure: _StructureOpt = "block",
    sliding_window_rule: _SlidingRuleOpt = "window",
    max_num_seqs: _MaxNumSeqsOpt = 256,
    max_num_batched_tokens: _MaxBatchedOpt = 8192,
    chunked_prefill: _ChunkedOpt = True,
    closed_loop: _ClosedLoopOpt = False,
    gated: _GatedOpt = False,
    min_recompute_tokens: _MinRecomputeOpt = 1,
    admission: AdmissionOpt = "all",
    replicas: _ReplicasOpt = 1,
    router: _RouterOpt = "round-robin",
    tier: _TierOpt = None,
    load_overlap: _OverlapOpt = False,
    as_json: _JsonOpt = False,
    by_task: _ByTaskOpt = False,
    quiet: QuietOpt = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Simulate serving: continuous batching, a shared KV pool, TTFT / TPOT."""
    try:
        tr = load_shown(trace, fmt, load or {}, quiet)
        block_tokens, bt = _block_size(tr, structure, block_tokens)
        deploy = (gpu, tp, gpu_memory_utilization, quiet or as_json)
        blocks, size = _pool_size(structure, capacity_blocks, capacity_bytes, model, bt, deploy)
        passed = {k: v for k, v in locals().items() if k in _CONFIGURED}
        tiers = tuple(tier_of(t, model, bt) for t in tier or ())
        config = EngineConfig(blocks, capacity_bytes=size, tiers=tiers, **passed)
        timed = _timing_of(timing, model, gpu, tp)
        results = _simulate_each(tr, policy, config, timed, FleetConfig(replicas, router), quiet)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    _print_simulated(tr, results, as_json, by_task)


def _block_size(tr: Trace, structure: str, block_tokens: int | None) -> tuple[int | None, int]:
    """The block size asked for (the hybrid structure's default: 16, the size its running
    requests' KV is allocated in) and the one the run uses."""
    if structure == "hybrid" and block_tokens is None and not tr.is_hash_form:
        block_tokens = 16
    return block_tokens, block_tokens_of(tr, block_tokens)


def _timing_of(
    timing: list[str] | None, model: str | None, gpu: str | None, tp: int = 1
) -> TimingModel:
    """The timing model of --timing (a roofline of --model and --gpu by default, on --tp
    GPUs); warns when it leaves prefill or decode untimed."""
    if timing is None:
        if model is None or gpu is None:
            raise ConfigError("give --timing, or --model and --gpu for a roofline")
        timing = ["roofline"]
    tm = make_timing(timing, model, gpu, tp)
    for part, ok, hint in (
        ("prefill", tm.times_prefill, "power:..., table:path=... or roofline"),
        ("decode", tm.times_decode, "tpot:s=... or roofline"),
    ):
        if not ok:
            warn(f"the timing has no {part} model: {part} costs 0 s (add {hint})")
    return tm


#: where a replica runs: GPU, tensor-parallel degree, memory utilization, and whether the
#: KV budget it leaves goes unprinted
Deploy = tuple[str | None, int, float, bool]


def _pool_size(
    structure: str,
    capacity_blocks: int | None,
    capacity_bytes: int | None,
    model: str | None,
    bt: int,
    deploy: Deploy = (None, 1, 0.9, True),
) -> tuple[int, int | None]:
    """The engine's (capacity in blocks, capacity in bytes): the hybrid structure's pool
    is bytes (its blocks a placeholder 1), the others' blocks. With neither capacity, the
    KV budget --model leaves on --tp x --gpu (prefixlab.model.deploy)."""
    gpu, tp, utilization, silent = deploy
    if capacity_blocks is None and capacity_bytes is None and model and gpu:
        from prefixlab.model.deploy import kv_budget

        budget = kv_budget(model, gpu, tp, utilization)
        if not silent:
            err.print(budget.describe(), highlight=False)
        capacity_bytes = budget.kv_bytes
    if structure == "hybrid":
        if capacity_bytes is None or model is None or capacity_blocks is not None:
            raise ConfigError("--structure hybrid needs --model and --capacity-bytes (not blocks)")
        return 1, capacity_bytes
    return resolve_capacity_blocks(capacity_blocks, capacity_bytes, model, bt), None


def _simulate_each(
    tr: Trace,
    specs: list[str],
    config: EngineConfig,
    tm: TimingModel,
    fleet: FleetConfig,
    quiet: bool,
) -> list[EngineResult | FleetResult]:
    """Each policy's simulation, in order, on one engine or a fleet, with a progress bar
    over the requests (and a warning first when prompts are capped)."""
    config.validate()
    fleet.validate()
    policies = make_policies(specs, config.structure, Policy)
    if config.structure != "hybrid":
        bt = block_tokens_of(tr, config.block_tokens)
        note = capped_warning(tr, bt, config.min_recompute_tokens)
        if note:
            warn(note)
    results: list[EngineResult | FleetResult] = []
    with progress_bar("requests", quiet) as advance:
        for pol in policies:
            if fleet.replicas > 1:
                results.append(simulate_fleet(tr, pol, config, fleet, tm))
                continue
            shown = None if advance is None else _shown(advance, pol.spec())
            results.append(simulate(tr, pol, config, tm, on_progress=shown))
    return results


def _print_simulated(
    tr: Trace, results: list[EngineResult | FleetResult], as_json: bool, by_task: bool
) -> None:
    """One JSON list, or the table (and per-task tables) and the trace's line."""
    engines = [r.engine if isinstance(r, FleetResult) else r for r in results]
    for e in engines:
        message = overload(e.arrival_s, e.scheduled_s, e.first_token_s, e.finish_s)
        if message is not None:
            warn(f"{e.policy}: {message}")
    rows = [r.as_dict() for r in results]
    if as_json:
        print_json(rows)  # a NaN TPOT (no request with two output tokens) as null
        return
    out = console()
    out.print(_table(rows))
    if by_task:
        for row in rows:
            out.print(_task_table(row))
    for r in results:
        if isinstance(r, FleetResult):
            counts = ", ".join(f"{row['num_requests']:,}" for row in r.per_replica)
            out.print(
                f"{r.engine.policy}: {r.replicas} replicas behind {r.router}; requests: {counts}"
            )
    out.print(f"trace: {tr.name} ({len(tr):,} requests); timing: {engines[0].timing}")


def _shown(advance: Advance, label: str) -> Callable[[int, int], None]:
    """Feeds the progress bar with a policy's finished requests."""

    def report(done: int, total: int) -> None:
        advance(done, total, label)

    return report


def _table(rows: list[dict[str, Any]]) -> Table:
    """One row per policy; latencies in seconds (:func:`secs`), an 80-column terminal wide."""
    cols: list[tuple[str, str, Callable[[Any], str]]] = [
        ("policy", "policy", str),
        ("token_hit_ratio", "token hit", "{:.4f}".format),
        ("mean_ttft_s", "TTFT mean", secs),
        ("p50_ttft_s", "TTFT P50", secs),
        ("p95_ttft_s", "TTFT P95", secs),
        ("p99_ttft_s", "TTFT P99", secs),
        ("mean_prefill_s", "prefill mean", secs),
        ("mean_tpot_s", "TPOT mean", secs),
        ("throughput_tokens_per_s", "out tok/s", "{:,.0f}".format),
        ("num_preemptions", "preempt", "{:,}".format),
    ]
    table = FitTable(title="serving simulation (seconds)")
    for _, title, _ in cols:
        table.add_column(title, justify="left" if title == "policy" else "right")
    for row in rows:
        table.add_row(*(cell(row[k], f) for k, _, f in cols))
    return table


def _task_table(row: dict[str, Any]) -> Table:
    table = FitTable(title=f"{row['policy']}: by task (seconds)")
    titles = ("task", "requests", "token hit", "TTFT mean", "TTFT P95", "prefill mean")
    for title in titles:
        table.add_column(title, justify="left" if title == "task" else "right")
    for task, m in row["by_task"].items():
        hit = cell(m["token_hit_ratio"], "{:.4f}".format)
        lat = (secs(m["mean_ttft_s"]), secs(m["p95_ttft_s"]), secs(m["mean_prefill_s"]))
        table.add_row(task, f"{m['num_requests']:,}", hit, *lat)
    return table


def fit_timing_cmd(
    csv_path: Annotated[
        Path, typer.Argument(help="CSV with input_tokens, ttft_s (and batch_size) columns.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Fit the power-law prefill model a * BS^b * L^c to measured timings (reports R^2)."""
    try:
        fit = fit_csv(csv_path)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    result = {
        "a": fit.a,
        "b": fit.b,
        "c": fit.c,
        "r2": fit.r2,
        "r2_log": fit.r2_log,
        "num_points": fit.num_points,
        "b_fixed": fit.b_fixed,
        "spec": fit.spec(),
    }
    if as_json:
        print_json(result)
        return
    out = console()
    note = " (b fixed: one batch size in the data)" if fit.b_fixed else ""
    out.print(f"t = {fit.a:.6g} * BS^{fit.b:.4g} * L^{fit.c:.4g}{note}")
    out.print(f"R^2 = {fit.r2:.4f} (log scale {fit.r2_log:.4f}) over {fit.num_points} points")
    out.print(f"timing spec: {fit.spec()}")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("fit-timing")(fit_timing_cmd)
