"""Run an experiment's cells (:mod:`prefixlab.experiments.execute`: in this process, on a
local process pool, or on a Ray cluster).

Every backend calls the same :func:`~prefixlab.experiments.run.run_cell` on the same cells,
and this process writes each finished cell to the store as it arrives. A rerun skips the
cells already there, so a killed sweep resumes where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefixlab.experiments.config import ExperimentConfig
from prefixlab.experiments.execute import check_backend, run_cells
from prefixlab.experiments.run import Cell, CellResult, check_cells, plan, run_cell
from prefixlab.experiments.store import ResultsStore
from prefixlab.io import folder_lock

#: progress callback: (cells finished so far, cells to run this time, the cell just done)
Progress = Callable[[int, int, Cell | None], None]


@dataclass(slots=True)
class SweepSummary:
    folder: Path
    cells: list[Cell]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    tables: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0


def _task(payload: tuple[ExperimentConfig, bool], cell: Cell) -> CellResult:
    """What a worker runs (top level, so process pools and Ray can ship it): the config and
    whether to keep per-request rows, and a cell."""
    cfg, detail = payload
    return run_cell(cfg, cell, detail)


def run_sweep(
    cfg: ExperimentConfig,
    folder: str | Path,
    *,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
    detail: bool = False,
    progress: Progress | None = None,
    stop_after: int | None = None,
) -> SweepSummary:
    """Run the cells of ``cfg`` not yet in ``folder`` and consolidate the tables.

    Args:
        jobs: worker processes (local) or CPUs of a local Ray instance; 1 runs in-process.
        backend: ``local`` or ``ray``.
        address: a Ray cluster to join (``backend="ray"`` only).
        detail: also store per-request rows.
        progress: called after each finished cell.
        stop_after: stop after this many cells without consolidating (tests of resume).
    """
    check_backend(jobs, backend, address)
    with folder_lock(folder):  # one sweep at a time writes a folder
        return _run_sweep(cfg, folder, jobs, backend, address, detail, progress, stop_after)


def _run_sweep(
    cfg: ExperimentConfig,
    folder: str | Path,
    jobs: int,
    backend: str,
    address: str | None,
    detail: bool,
    progress: Progress | None,
    stop_after: int | None,
) -> SweepSummary:
    start = time.perf_counter()
    cells = plan(cfg)
    store = ResultsStore(folder)
    done = store.done(detail)
    todo = [c for c in cells if c.cell_id not in done]
    summary = SweepSummary(
        store.folder, cells, skipped=[c.cell_id for c in cells if c.cell_id in done]
    )
    if todo:
        check_cells(cfg, todo)  # an impossible capacity fails before anything runs
    store.prepare(cfg)
    total = len(todo)
    if progress is not None:
        progress(0, total, None)

    def finished(result: CellResult, cell: Cell) -> bool:
        store.save(result)
        summary.ran.append(cell.cell_id)
        if progress is not None:
            progress(len(summary.ran), total, cell)
        return stop_after is not None and len(summary.ran) >= stop_after

    run_cells(_task, (cfg, detail), todo, finished, jobs=jobs, backend=backend, address=address)
    if stop_after is not None and len(summary.ran) < total:
        summary.wall_s = time.perf_counter() - start
        return summary
    summary.tables = store.consolidate(cells)
    summary.wall_s = time.perf_counter() - start
    return summary
