"""Plan an experiment's cells and run one cell: the unit every backend executes.

A cell is one point of the cross product: a workload variant (the ``workload.vary`` values),
a capacity, a policy and a seed. Running it builds (or reuses) the seeded trace, resolves
the capacity in blocks, runs the replay or engine runner, and returns a row of fixed
columns plus small breakdown and latency-CDF tables. A cell's result depends only on the
config and the cell, never on which process or machine ran it, so every backend gives the
same rows (wall-clock time is kept apart, in ``wall_s``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prefixlab.errors import CapacityError, ConfigError
from prefixlab.experiments.config import (
    FLEET_KEYS,
    ExperimentConfig,
    resolve_capacity,
)
from prefixlab.experiments.execute import cell_id_of
from prefixlab.policies.base import EvictionPolicy, Policy, make_policy, registered
from prefixlab.registry import parameters, parse_spec
from prefixlab.types import Row, Scalar
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Trace

if TYPE_CHECKING:
    from prefixlab.model.timing import TimingModel
    from prefixlab.runner.engine import EngineConfig

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: input-length bins of the breakdown table (tokens; the last is open-ended)
LENGTH_BINS = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: quantiles of the stored TTFT and prefill-time CDF (engine runner)
CDF_POINTS = 101
LAYER_TYPES = ("attention", "mlp", "moe", "ssm")
#: statistics of the arrival-to-first-token (TTFT) and prefill-only times in a result row
LATENCY_STATS = ("mean", "p5", "p50", "p95", "p99")

#: the result row's columns, in order (tidy: one row per cell)
KEY_COLUMNS = (
    "experiment",
    "cell_id",
    "variant",
    "capacity",
    "capacity_index",
    "capacity_blocks",
    "policy",
    "policy_index",
    "seed",
)
METRIC_COLUMNS = (
    "runner",
    "structure",
    "block_tokens",
    "capacity_bytes",
    "workload",
    "working_set_blocks",
    "capacity_fraction_ws",
    "num_requests",
    "num_input_tokens",
    "num_hit_tokens",
    "token_hit_ratio",
    "request_hit_ratio",
    "num_lookup_blocks",
    "num_hit_blocks",
    "block_hit_ratio",
    "num_evictions",
    "flops_total",
    "flops_saved",
    "flops_saved_ratio",
    *(f"flops_saved_{t}" for t in LAYER_TYPES),
    "timing",
    *(f"{s}_ttft_s" for s in LATENCY_STATS),
    *(f"{s}_prefill_s" for s in LATENCY_STATS),
    "mean_queue_s",
    "p95_queue_s",
    "mean_tpot_s",
    "p50_tpot_s",
    "p95_tpot_s",
    "mean_e2e_s",
    "p95_e2e_s",
    "makespan_s",
    "throughput_tokens_per_s",
    "total_throughput_tokens_per_s",
    "num_preemptions",
    "num_steps",
    # KV tiers (fleet.tiers): the hit split by level, bytes moved, the wait for loads
    "gpu_token_hit_ratio",
    "cpu_token_hit_ratio",
    "store_token_hit_ratio",
    "cpu_bytes_loaded",
    "cpu_bytes_stored",
    "store_bytes_loaded",
    "store_bytes_stored",
    "mean_load_wait_s",
)
COLUMNS = KEY_COLUMNS + METRIC_COLUMNS


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the cross product (indices keep the plan's order in the tables)."""

    variant: dict[str, object]
    capacity: int | str
    capacity_index: int
    policy: str
    policy_index: int
    seed: int
    cell_id: str = ""

    def label(self) -> str:
        v = ",".join(f"{k}={x}" for k, x in self.variant.items())
        return f"{self.policy} @ {self.capacity}" + (f" [{v}]" if v else "") + f" seed {self.seed}"


@dataclass(slots=True)
class CellResult:
    """What a cell returns: its row, breakdown and CDF rows, optional per-request detail."""

    cell_id: str
    row: Row
    breakdown: list[Row]
    cdf: list[Row]
    requests: dict[str, list[Scalar]] | None = None
    wall_s: float = 0.0
    worker: str = ""


#: settings added after stores existed: left out of the fingerprint at their defaults, so
#: the cells of older configs keep their ids
_LATER_DEFAULTS = {
    "memory_utilization": 1.0,
    "reserve_gib": 0.0,
    "tp": 1,
    "gated": False,
    "admission": "all",
    "load_overlap": False,
    "sliding_window_rule": "window",
}


