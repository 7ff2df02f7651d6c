"""CLI commands of expert caching: ``experts generate|simulate|sweep|record|info|policies``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prefixlab.cli.common import (
    AddressOpt,
    BackendOpt,
    FitTable,
    JobsOpt,
    QuietOpt,
    QuietPathOpt,
    ReportOpt,
    ResultsOpt,
    console,
    err,
    fail,
    print_json,
    progress_bar,
    warn,
)
from prefixlab.errors import PrefixlabError

if TYPE_CHECKING:
    from prefixlab.experts.trace import ExpertTrace

experts_app = typer.Typer(
    no_args_is_help=True,
    help="Mixture-of-Experts expert caching: layered paging traces, policies, sweeps.",
)

ExpertTraceArg = Annotated[
    str, typer.Argument(help="Routing file (.jsonl, .jsonl.gz, .npz) or gen:KIND[:k=v,...].")
]
TopKOpt = Annotated[
    int | None, typer.Option("--top-k", help="Keep each token's first K choices (K rounds).")
]


def _load(trace: str, top_k: int | None) -> Any:
    from prefixlab.experts.trace_io import load_expert_trace

    return load_expert_trace(trace, top_k=top_k)


def generate_cmd(
    kind: Annotated[str, typer.Argument(help="Generator: zipf, uniform, cyclic, thm31, thm33.")],
    params: Annotated[
        list[str] | None, typer.Argument(help="Parameters key=value, e.g. num_layers=32 a=1.2.")
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Trace file: .npz (compact) or .jsonl[.gz].")
    ] = Path("experts.npz"),
) -> None:
    """Generate a seeded expert trace and write it (prints its summary)."""
    from prefixlab.experts.generators import generate_from_spec

    try:
        for p in params or []:
            if "=" not in p:
                raise PrefixlabError(f"parameter {p!r} is not key=value")
        trace = generate_from_spec(f"{kind}:{','.join(params or [])}" if params else kind)
        from prefixlab.experts.trace_io import save_trace

        out.parent.mkdir(parents=True, exist_ok=True)
        save_trace(trace, out)  # .npz, or routing JSONL for .jsonl[.gz]
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    _print_summary(trace, out)


def _print_summary(trace: Any, path: Path | str) -> None:
    s = trace.summary().as_dict()
    table = FitTable(title=f"expert trace {path}")
    table.add_column("field")
    table.add_column("value", justify="right")
    for k, v in s.items():
        table.add_row(
            k, f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
        )
    console().print(table)


def info_cmd(trace: ExpertTraceArg, top_k: TopKOpt = None) -> None:
    """Summarise an expert trace: layers, experts, tokens, rounds, popularity."""
    try:
        tr = _load(trace, top_k)
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    _print_summary(tr, trace)


def _capacities(values: list[str], num_layers: int, num_experts: int) -> list[tuple[str, int]]:
    from prefixlab.experts.config import parse_capacity, resolve_capacities

    caps: list[int | str] = []
    for v in values:
        caps.append(parse_capacity(int(v) if v.strip().lstrip("-").isdigit() else v, "--capacity"))
    return resolve_capacities(caps, num_layers, num_experts)


def simulate_cmd(
    trace: ExpertTraceArg,
    capacity: Annotated[
        list[str],
        typer.Option("--capacity", "-k", help="Cache size: pages, f nl (0.25nl) or all."),
    ],
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="Policy spec (repeatable) [default: lru, llru]."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of randomised policies (marking).")] = 0,
    top_k: TopKOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Simulate expert-cache policies on a trace: faults and faults relative to OPT."""
    policies = policy or ["lru", "llru"]
    try:
        tr = _load(trace, top_k)
        caps = _capacities(capacity, tr.num_layers, tr.num_experts)
        rows = _simulate_rows(tr, caps, policies, seed, quiet)
        skipped = [
            (p, k)
            for _, k in caps
            for p in policies
            if not any(r["spec"] == p and r["capacity"] == k for r in rows)
        ]
        if not rows:
            p, k = skipped[0]
            raise PrefixlabError(
                f"{p} needs a capacity of at least num_layers="
                f"{tr.num_layers} (one page per layer), got {k}"
            )
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    if skipped:
        names = ", ".join(dict.fromkeys(p for p, _ in skipped))
        sizes = sorted({k for _, k in skipped})
        where = f"capacity {sizes[0]}" if len(sizes) == 1 else f"capacities {sizes[0]}-{sizes[-1]}"
        warn(f"{names} left out at {where}: they need at least num_layers={tr.num_layers}")
    _print_rows(tr, rows, as_json)


