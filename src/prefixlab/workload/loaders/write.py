"""Write a trace in one of prefixlab's own formats: native JSONL or Parquet."""

from __future__ import annotations

from pathlib import Path

from prefixlab.errors import ConfigError
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.loaders.parquet import write_parquet
from prefixlab.workload.trace import Trace

#: the formats a trace can be written in
WRITABLE = ("native", "parquet")


def output_format(path: Path, to: str | None = None) -> str:
    """The format ``path`` is written in (``to``, else by its suffix), checked before any
    work: the folder must exist and the format be one of :data:`WRITABLE`."""
    if not path.parent.resolve().is_dir():
        raise ConfigError(f"--out: folder {path.parent} does not exist")
    if to is not None and to not in WRITABLE:
        raise ConfigError(f"--to must be {' or '.join(WRITABLE)}, got {to!r}")
    return to or ("parquet" if path.suffix == ".parquet" else "native")


def write_trace(tr: Trace, path: Path, to: str | None = None) -> None:
    """Write ``tr`` to ``path`` whole or not at all (native JSONL, or Parquet for
    ``.parquet`` or ``to="parquet"``)."""
    if output_format(path, to) == "parquet":
        write_parquet(tr, path)
    else:
        write_native(tr, path)
