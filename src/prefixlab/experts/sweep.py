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
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from prefixlab.errors import ConfigError
from prefixlab.experiments.store import CellStore
from prefixlab.experiments.study import Progress, Study, SweepSummary, run_study
from prefixlab.experts.config import ExpertSweepConfig, Scalar, resolve_capacities
from prefixlab.types import Row

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


def run_cell(cfg: ExpertSweepConfig, cell: ExpertCell) -> ExpertCellDoc:
    """Generate (or read) the cell's trace and simulate every capacity and policy."""
    from prefixlab.experts.simulate import sweep_capacities
    from prefixlab.experts.trace_io import load_expert_trace

    start = time.perf_counter()
    trace = load_expert_trace(cell.spec)
    caps = resolve_capacities(cfg.capacities, trace.num_layers, trace.num_experts)
    label_of = {pages: label for label, pages in caps}
    rows = []
    for r in sweep_capacities(trace, [p for _, p in caps], cfg.policies, seed=cell.seed):
        row: Row = {
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


class ExpertCellDoc(TypedDict):
    """What an expert cell file holds."""

    rows: list[Row]
    fingerprint: str
    wall_s: float
    worker: str


def _task(payload: object, cell: ExpertCell) -> ExpertCellDoc:
    """What a worker runs (top level, so process pools and Ray can ship it)."""
    assert isinstance(payload, ExpertSweepConfig)
    return run_cell(payload, cell)


class ExpertStudy(Study[ExpertCell, ExpertCellDoc, CellStore]):
    """An expert-cache study: a cell is one workload variant and seed."""

    config: ExpertSweepConfig

    def __init__(self, config: ExpertSweepConfig) -> None:
        super().__init__(config)

    def plan(self) -> list[ExpertCell]:
        return plan(self.config)

    def store(self, folder: Path) -> CellStore:
        return CellStore(folder)

    def done(self, store: CellStore, cells: list[ExpertCell]) -> set[str]:
        """Cells already stored for this exact config (a changed config, or a rewritten
        trace file, reruns them; an unreadable cell file reruns and is overwritten)."""
        out = set()
        stored = store.done()
        for cell in cells:
            if cell.cell_id in stored:
                try:
                    doc = store.read_cell(cell.cell_id, ExpertCellDoc)
                except ConfigError:
                    continue
                if doc["fingerprint"] == _fingerprint(self.config, cell):
                    out.add(cell.cell_id)
        return out

    def task(self) -> tuple[Callable[[object, ExpertCell], ExpertCellDoc], object]:
        return _task, self.config

    def save(self, store: CellStore, result: ExpertCellDoc, cell: ExpertCell) -> None:
        store.write_cell(cell.cell_id, result)

    def consolidate(self, store: CellStore, cells: list[ExpertCell]) -> dict[str, Path]:
        return consolidate(store, cells)


def run_expert_sweep(
    cfg: ExpertSweepConfig,
    folder: str | Path,
    *,
    jobs: int = 1,
    progress: Progress[ExpertCell] | None = None,
    backend: str = "local",
    address: str | None = None,
    stop_after: int | None = None,
) -> SweepSummary[ExpertCell]:
    """Run the cells of ``cfg`` not yet in ``folder`` and write the tables
    (:func:`~prefixlab.experiments.study.run_study`, as every study kind).

    Args:
        jobs: worker processes (local) or CPUs of a local Ray instance; 1 runs in-process.
        progress: called after each finished cell.
        backend: ``local`` or ``ray``.
        address: a Ray cluster to join (``backend="ray"`` only).
        stop_after: stop after this many cells without consolidating (tests of resume).
    """
    return run_study(
        ExpertStudy(cfg),
        folder,
        jobs=jobs,
        backend=backend,
        address=address,
        progress=progress,
        stop_after=stop_after,
    )


def consolidate(store: CellStore, cells: list[ExpertCell]) -> dict[str, Path]:
    """Write results.parquet/csv and timings.csv from the cell files, in plan order."""
    rows: list[Row] = []
    timings: list[Row] = []
    for cell in cells:
        doc = store.read_cell(cell.cell_id, ExpertCellDoc)
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
