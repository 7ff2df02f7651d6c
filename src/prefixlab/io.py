"""Writing files whole or not at all: the one helper every writer in prefixlab uses.

A file is written to a temp file beside its target, then renamed over it
(:func:`os.replace`, atomic on one file system): a reader sees the old file or the new
one, never half of one, and a failed or interrupted write leaves the target as it was
and no temp file behind. The temp file is created with mode 0666 and ``O_EXCL``, so the
process's umask gives it, and then the target, the permissions any other file it writes
gets (``tempfile.mkstemp`` would give 0600 whatever the umask); its name is unique per
process, thread and call, so writers of one folder never share a temp file.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

from prefixlab.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "atomic_open",
    "atomic_open_binary",
    "atomic_path",
    "atomic_write",
    "temp_beside",
    "write_table",
]

_count = itertools.count()


def temp_beside(path: str | Path) -> tuple[int, Path]:
    """A new, empty temp file beside ``path``, opened for writing: (descriptor, its path).
    Its mode is 0666 less the umask, as for any file the process creates."""
    target = Path(path)
    while True:
        name = f".{target.name}.{os.getpid()}-{threading.get_ident()}-{next(_count)}.tmp"
        tmp = target.with_name(name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # left by a process that had this id before
            continue
        return fd, tmp


@contextmanager
def _committed(path: str | Path) -> Iterator[tuple[int, Path]]:
    """A temp file beside ``path`` (descriptor, path), renamed over ``path`` when the block
    ends, removed if it raises."""
    fd, tmp = temp_beside(path)
    try:
        yield fd, tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside ``path`` for a writer that takes a path (pyarrow, numpy): it is
    renamed over ``path`` when the block ends, removed if the block raises."""
    with _committed(path) as (fd, tmp):
        os.close(fd)
        yield tmp


@contextmanager
def atomic_open(path: str | Path, newline: str | None = None) -> Iterator[TextIO]:
    """``open(path, "w")`` (UTF-8) written atomically: the file appears, whole, when the
    block ends, and is never touched if the block raises."""
    with _committed(path) as (fd, _), open(fd, "w", encoding="utf-8", newline=newline) as fh:
        yield fh


@contextmanager
def atomic_open_binary(path: str | Path) -> Iterator[BinaryIO]:
    """``open(path, "wb")`` written atomically (see :func:`atomic_open`)."""
    with _committed(path) as (fd, _), open(fd, "wb") as fh:
        yield fh


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_open_binary(path) as fh:
        fh.write(raw)


def write_table(table: pa.Table, path: str | Path) -> None:
    """A pyarrow table written atomically, as Parquet or, for a ``.csv`` path, as CSV."""
    with atomic_path(path) as tmp:
        if Path(path).suffix == ".csv":
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, tmp)
        else:
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)


@contextmanager
def folder_lock(folder: str | Path) -> Iterator[None]:
    """Hold ``folder``'s lock (a ``.lock`` file in it, created with the folder if need be)
    while the block runs, so that two sweeps never write one results folder: a second one
    fails at once with a ConfigError naming the holder's pid. The lock is the kernel's
    (``flock``): it goes with the process however that ends, ``kill -9`` included."""
    import fcntl

    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open(where / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(
                f"{where}: another sweep is writing this folder (pid {holder}); wait for it "
                "to finish, or give another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # (releases the lock)
