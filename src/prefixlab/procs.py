"""Worker processes that die with their parent.

A sweep's pool (and Marconi's parallel tuner, and UniCache's reproduction) runs cells in
spawned worker processes. Killed with ``kill -9``, the parent cannot tell them to stop, and
a worker waiting on its task queue would wait for ever, holding its memory and keeping
multiprocessing's resource tracker alive. Each worker therefore asks the kernel, as it
starts, for ``SIGKILL`` when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``); where that
call does not exist, a watchdog thread polls the parent's pid.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import SpawnContext
from types import TracebackType

#: ``prctl`` option: the signal a process gets when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1
#: seconds between the watchdog's looks at the parent, where prctl is missing
WATCH_S = 0.5


def worker_init(parent: int) -> None:
    """Pool initializer: Ctrl-C is the parent's to handle (it stops the pool, see
    :class:`WorkerPool`), and this process ends when ``parent`` is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` (the pool's owner) is gone."""
    if sys.platform.startswith("linux") and _pdeathsig():
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)
        return
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="die-with-parent").start()


def _pdeathsig() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(1)


def worker_context() -> SpawnContext:
    """The context every prefixlab pool starts its workers with: spawned (no forked locks
    from a progress thread)."""
    return multiprocessing.get_context("spawn")


class WorkerPool(ProcessPoolExecutor):
    """A process pool whose workers ignore Ctrl-C and die with this process; left by an
    exception (Ctrl-C's ``KeyboardInterrupt`` included), it stops its workers at once
    instead of waiting for their tasks to end."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if exc_type is not None:
            self.stop()
        return super().__exit__(exc_type, exc, tb)

    def stop(self) -> None:
        """Terminate the workers and drop the queued tasks."""
        terminate = getattr(self, "terminate_workers", None)  # Python 3.14
        if terminate is not None:
            terminate()
            return
        processes = getattr(self, "_processes", None) or {}
        for proc in list(processes.values()):
            proc.terminate()
        self.shutdown(wait=True, cancel_futures=True)


def process_pool(workers: int) -> WorkerPool:
    """A process pool of spawned workers that die with this process."""
    return WorkerPool(
        max_workers=workers,
        mp_context=worker_context(),
        initializer=worker_init,
        initargs=(os.getpid(),),
    )