def _without_later_defaults(d: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in d.items() if not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}


def fingerprint(cfg: ExperimentConfig) -> dict[str, object]:
    """The parts of a config that decide a cell's result (not its name, not the lists)."""
    d = cfg.model_dump()
    return {
        "workload": {k: d["workload"][k] for k in ("source", "format", "params")},
        "model": _without_later_defaults(d["model"]),
        "cache": _without_later_defaults(
            {k: v for k, v in d["cache"].items() if k != "capacities"}
        ),
        "runner": _without_later_defaults(d["runner"]),
    }


def variant_label(variant: Mapping[str, object]) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items())


def plan(cfg: ExperimentConfig) -> list[Cell]:
    """Every cell, in table order: variant, capacity, policy, seed."""
    fp = json.dumps(fingerprint(cfg), sort_keys=True, default=str)
    keys = list(cfg.workload.vary)
    variants: list[dict[str, object]] = [
        dict(zip(keys, vals, strict=True))
        for vals in itertools.product(*(cfg.workload.vary[k] for k in keys))
    ]
    if cfg.fleet is not None:  # each fleet joins the variants
        fleets = list(itertools.product(cfg.fleet.replicas, cfg.fleet.routers))
        variants = [{**v, "replicas": n, "router": r} for v in variants for n, r in fleets]
        if cfg.fleet.tiers != [[]]:  # (a fleet without tiers keeps its cells' ids)
            from prefixlab.runner.engine.tiers import setup_label

            setups = [setup_label(t) for t in cfg.fleet.tiers]
            variants = [{**v, "tiers": t} for v in variants for t in setups]
    cells = []
    for variant in variants:
        for ci, cap in enumerate(cfg.cache.capacities):
            for pi, pol in enumerate(cfg.policies):
                for seed in cfg.seeds:
                    cid = cell_id_of(fp, variant, cap, pol, seed)
                    cells.append(Cell(variant, cap, ci, pol, pi, seed, cid))
    if len({c.cell_id for c in cells}) != len(cells):
        raise ConfigError("the config lists a capacity, policy, seed or vary value twice")
    return cells


# ------------------------------------------------------------------ traces
_TRACES: dict[str, Trace] = {}
_KEEP_TRACES = 4


def build_trace(cfg: ExperimentConfig, variant: Mapping[str, object], seed: int) -> Trace:
    """The cell's trace: a generator gets the seed (unless its params pin one); a file
    gets it as ``sample_seed`` when sampled. Kept per process for the next cells."""
    variant = {k: v for k, v in variant.items() if k not in FLEET_KEYS}  # the workload's
    key = json.dumps([cfg.workload.model_dump(), variant, seed], sort_keys=True, default=str)
    if key in _TRACES:
        _TRACES[key] = _TRACES.pop(key)  # most recent last
        return _TRACES[key]
    w = cfg.workload
    params = {**w.params, **variant}
    if w.source.startswith("gen:"):
        from prefixlab.workload.sources import TIME_OPTIONS, retimed

        name, inline = parse_spec(w.source[4:], "workload.source")
        gen = GENERATORS[name]
        kwargs = {**inline, **params}
        timing = {k: kwargs.pop(k) for k in TIME_OPTIONS if k in kwargs}
        if "seed" in {f for f in gen.params.__dataclass_fields__} and "seed" not in kwargs:
            kwargs["seed"] = seed
        trace = retimed(gen.fn(**kwargs), **timing)  # type: ignore[arg-type]
    else:
        from prefixlab.workload.sources import open_trace

        if "sample" in params and "sample_seed" not in params:
            params["sample_seed"] = seed
        trace = open_trace(w.source, w.format, **params)
    if len(trace) == 0:
        raise ConfigError(f"workload {w.source} {variant_label(variant)}: no requests")
    while len(_TRACES) >= _KEEP_TRACES:  # traces can be large: keep the last few
        del _TRACES[next(iter(_TRACES))]
    _TRACES[key] = trace
    return trace


def policy_spec(spec: str, seed: int) -> str:
    """A randomised policy (one taking ``seed``) gets the cell's seed unless its spec pins one."""
    name, kwargs = parse_spec(spec)
    cls = registered().get(name)
    if cls is None or "seed" not in parameters(cls) or "seed" in kwargs:
        return spec
    return f"{spec}{',' if ':' in spec else ':'}seed={seed}"


