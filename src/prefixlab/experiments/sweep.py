"""An experiment as a study (:mod:`prefixlab.experiments.study`): its cells are the cross
product of :func:`~prefixlab.experiments.run.plan`, each run by
:func:`~prefixlab.experiments.run.run_cell` and stored by :class:`~prefixlab.experiments.
store.ResultsStore`. A rerun skips the cells already there, so a killed sweep resumes where
it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from prefixlab.experiments.config import ExperimentConfig
from prefixlab.experiments.run import Cell, CellResult, check_cells, plan, run_cell
from prefixlab.experiments.store import ResultsStore
from prefixlab.experiments.study import Progress, Study, SweepSummary, run_study

__all__ = ["ExperimentStudy", "SweepSummary", "run_sweep"]


def _task(payload: object, cell: Cell) -> CellResult:
    """What a worker runs (top level, so process pools and Ray can ship it): the config and
    whether to keep per-request rows, and a cell."""
    cfg, detail = cast(tuple[ExperimentConfig, bool], payload)
    return run_cell(cfg, cell, detail)


class ExperimentStudy(Study[Cell, CellResult, ResultsStore]):
    """A prefix or hybrid cache experiment (``detail``: keep per-request rows too)."""

    config: ExperimentConfig

    def __init__(self, config: ExperimentConfig, detail: bool = False) -> None:
        super().__init__(config)
        self.detail = detail

    def plan(self) -> list[Cell]:
        return plan(self.config)

    def store(self, folder: Path) -> ResultsStore:
        return ResultsStore(folder)

    def done(self, store: ResultsStore, cells: list[Cell]) -> set[str]:
        stored = store.done(self.detail)  # detail asked later reruns cells stored without
        return {c.cell_id for c in cells if c.cell_id in stored}

    def check(self, todo: list[Cell]) -> None:
        check_cells(self.config, todo)

    def task(self) -> tuple[Callable[[object, Cell], CellResult], object]:
        return _task, (self.config, self.detail)

    def save(self, store: ResultsStore, result: CellResult, cell: Cell) -> None:
        store.save(result)

    def consolidate(self, store: ResultsStore, cells: list[Cell]) -> dict[str, Path]:
        return store.consolidate(cells)


def run_sweep(
    cfg: ExperimentConfig,
    folder: str | Path,
    *,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
    detail: bool = False,
    progress: Progress[Cell] | None = None,
    stop_after: int | None = None,
) -> SweepSummary[Cell]:
    """Run the cells of ``cfg`` not yet in ``folder`` and consolidate the tables
    (:func:`~prefixlab.experiments.study.run_study`; ``detail``: also store per-request
    rows)."""
    return run_study(
        ExperimentStudy(cfg, detail),
        folder,
        jobs=jobs,
        backend=backend,
        address=address,
        progress=progress,
        stop_after=stop_after,
    )