def _simulate_rows(
    tr: ExpertTrace, caps: list[tuple[str, int]], policies: list[str], seed: int, quiet: bool
) -> list[dict[str, Any]]:
    """The rows of every (capacity, policy), with a progress bar over the capacities (a
    policy a capacity is too small for has none)."""
    from prefixlab.experts.simulate import sweep_capacities

    rows: list[dict[str, Any]] = []
    with progress_bar("capacities", quiet) as advance:
        for i, (_, k) in enumerate(caps):
            if advance is not None:
                advance(i, len(caps), f"k={k}")
            rows += sweep_capacities(tr, [k], policies, seed=seed)
    return rows


def _print_rows(tr: ExpertTrace, rows: list[dict[str, Any]], as_json: bool) -> None:
    """``experts simulate``'s output: one JSON list, or the table."""
    keys = [
        "policy",
        "capacity",
        "num_requests",
        "num_faults",
        "num_first_use_faults",
        "fault_rate",
        "fault_ratio_to_opt",
    ]
    if as_json:
        print_json([{k: r[k] for k in keys} for r in rows])
        return
    table = FitTable(
        title=f"expert cache: {tr.num_layers} layers x {tr.num_experts} experts, "
        f"{tr.num_requests:,} requests"
    )
    for h in ("policy", "k", "faults", "first-use", "fault rate", "faults / OPT"):
        table.add_column(h, justify="left" if h == "policy" else "right")
    for r in rows:
        table.add_row(
            r["policy"],
            f"{r['capacity']:,}",
            f"{r['num_faults']:,}",
            f"{r['num_first_use_faults']:,}",
            f"{r['fault_rate']:.4f}",
            f"{r['fault_ratio_to_opt']:.3f}",
        )
    console().print(table)


def sweep_cmd(
    config: Annotated[Path, typer.Argument(help="Expert sweep config (TOML or YAML).")],
    out: ResultsOpt = None,
    jobs: JobsOpt = 1,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    quiet: QuietPathOpt = False,
    report: ReportOpt = True,
) -> None:
    """The same as `prefixlab sweep` on an experts config (kept for old scripts)."""
    from prefixlab.cli.experiments import execute
    from prefixlab.experts.config import load_sweep_config

    try:
        cfg = load_sweep_config(config)
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    execute(cfg, out, jobs=jobs, quiet=quiet, backend=backend, address=address, report=report)
    err.print(  # after the run: an error stays one line
        "note: 'prefixlab experts sweep' is 'prefixlab sweep' on an experts config; "
        "this alias stays",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def policies_cmd() -> None:
    """List the expert-cache policies and their parameters."""
    from prefixlab.experts.policies import describe, parameters, registered

    table = FitTable(title="expert-cache policies")
    table.add_column("name")
    table.add_column("parameters")
    table.add_column("summary")
    for name, cls in registered().items():
        params = ", ".join(f"{k}={v}" for k, v in parameters(cls).items())
        table.add_row(name, params or "-", describe(cls))
    console().print(table)


def register(app: typer.Typer) -> None:
    experts_app.command("generate")(generate_cmd)
    experts_app.command("info")(info_cmd)
    experts_app.command("simulate")(simulate_cmd)
    experts_app.command("sweep")(sweep_cmd)
    experts_app.command("policies")(policies_cmd)
    from prefixlab.cli.experts_record import record_cmd

    experts_app.command("record")(record_cmd)
    app.add_typer(experts_app, name="experts")