def block_tokens_for(cfg: ExperimentConfig, trace: Trace) -> int:
    if cfg.cache.block_tokens is not None:
        return cfg.cache.block_tokens
    if trace.block_tokens is not None:
        return int(trace.block_tokens)
    return 16


def capacity_blocks(cfg: ExperimentConfig, cell: Cell, trace: Trace) -> tuple[int, int]:
    """(capacity in blocks, working-set blocks); an impossible capacity is a one-line error."""
    bt = block_tokens_for(cfg, trace)
    c = cfg.cache
    layout = trace.block_layout(bt, None, c.cache_partial, c.min_recompute_tokens)
    ws = int(layout.num_distinct_keys)
    where = f"cache.capacities[{cell.capacity_index}] = {cell.capacity!r}"
    m = cfg.model
    blocks = resolve_capacity(
        cell.capacity,
        working_set_blocks=ws,
        block_tokens=bt,
        model=m.name,
        gpu=m.gpu,
        memory_utilization=m.memory_utilization,
        reserve_gib=m.reserve_gib,
        tp=m.tp,
    )
    need = int(layout.num_blocks_held.max()) if len(trace) else 0
    if blocks < need:
        r = int(np.argmax(layout.num_blocks_held))
        raise ConfigError(
            f"{where}: {blocks:,} blocks cannot hold request {r} of "
            f"{trace.name} ({need:,} blocks of {bt} tokens); give at least {need:,}"
        )
    return blocks, ws


def kv_bytes(blocks: int, block_tokens: int, model: str | None) -> int:
    """The bytes a cache of ``blocks`` blocks holds (the model's KV bytes per block times
    the blocks, whatever unit the capacity was given in); -1 without a model to say."""
    if model is None:
        return -1
    from prefixlab.model.spec import get_model

    return blocks * get_model(model).kv_bytes_per_block(block_tokens)


# ------------------------------------------------------------------ one cell
def run_cell(cfg: ExperimentConfig, cell: Cell, detail: bool = False) -> CellResult:
    """Run one cell; ConfigError / CapacityError name the cell."""
    start = time.perf_counter()
    try:
        return _run_cell(cfg, cell, detail, start)
    except (ConfigError, CapacityError) as exc:
        raise type(exc)(f"{cell.label()}: {exc}") from None


def _cell_bytes(cfg: ExperimentConfig, cell: Cell) -> int:
    """A hybrid cell's capacity in bytes (the config check requires a model name)."""
    from prefixlab.experiments.config import resolve_capacity_bytes

    m = cfg.model
    assert m.name is not None
    return resolve_capacity_bytes(
        cell.capacity, m.name, m.gpu, m.memory_utilization, m.reserve_gib, m.tp
    )


def _base_row(cfg: ExperimentConfig, cell: Cell, **fields: Any) -> dict[str, Any]:
    """A cell's row: every column NaN, then the cell's keys and ``fields`` (the columns'
    order stays that of :data:`COLUMNS`)."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS, math.nan)
    row.update(
        experiment=cfg.name,
        cell_id=cell.cell_id,
        variant=variant_label(cell.variant),
        capacity=str(cell.capacity),
        capacity_index=cell.capacity_index,
        policy=cell.policy,
        policy_index=cell.policy_index,
        seed=cell.seed,
        runner=cfg.runner.kind,
        workload=cfg.workload.source,
        timing="",
        num_preemptions=0,
        num_steps=0,
    )
    row.update(fields)
    return row


def _plain_row(row: dict[str, Any]) -> None:
    """numpy scalars would not survive JSON the same way on every backend: plain Python."""
    for k, v in row.items():
        if isinstance(v, np.generic):
            row[k] = v.item()


def _tables(
    row: dict[str, Any],
    trace: Trace,
    hits: I64,
    times: tuple[F64, F64, F64, F64] | None,
    detail: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[Any]] | None]:
    """A cell's breakdown and CDF rows, and its per-request detail (with ``detail``)."""
    breakdown = _breakdown(row, trace, hits, times)
    cdf = _cdf(row, times) if times is not None else []
    requests = _requests(trace, hits, times) if detail else None
    return breakdown, cdf, requests


