"""Expert-cache sweeps into a results folder (the layout of ``prefixlab sweep``).

::

    RESULTS/
      config.resolved.json   the sweep config (kind = "experts"), defaults filled in
      environment.json       Python, platform, package versions, CPU count
      cells/ID.json          one finished (variant, seed): its rows (the resume marker)
      results.parquet|csv    one row per (variant, seed, capacity, policy)
      timings.csv            wall-clock seconds of each cell (not a result)

A cell is one workload variant and seed: its trace is generated (or read) once and every
capacity and policy replays it, with OPT computed once per capacity for the fault ratio.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixlab.errors import ConfigError
from prefixlab.experiments.execute import check_backend, run_cells
from prefixlab.experiments.store import CellStore
from prefixlab.experts.config import ExpertSweepConfig, Scalar, resolve_capacities
from prefixlab.io import folder_lock

#: columns of results.parquet, in order (variant parameters come after ``variant``)
COLUMNS = [
    "variant",
    "seed",
    "num_layers",
    "num_experts",
    "capacity_spec",
    "capacity",
    "policy",
    "num_requests",
    "num_faults",
    "num_first_use_faults",
    "fault_rate",
    "fault_ratio_to_opt",
]


@dataclass(frozen=True, slots=True)
class ExpertCell:
    """One workload variant and seed."""

    index: int
    variant: dict[str, Scalar]
    seed: int
    spec: str

    @property
    def cell_id(self) -> str:
        return f"{self.index:04d}-s{self.seed}"

    def label(self) -> str:
        return variant_label(self.variant) or "trace"


def variant_label(variant: dict[str, Scalar]) -> str:
    """``a=1.0,shuffle=true``: values written as in a trace spec."""
    from prefixlab.experts.config import spec_text

    return ",".join(f"{k}={spec_text(v)}" for k, v in variant.items())


def plan(cfg: ExpertSweepConfig) -> list[ExpertCell]:
    """Every (variant, seed), variants in config order, seeds within each."""
    return [
        ExpertCell(i, v, s, cfg.trace_spec(v, s))
        for i, v in enumerate(cfg.variants())
        for s in cfg.seeds
    ]


def _fingerprint(cfg: ExpertSweepConfig, cell: ExpertCell) -> str:
    """What a stored cell depends on: the trace spec (for a file also its size and
    modification time, so a rewritten file reruns), capacities, policies and the version."""
    from importlib.metadata import PackageNotFoundError, version

    source: list[object] = [cell.spec]
    if not cfg.is_generated():
        try:
            st = os.stat(cell.spec)
            source += [st.st_size, st.st_mtime_ns]
        except OSError:
            source.append(None)
    try:
        ours = version("prefixlab")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        ours = "source"
    doc = json.dumps([source, cfg.capacities, cfg.policies, ours], sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def run_cell(cfg: ExpertSweepConfig, cell: ExpertCell) -> dict[str, Any]:
    """Generate (or read) the cell's trace and simulate every capacity and policy."""
    from prefixlab.experts.simulate import sweep_capacities
    from prefixlab.experts.trace_io import load_expert_trace

    start = time.perf_counter()
    trace = load_expert_trace(cell.spec)
    caps = resolve_capacities(cfg.capacities, trace.num_layers, trace.num_experts)
    label_of = {pages: label for label, pages in caps}
    rows = []
    for r in sweep_capacities(trace, [p for _, p in caps], cfg.policies, seed=cell.seed):
        row: dict[str, Any] = {
            "variant": cell.label(),
            **cell.variant,
            "seed": cell.seed,
            "num_layers": trace.num_layers,
            "num_experts": trace.num_experts,
            "capacity_spec": label_of[int(str(r["capacity"]))],
        }
        row.update({k: r[k] for k in COLUMNS[5:]})
        row["policy"] = r["spec"]  # as the config names it (the resolved spec adds a seed)
        rows.append(row)
    return {
        "rows": rows,
        "fingerprint": _fingerprint(cfg, cell),
        "wall_s": time.perf_counter() - start,
        "worker": f"pid{os.getpid()}",
    }


