"""CLI command ``plan``: the fewest replicas that meet a P95 time-to-first-token target, per
router and tier setup (docs/fleet.md#plan)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from prefixlab.cli.common import (
    BlockTokensOpt,
    CapacityBytesOpt,
    FitTable,
    FormatOpt,
    QuietOpt,
    TraceArg,
    cell,
    console,
    fail,
    load_shown,
    print_json,
    secs,
    with_loader_options,
)
from prefixlab.cli.engine import (
    _PASSED,
    _block_size,
    _CapacityBlocksOpt,
    _GpuOpt,
    _GpuUtilOpt,
    _JsonOpt,
    _MaxBatchedOpt,
    _MaxNumSeqsOpt,
    _ModelOpt,
    _OverlapOpt,
    _pool_size,
    _timing_of,
    _TpOpt,
)
from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.experiments.sizing import Sizing, SizingPoint, TierSetup, cpu_curve, size_fleet
from prefixlab.model.timing import TimingModel
from prefixlab.runner.engine import EngineConfig
from prefixlab.runner.engine.tiers import setup_label, tier_setup
from prefixlab.workload.trace import Trace

_SloOpt = Annotated[
    float,
    typer.Option(
        "--slo-p95-ttft", help="Target: P95 time from arrival to first token, in seconds."
    ),
]
_RoutersOpt = Annotated[
    list[str] | None,
    typer.Option("--router", help="Router spec (repeatable) [default: round-robin]."),
]
_SetupsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tiers",
        help="A tier setup (repeatable): none, or --tier specs joined by ' + ' "
        "('cpu:size=200GB + store:size=2TB') [default: none].",
    ),
]
_MaxReplicasOpt = Annotated[int, typer.Option(help="Replicas at most.")]
_CurveOpt = Annotated[
    str | None,
    typer.Option(help="Replica counts simulated as well, for whole curves: 1,2,4,8,16."),
]
_CpuSizesOpt = Annotated[
    str | None,
    typer.Option(
        help="Also simulate each router with a CPU pool of each size (GB per replica, 0: "
        "none) at --at-replicas, for the curve against CPU size: 0,50,100,200."
    ),
]
_AtOpt = Annotated[
    int | None,
    typer.Option(help="Replicas of the CPU-size curve [default: the most any setup needs]."),
]
_PlotOpt = Annotated[
    Path | None, typer.Option(help="Write the P95 and hit-ratio curves to this PNG.")
]
_PolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="Policy spec.")]


@with_loader_options
def plan_cmd(
    trace: TraceArg,
    slo: _SloOpt,
    policy: _PolicyOpt = "lru",
    fmt: FormatOpt = "native",
    block_tokens: BlockTokensOpt = None,
    model: _ModelOpt = None,
    gpu: _GpuOpt = None,
    timing: Annotated[list[str] | None, typer.Option(help="Timing spec (as simulate).")] = None,
    capacity_blocks: _CapacityBlocksOpt = None,
    capacity_bytes: CapacityBytesOpt = None,
    tp: _TpOpt = 1,
    gpu_memory_utilization: _GpuUtilOpt = 0.9,
    max_num_seqs: _MaxNumSeqsOpt = 256,
    max_num_batched_tokens: _MaxBatchedOpt = 8192,
    router: _RoutersOpt = None,
    tiers: _SetupsOpt = None,
    load_overlap: _OverlapOpt = False,
    max_replicas: _MaxReplicasOpt = 64,
    curve: _CurveOpt = None,
    cpu_sizes: _CpuSizesOpt = None,
    at_replicas: _AtOpt = None,
    plot: _PlotOpt = None,
    as_json: _JsonOpt = False,
    quiet: QuietOpt = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Size a fleet: the fewest replicas whose P95 TTFT (arrival to first token) meets the
    target, for each router and tier setup, with the curves it was read from."""
    try:
        tr = load_shown(trace, fmt, load or {}, quiet)
        block_tokens, bt = _block_size(tr, "block", block_tokens)
        deploy = (gpu, tp, gpu_memory_utilization, quiet or as_json)
        blocks, _ = _pool_size("block", capacity_blocks, capacity_bytes, model, bt, deploy)
        passed = {k: v for k, v in locals().items() if k in _PASSED}  # the scheduler's
        config = EngineConfig(blocks, block_tokens=block_tokens, model=model, **passed)
        runs = (tr, policy, config, _timing_of(timing, model, gpu, tp))
        setups = [_setup(s, model, bt) for s in tiers or ["none"]]
        search = (slo, max_replicas, _counts(curve), _sizes(cpu_sizes), at_replicas)
        sizing = _size(runs, router or ["round-robin"], setups, search, quiet or as_json)
        _plot(sizing, plot, f"{policy}: P95 TTFT target {slo:g} s")
    except PrefixlabError as exc:
        fail(str(exc))
        return
    _print_plan(sizing, as_json)