def _engine_metrics(
    trace: Trace,
    policy: Policy | str,
    ec: EngineConfig,
    timing: TimingModel,
    variant: Mapping[str, object],
) -> tuple[dict[str, Any], str, I64, tuple[F64, F64, F64, F64]]:
    """Simulate the engine, or the fleet the variant names: its metrics (less the per-task
    ones and the wall time), its timing's name, the hit tokens and the requests' times."""
    from prefixlab.runner.engine import simulate
    from prefixlab.runner.engine.tiers import tier_setup
    from prefixlab.runner.fleet import FleetConfig, simulate_fleet

    if "tiers" in variant:
        tiers = tier_setup(str(variant["tiers"]), ec.model, ec.block_tokens or 16)
        ec = dataclasses.replace(ec, tiers=tiers)
    if "replicas" in variant:
        fleet = FleetConfig(int(variant["replicas"]), str(variant["router"]))  # type: ignore[call-overload]
        eres = simulate_fleet(trace, policy, ec, fleet, timing).engine
    else:
        eres = simulate(trace, policy, ec, timing)
    metrics = {k: v for k, v in eres.metrics.items() if k not in ("by_task", "elapsed_s")}
    times = (eres.arrival_s, eres.scheduled_s, eres.first_token_s, eres.finish_s)
    return metrics, eres.timing, eres.hit_tokens, times


def _run_hybrid_cell(
    cfg: ExperimentConfig, cell: Cell, detail: bool, start: float, trace: Trace
) -> CellResult:
    """A hybrid-cache cell (Marconi's replay contract; capacity in bytes)."""
    from prefixlab.runner.hybrid import HybridConfig, replay_hybrid

    assert cfg.model.name is not None  # the config check requires it
    size = _cell_bytes(cfg, cell)
    spec = policy_spec(cell.policy, cell.seed)
    row = _base_row(
        cfg, cell, capacity_blocks=-1, structure="hybrid", block_tokens=-1, capacity_bytes=size
    )
    times: tuple[F64, F64, F64, F64] | None = None
    if cfg.runner.kind == "replay":
        res = replay_hybrid(trace, spec, HybridConfig(size, cfg.model.name))
        metrics: dict[str, Any] = dict(res.metrics)
        metrics["num_evictions"] = res.metrics["num_evicted_nodes"]
        hits = res.hit_tokens
    else:
        timing = _cell_timing(cfg)
        ec = _hybrid_engine_config(cfg, size)
        metrics, row["timing"], hits, times = _engine_metrics(trace, spec, ec, timing, cell.variant)
    for key, value in metrics.items():
        if key in row and key not in _HYBRID_KEPT:
            row[key] = value
    if cfg.runner.kind == "engine":
        row.update(_flops(cfg, trace.input_length, hits))
    _plain_row(row)
    breakdown, cdf, requests = _tables(row, trace, hits, times, detail)
    return CellResult(
        cell.cell_id, row, breakdown, cdf, requests, time.perf_counter() - start, _worker()
    )


#: the columns of a hybrid cell's row its metrics do not overwrite
_HYBRID_KEPT = ("capacity_bytes", "num_lookup_blocks", "num_hit_blocks", "block_hit_ratio")


def _cell_timing(cfg: ExperimentConfig) -> TimingModel:
    """The engine runner's timing model (a roofline unless the config names one)."""
    from prefixlab.model.timing import make_timing

    m = cfg.model
    return make_timing(m.timing or ["roofline"], m.name, m.gpu, m.tp)


def _hybrid_engine_config(cfg: ExperimentConfig, size: int) -> EngineConfig:
    """The engine's settings for a hybrid cell of ``size`` bytes."""
    from prefixlab.runner.engine import EngineConfig

    r = cfg.runner
    return EngineConfig(
        capacity_blocks=1,
        structure="hybrid",
        capacity_bytes=size,
        model=cfg.model.name,
        block_tokens=cfg.cache.block_tokens,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        chunked_prefill=r.chunked_prefill,
        closed_loop=r.closed_loop,
        gated=r.gated,
    )