@dataclass(slots=True)
class ExpertSweepSummary:
    folder: Path
    cells: list[ExpertCell]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    tables: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0


Progress = Callable[[int, int, ExpertCell | None], None]


#: what an expert cell file holds
CELL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rows": list,
    "fingerprint": str,
    "wall_s": (int, float),
    "worker": str,
}


def _done(cfg: ExpertSweepConfig, store: CellStore, cells: list[ExpertCell]) -> set[str]:
    """Cells already stored for this exact config (a changed config reruns them)."""
    out = set()
    stored = store.done()
    for cell in cells:
        if cell.cell_id in stored:
            try:
                doc = store.read_cell(cell.cell_id, CELL_FIELDS)
            except ConfigError:  # unreadable or not a cell: it reruns, and is overwritten
                continue
            if doc["fingerprint"] == _fingerprint(cfg, cell):
                out.add(cell.cell_id)
    return out


def run_expert_sweep(
    cfg: ExpertSweepConfig,
    folder: str | Path,
    *,
    jobs: int = 1,
    progress: Progress | None = None,
    backend: str = "local",
    address: str | None = None,
) -> ExpertSweepSummary:
    """Run the cells of ``cfg`` not yet in ``folder`` and write the tables.

    Args:
        jobs: worker processes (local) or CPUs of a local Ray instance; 1 runs in-process.
        progress: called after each finished cell.
        backend: ``local`` or ``ray`` (:func:`prefixlab.experiments.execute.run_cells`,
            as every study kind).
        address: a Ray cluster to join (``backend="ray"`` only).
    """
    check_backend(jobs, backend, address)
    with folder_lock(folder):  # one sweep at a time writes a folder
        return _run_expert_sweep(cfg, Path(folder), jobs, progress, backend, address)


def _run_expert_sweep(
    cfg: ExpertSweepConfig,
    out: Path,
    jobs: int,
    progress: Progress | None,
    backend: str,
    address: str | None,
) -> ExpertSweepSummary:
    start = time.perf_counter()
    cells = plan(cfg)
    store = CellStore(out)
    done = _done(cfg, store, cells)
    todo = [c for c in cells if c.cell_id not in done]
    summary = ExpertSweepSummary(out, cells, skipped=sorted(done))
    store.prepare(cfg)
    if progress is not None:
        progress(0, len(todo), None)

    def finished(doc: dict[str, Any], cell: ExpertCell) -> bool:
        store.write_cell(cell.cell_id, doc)
        summary.ran.append(cell.cell_id)
        if progress is not None:
            progress(len(summary.ran), len(todo), cell)
        return False

    run_cells(run_cell, cfg, todo, finished, jobs=jobs, backend=backend, address=address)
    summary.tables = consolidate(store, cells)
    summary.wall_s = time.perf_counter() - start
    return summary


def consolidate(store: CellStore, cells: list[ExpertCell]) -> dict[str, Path]:
    """Write results.parquet/csv and timings.csv from the cell files, in plan order."""
    rows: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    for cell in cells:
        doc = store.read_cell(cell.cell_id, CELL_FIELDS)
        rows += doc["rows"]
        timings.append(
            {
                "cell_id": cell.cell_id,
                "label": cell.label(),
                "wall_s": doc["wall_s"],
                "worker": doc["worker"],
            }
        )
    if not rows:
        raise ConfigError(
            "no results: every policy is undefined at these capacities (-dist policies need "
            "k >= the number of layers); add a capacity of at least num_layers or another policy"
        )
    return store.write_tables({"results": rows}, timings)


def is_experts_folder(folder: str | Path) -> bool:
    """Whether a results folder holds an expert-cache sweep."""
    path = Path(folder) / "config.resolved.json"
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("kind") == "experts")
    except (OSError, json.JSONDecodeError):
        return False