def _size(
    runs: tuple[Trace, str, EngineConfig, TimingModel],
    routers: list[str],
    setups: list[TierSetup],
    search: tuple[float, int, list[int], list[float], int | None],
    quiet: bool,
) -> Sizing:
    """The search of every setup, then the CPU-size curve when sizes are given."""
    slo, max_replicas, curve, cpu_sizes, at_replicas = search
    say = None if quiet else _say
    sizing = size_fleet(
        *runs,
        routers=routers,
        setups=setups,
        slo_p95_ttft_s=slo,
        max_replicas=max_replicas,
        curve=curve,
        on_point=say,
    )
    if cpu_sizes:
        needed = [n for n in sizing.answers.values() if n]
        n = at_replicas or max(needed, default=max_replicas)
        cpu_curve(*runs, sizing, routers=routers, cpu_gb=cpu_sizes, replicas=n, on_point=say)
    return sizing


def _plot(sizing: Sizing, path: Path | None, title: str) -> None:
    if path is not None:
        from prefixlab.report.sizing import write_sizing_png  # matplotlib: only now

        write_sizing_png(sizing, path, title)


def _setup(text: str, model: str | None, block_tokens: int) -> TierSetup:
    """A ``--tiers`` value: ``none`` or tier specs joined by `` + ``."""
    tiers = tier_setup(text, model, block_tokens)
    specs = [t.strip() for t in text.split(" + ") if t.strip()]
    return (setup_label(specs) if tiers else "none"), tiers


def _numbers(text: str | None, option: str, what: str, low: float) -> list[float]:
    """A comma-separated list of numbers >= ``low`` (an error names a bad one)."""
    out = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not low <= value < math.inf:
            raise ConfigError(f"{option}: {part!r} is not {what}")
        out.append(value)
    return out


def _sizes(text: str | None) -> list[float]:
    """``--cpu-sizes 0,50,200``: sizes in GB."""
    return _numbers(text, "--cpu-sizes", "a size in GB (0, 50, 200)", 0)


def _counts(text: str | None) -> list[int]:
    """``--curve 1,2,4``: the replica counts."""
    counts = _numbers(text, "--curve", "a replica count (1, 2, 4, ...)", 1)
    bad = [c for c in counts if c != int(c)]
    if bad:
        raise ConfigError(f"--curve: {bad[0]:g} is not a replica count (1, 2, 4, ...)")
    return [int(c) for c in counts]


def _say(point: SizingPoint) -> None:
    verdict = "meets" if point.meets else "misses"
    console().print(
        f"{point.router}, tiers {point.tiers}: {point.replicas} replicas, P95 TTFT "
        f"{secs(point.p95_ttft_s)}, token hit {point.token_hit_ratio:.4f}: {verdict}",
        highlight=False,
    )


def _print_plan(sizing: Sizing, as_json: bool) -> None:
    rows = sizing.answer_rows()
    if as_json:
        points = [p.as_dict() for p in sizing.points]
        doc = {"slo_p95_ttft_s": sizing.slo_p95_ttft_s, "answers": rows, "points": points}
        if sizing.cpu_points:
            doc["cpu_curve"] = [p.as_dict() for p in sizing.cpu_points]
        print_json(doc)
        return
    target = f"P95 TTFT <= {sizing.slo_p95_ttft_s:g} s"
    table = FitTable(title=f"replicas needed for {target} (arrival to first token)")
    for title in ("router", "tiers", "replicas", "P95 TTFT", "token hit"):
        table.add_column(title, justify="left" if title in ("router", "tiers") else "right")
    for row in rows:
        n = row["replicas"]
        table.add_row(
            str(row["router"]),
            str(row["tiers"]),
            f"{n:,}" if isinstance(n, int) else f"> {sizing.max_replicas:,}",
            cell(row["p95_ttft_s"], secs),
            cell(row["token_hit_ratio"], "{:.4f}".format),
        )
    console().print(table)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