def _engine_config(cfg: ExperimentConfig, blocks: int, bt: int) -> EngineConfig:
    """The engine's settings for a block or radix cell of ``blocks`` blocks."""
    from prefixlab.runner.engine import EngineConfig

    r = cfg.runner
    return EngineConfig(
        capacity_blocks=blocks,
        structure=cfg.cache.structure,
        block_tokens=bt,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        chunked_prefill=r.chunked_prefill,
        closed_loop=r.closed_loop,
        gated=r.gated,
        prefix_caching=r.prefix_caching,
        max_free_blocks=cfg.cache.max_free_blocks,
        min_recompute_tokens=cfg.cache.min_recompute_tokens,
        model=cfg.model.name,
        admission=cfg.cache.admission,
        load_overlap=r.load_overlap,
        sliding_window_rule=r.sliding_window_rule,
    )


def _replay_metrics(
    cfg: ExperimentConfig, trace: Trace, policy: Policy, blocks: int, bt: int
) -> tuple[dict[str, Any], I64]:
    """Replay a block or radix cell: its metrics and hit tokens."""
    from prefixlab.runner.replay import ReplayConfig, replay

    rc = ReplayConfig(
        capacity_blocks=blocks,
        structure=cfg.cache.structure,
        block_tokens=bt,
        max_free_blocks=cfg.cache.max_free_blocks,
        cache_partial=cfg.cache.cache_partial,
        min_recompute_tokens=cfg.cache.min_recompute_tokens,
        prefix_caching=cfg.runner.prefix_caching,
        model=cfg.model.name,
        admission=cfg.cache.admission,
    )
    assert isinstance(policy, EvictionPolicy)  # the structure is block or radix
    res = replay(trace, policy, rc)
    return dict(res.metrics), res.hit_tokens


def _run_cell(cfg: ExperimentConfig, cell: Cell, detail: bool, start: float) -> CellResult:
    trace = build_trace(cfg, cell.variant, cell.seed)
    if cfg.cache.structure == "hybrid":
        return _run_hybrid_cell(cfg, cell, detail, start, trace)
    blocks, ws = capacity_blocks(cfg, cell, trace)
    bt = block_tokens_for(cfg, trace)
    policy = make_policy(policy_spec(cell.policy, cell.seed), cfg.cache.structure)
    row = _base_row(
        cfg,
        cell,
        capacity_blocks=blocks,
        structure=cfg.cache.structure,
        block_tokens=bt,
        capacity_bytes=kv_bytes(blocks, bt, cfg.model.name),
        working_set_blocks=ws,
        capacity_fraction_ws=blocks / ws if ws else math.nan,
    )
    times: tuple[F64, F64, F64, F64] | None = None
    if cfg.runner.kind == "replay":
        metrics, hit_tokens = _replay_metrics(cfg, trace, policy, blocks, bt)
    else:
        timing = _cell_timing(cfg)
        ec = _engine_config(cfg, blocks, bt)
        metrics, row["timing"], hit_tokens, times = _engine_metrics(
            trace, policy, ec, timing, cell.variant
        )
    for key, value in metrics.items():
        if key in row:
            row[key] = value
    row.update(_flops(cfg, trace.input_length, hit_tokens))
    breakdown, cdf, requests = _tables(row, trace, hit_tokens, times, detail)
    _plain_row(row)
    return CellResult(
        cell.cell_id, row, breakdown, cdf, requests, time.perf_counter() - start, _worker()
    )


def _worker() -> str:
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _flops(cfg: ExperimentConfig, inputs: I64, hits: I64) -> dict[str, float]:
    """FLOPs of the prompts without a cache, and what the hits saved, per layer type
    (Marconi's accounting: full attention square, DESIGN §4)."""
    if cfg.model.name is None:
        return {}
    from prefixlab.model.spec import get_model

    return get_model(cfg.model.name).flops_saved(inputs, hits)


def length_bin(n: int) -> str:
    edges = LENGTH_BINS
    for lo, hi in itertools.pairwise(edges):
        if lo <= n < hi:
            return f"{lo}-{hi - 1}"
    return f"{edges[-1]}+"


