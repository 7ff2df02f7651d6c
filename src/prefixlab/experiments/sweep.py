"""Run an experiment's cells: in this process, on a local process pool, or on a Ray cluster.

Every backend calls the same :func:`~prefixlab.experiments.run.run_cell` on the same cells,
and this process writes each finished cell to the store as it arrives. A rerun skips the
cells already there, so a killed sweep resumes where it stopped.

Ray: ``backend="ray"`` connects to ``address`` (``"auto"``, ``"ray://head:10001"``) or, with
none, starts a local single-node Ray instance with ``jobs`` CPUs. Ray 2.x removed its
``local_mode``, so tests use that local instance. On a cluster, a trace file must be at the
same path on every node (a generated workload needs nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.experiments.config import ExperimentConfig
from prefixlab.experiments.run import Cell, CellResult, check_cells, plan, run_cell
from prefixlab.experiments.store import ResultsStore
from prefixlab.io import folder_lock
from prefixlab.procs import process_pool

BACKENDS = ("local", "ray")

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


def _task(cfg: ExperimentConfig, cell: Cell, detail: bool) -> CellResult:
    """What a worker runs (top level, so process pools and Ray can ship it)."""
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
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r} unknown; known: {', '.join(BACKENDS)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be a positive integer, got {jobs!r}")
    if address is not None and backend != "ray":
        raise ConfigError("--address applies to --backend ray")
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

    if todo:
        if backend == "ray":
            _run_ray(cfg, todo, jobs, address, detail, finished)
        elif jobs == 1:
            for cell in todo:
                if finished(run_cell(cfg, cell, detail), cell):
                    break
        else:
            _run_pool(cfg, todo, jobs, detail, finished)
    if stop_after is not None and len(summary.ran) < total:
        summary.wall_s = time.perf_counter() - start
        return summary
    summary.tables = store.consolidate(cells)
    summary.wall_s = time.perf_counter() - start
    return summary


def _run_pool(
    cfg: ExperimentConfig,
    todo: list[Cell],
    jobs: int,
    detail: bool,
    finished: Callable[[CellResult, Cell], bool],
) -> None:
    payload = cfg
    # spawned (no forked locks from the progress thread), dying with this process; workers
    # keep their trace between cells
    with process_pool(jobs) as pool:
        pending: dict[Future[CellResult], Cell] = {}
        queue = list(reversed(todo))
        while queue and len(pending) < 2 * jobs:
            cell = queue.pop()
            pending[pool.submit(_task, payload, cell, detail)] = cell
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    cell = pending.pop(fut)
                    if finished(_result_of(fut, cell), cell):
                        raise _Stop
                    if queue:
                        nxt = queue.pop()
                        pending[pool.submit(_task, payload, nxt, detail)] = nxt
        except _Stop:
            for fut in pending:
                fut.cancel()
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


class _Stop(Exception):
    pass


def _result_of(fut: Future[CellResult], cell: Cell) -> CellResult:
    try:
        return fut.result()
    except PrefixlabError:
        raise
    except Exception as exc:  # a worker crash: say which cell
        raise PrefixlabError(f"{cell.label()}: worker failed: {exc!r}") from exc


def _run_ray(
    cfg: ExperimentConfig,
    todo: list[Cell],
    jobs: int,
    address: str | None,
    detail: bool,
    finished: Callable[[CellResult, Cell], bool],
) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'prefixlab[ray]'") from None
    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            kwargs["num_cpus"] = jobs
        else:
            kwargs["address"] = address
        try:
            ray.init(**kwargs)
        except Exception as exc:  # connection refused, bad address...
            raise ConfigError(f"cannot start or join Ray ({address or 'local'}): {exc}") from None
    try:
        remote = ray.remote(num_cpus=1)(_task)
        payload = ray.put(cfg)
        refs = {remote.remote(payload, cell, detail): cell for cell in todo}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                cell = refs[ref]
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause if isinstance(exc.cause, Exception) else exc
                    if isinstance(cause, PrefixlabError):
                        raise type(cause)(str(cause)) from None
                    raise PrefixlabError(f"{cell.label()}: Ray task failed: {cause!r}") from None
                if finished(result, cell):
                    for r in pending:
                        ray.cancel(r)
                    return
    finally:
        if started:
            ray.shutdown()
