"""Run a study's cells: in this process, on a local process pool, or on a Ray cluster.

Every study kind hands :func:`run_cells` a top-level task (``task(payload, cell) ->
result``, so process pools and Ray can ship it), its config as the payload, and the cells
still to run; this process receives each finished cell's result, in the order they finish,
through ``finished`` (which stores it, and may stop the run by returning True).

Ray: ``backend="ray"`` connects to ``address`` (``"auto"``, ``"ray://head:10001"``) or, with
none, starts a local single-node Ray instance with ``jobs`` CPUs. Ray 2.x removed its
``local_mode``, so tests use that local instance. On a cluster, a trace file must be at the
same path on every node (a generated workload needs nothing).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Protocol, TypeVar

from prefixlab.errors import ConfigError, PrefixlabError
from prefixlab.procs import process_pool

BACKENDS = ("local", "ray")


class CellLike(Protocol):
    """What the executor reads of a cell: its label, for errors."""

    def label(self) -> str: ...


P = TypeVar("P")
C = TypeVar("C", bound=CellLike)
R = TypeVar("R")


def cell_id_of(fingerprint: str, *key: object) -> str:
    """A cell's id from its study's fingerprint and its own key (a changed config gives
    new ids, so its cells run again): 16 hex digits."""
    ident = json.dumps([fingerprint, *key], sort_keys=True, default=str)
    return hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()


def check_backend(jobs: int, backend: str, address: str | None) -> None:
    """The options of a run, checked before anything starts (one-line errors)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r} unknown; known: {', '.join(BACKENDS)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be a positive integer, got {jobs!r}")
    if address is not None and backend != "ray":
        raise ConfigError("--address applies to --backend ray")


def run_cells(
    task: Callable[[P, C], R],
    payload: P,
    todo: list[C],
    finished: Callable[[R, C], bool],
    *,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
) -> None:
    """``task(payload, cell)`` for every cell of ``todo``; ``finished(result, cell)`` in this
    process as each one ends (True stops the run: pending cells are cancelled)."""
    check_backend(jobs, backend, address)
    if not todo:
        return
    if backend == "ray":
        _run_ray(task, payload, todo, jobs, address, finished)
    elif jobs == 1 or len(todo) == 1:
        for cell in todo:
            if finished(task(payload, cell), cell):
                return
    else:
        _run_pool(task, payload, todo, jobs, finished)


def _run_pool(
    task: Callable[[P, C], R],
    payload: P,
    todo: list[C],
    jobs: int,
    finished: Callable[[R, C], bool],
) -> None:
    # spawned (no forked locks from the progress thread), dying with this process; workers
    # keep their state (a loaded trace) between cells; at most 2 x jobs cells in flight
    with process_pool(min(jobs, len(todo))) as pool:
        pending: dict[Future[R], C] = {}
        queue = list(reversed(todo))
        while queue and len(pending) < 2 * jobs:
            cell = queue.pop()
            pending[pool.submit(task, payload, cell)] = cell
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    cell = pending.pop(fut)
                    if finished(_result_of(fut, cell), cell):
                        raise _Stop
                    if queue:
                        nxt = queue.pop()
                        pending[pool.submit(task, payload, nxt)] = nxt
        except _Stop:
            for fut in pending:
                fut.cancel()
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


class _Stop(Exception):
    pass


def _result_of(fut: Future[R], cell: CellLike) -> R:
    try:
        return fut.result()
    except PrefixlabError:
        raise
    except Exception as exc:  # a worker crash: say which cell
        raise PrefixlabError(f"{cell.label()}: worker failed: {exc!r}") from exc


def _run_ray(
    task: Callable[[P, C], R],
    payload: P,
    todo: list[C],
    jobs: int,
    address: str | None,
    finished: Callable[[R, C], bool],
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
        remote = ray.remote(num_cpus=1)(task)
        shared = ray.put(payload)
        refs = {remote.remote(shared, cell): cell for cell in todo}
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