def _breakdown(
    row: dict[str, Any], trace: Trace, hits: I64, times: tuple[F64, F64, F64, F64] | None
) -> list[dict[str, Any]]:
    """Token hit ratio (and TTFT with the engine) per task label and per input-length bin."""
    keys = {k: row[k] for k in KEY_COLUMNS}
    inputs = trace.input_length
    lat = None if times is None else {"ttft": times[2] - times[0], "prefill": times[2] - times[1]}
    groups: list[tuple[str, list[str]]] = [
        ("task", [t if t is not None else "-" for t in trace.task]),
        ("length_bin", [length_bin(int(x)) for x in inputs.tolist()]),
    ]
    out: list[dict[str, Any]] = []
    for dim, labels in groups:
        arr = np.array(labels, dtype=object)
        if dim == "task":
            order = sorted(set(labels))
        else:
            order = sorted(set(labels), key=lambda s: int(s.split("-")[0].rstrip("+")))
        for label in order:
            sel = arr == label
            num_in = int(inputs[sel].sum())
            num_hit = int(hits[sel].sum())
            rec: dict[str, Any] = {
                **keys,
                "dimension": dim,
                "group": label,
                "num_requests": int(sel.sum()),
                "num_input_tokens": num_in,
                "num_hit_tokens": num_hit,
                "token_hit_ratio": num_hit / num_in if num_in else 0.0,
            }
            for name in ("ttft", "prefill"):
                v = lat[name][sel] if lat is not None else None
                rec[f"mean_{name}_s"] = float(v.mean()) if v is not None else math.nan
                rec[f"p95_{name}_s"] = float(np.percentile(v, 95)) if v is not None else math.nan
            out.append(rec)
    return out


def _cdf(row: dict[str, Any], times: tuple[F64, F64, F64, F64]) -> list[dict[str, Any]]:
    keys = {k: row[k] for k in KEY_COLUMNS}
    arrival, scheduled, first, _ = times
    qs = np.linspace(0.0, 1.0, CDF_POINTS)
    ttft = np.quantile(first - arrival, qs)
    prefill = np.quantile(first - scheduled, qs)
    return [
        {**keys, "quantile": round(float(q), 6), "ttft_s": float(a), "prefill_s": float(b)}
        for q, a, b in zip(qs, ttft, prefill, strict=True)
    ]


def _requests(
    trace: Trace, hits: I64, times: tuple[F64, F64, F64, F64] | None
) -> dict[str, list[Any]]:
    n = len(trace)
    out: dict[str, list[Any]] = {
        "request": list(range(n)),
        "session_id": list(trace.session_id),
        "task": list(trace.task),
        "input_length": trace.input_length.tolist(),
        "output_length": trace.output_length.tolist(),
        "hit_tokens": hits.tolist(),
    }
    if times is not None:
        arrival, scheduled, first, finish = times
        out["arrival_s"] = arrival.tolist()
        out["scheduled_s"] = scheduled.tolist()
        out["first_token_s"] = first.tolist()
        out["finish_s"] = finish.tolist()
        out["ttft_s"] = (first - arrival).tolist()
        out["prefill_s"] = (first - scheduled).tolist()
        out["queue_s"] = (scheduled - arrival).tolist()
    return out


def _check_hybrid_size(cfg: ExperimentConfig, cell: Cell, size: int) -> None:
    """A hybrid capacity must hold at least one state and one block of KV: a smaller one
    (blocks written where bytes are meant, say) would reject every request silently."""
    from prefixlab.model.spec import get_model

    assert cfg.model.name is not None
    spec = get_model(cfg.model.name)
    least = spec.state_bytes_per_checkpoint + 32 * spec.kv_bytes_per_token
    if size < least:
        raise ConfigError(
            f"cache.capacities[{cell.capacity_index}] = {cell.capacity!r}: {size:,} bytes "
            f"cannot hold one state and one block of {spec.name} ({least:,} B); the hybrid "
            "cache's capacities are bytes ('40GB')"
        )


def check_cells(cfg: ExperimentConfig, cells: list[Cell]) -> None:
    """Build each (variant, seed) trace once and resolve every capacity, so an impossible
    capacity or a broken workload fails before anything runs."""
    seen: set[tuple[str, int, int]] = set()
    for cell in cells:
        key = (variant_label(cell.variant), cell.seed, cell.capacity_index)
        if key in seen:
            continue
        seen.add(key)
        trace = build_trace(cfg, cell.variant, cell.seed)
        if cfg.cache.structure == "hybrid":
            size = _cell_bytes(cfg, cell)
            _check_hybrid_size(cfg, cell, size)
            if trace.input_tokens is None:
                raise ConfigError(f"{trace.name}: the hybrid structure needs token ids")
            continue
        capacity_blocks(cfg, cell, trace)


__all__ = [
    "COLUMNS",
    "Cell",
    "CellResult",
    "build_trace",
    "check_cells",
    "plan",
    "run_cell",
]
