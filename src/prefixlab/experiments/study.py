"""The study engine: plan a study's cells, skip those stored, run the rest, consolidate.

Every study kind (a prefix or hybrid cache experiment, an expert-cache study; later a
fleet) is a :class:`Study`: it says what its cells are, how one runs (a top-level task, so
process pools and Ray can ship it), how a finished cell is saved and which tables the
stored cells make. :func:`run_study` does the rest once for every kind:

- one sweep at a time writes a folder (:func:`prefixlab.io.folder_lock`);
- cells already stored for this config are skipped (resume), the others checked first,
  then run in this process, on a local pool or on Ray (:func:`~prefixlab.experiments.
  execute.run_cells`);
- each finished cell is saved by this process as it arrives, so a killed sweep loses only
  the cells in flight;
- the tables are written from the cell files in plan order, so they are the same bit for
  bit whichever backend ran the cells.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from prefixlab.configfile import ConfigModel
from prefixlab.experiments.execute import CellLike, check_backend, run_cells
from prefixlab.experiments.store import CellStore
from prefixlab.io import folder_lock


class StudyCell(CellLike, Protocol):
    """What the engine reads of a cell: its id (its file's name) and label (progress)."""

    @property
    def cell_id(self) -> str: ...


C = TypeVar("C", bound=StudyCell)
R = TypeVar("R")
S = TypeVar("S", bound=CellStore)

#: progress callback: (cells finished so far, cells to run this time, the cell just done)
Progress = Callable[[int, int, C | None], None]


class Study(ABC, Generic[C, R, S]):
    """One study of a config: its cells, how each runs and is saved, and its tables."""

    def __init__(self, config: ConfigModel) -> None:
        self.config = config

    @abstractmethod
    def plan(self) -> list[C]:
        """Every cell, in table order."""

    @abstractmethod
    def store(self, folder: Path) -> S:
        """The results folder's store."""

    def done(self, store: S, cells: list[C]) -> set[str]:
        """Ids of the cells of ``cells`` already stored for this config."""
        stored = store.done()
        return {c.cell_id for c in cells if c.cell_id in stored}

    def check(self, todo: list[C]) -> None:
        """Fail (one-line error) before anything runs, e.g. on an impossible capacity."""

    @abstractmethod
    def task(self) -> tuple[Callable[[object, C], R], object]:
        """The top-level function a worker runs, ``fn(payload, cell) -> result``, and its
        payload (shipped once to each worker)."""

    @abstractmethod
    def save(self, store: S, result: R, cell: C) -> None:
        """Store a finished cell (its JSON last: the resume marker)."""

    @abstractmethod
    def consolidate(self, store: S, cells: list[C]) -> dict[str, Path]:
        """Write the tables from the stored cells, in plan order; their Parquet paths."""


@dataclass(slots=True)
class SweepSummary(Generic[C]):
    """What a run did: the folder, every cell of the plan, those run now and those reused,
    the tables written and the wall-clock time."""

    folder: Path
    cells: list[C]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    tables: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0


def run_study(
    study: Study[C, R, S],
    folder: str | Path,
    *,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
    progress: Progress[C] | None = None,
    stop_after: int | None = None,
) -> SweepSummary[C]:
    """Run the cells of ``study`` not yet in ``folder`` and write the tables.

    Args:
        jobs: worker processes (local) or CPUs of a local Ray instance; 1 runs in-process.
        backend: ``local`` or ``ray``.
        address: a Ray cluster to join (``backend="ray"`` only).
        progress: called after each finished cell (and once before the first).
        stop_after: stop after this many cells without consolidating (tests of resume).
    """
    check_backend(jobs, backend, address)
    with folder_lock(folder):  # one sweep at a time writes a folder
        return _run(study, Path(folder), jobs, backend, address, progress, stop_after)


def _run(
    study: Study[C, R, S],
    folder: Path,
    jobs: int,
    backend: str,
    address: str | None,
    progress: Progress[C] | None,
    stop_after: int | None,
) -> SweepSummary[C]:
    start = time.perf_counter()
    cells = study.plan()
    store = study.store(folder)
    done = study.done(store, cells)
    todo = [c for c in cells if c.cell_id not in done]
    summary = SweepSummary(folder, cells, skipped=[c.cell_id for c in cells if c.cell_id in done])
    if todo:
        study.check(todo)  # e.g. an impossible capacity fails before anything runs
    store.prepare(study.config)
    total = len(todo)
    if progress is not None:
        progress(0, total, None)

    def finished(result: R, cell: C) -> bool:
        study.save(store, result, cell)
        summary.ran.append(cell.cell_id)
        if progress is not None:
            progress(len(summary.ran), total, cell)
        return stop_after is not None and len(summary.ran) >= stop_after

    task, payload = study.task()
    run_cells(task, payload, todo, finished, jobs=jobs, backend=backend, address=address)
    if stop_after is None or len(summary.ran) >= total:
        summary.tables = study.consolidate(store, cells)
    summary.wall_s = time.perf_counter() - start
    return summary
