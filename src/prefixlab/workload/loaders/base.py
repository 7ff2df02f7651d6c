"""Loader registry and the field checks every line-oriented loader shares."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload.trace import Request, Trace

Loader = Callable[..., Trace]
LOADERS: dict[str, Loader] = {}


def register_loader(name: str) -> Callable[[Loader], Loader]:
    """Register a loader under a format name (``--format NAME``)."""

    def deco(fn: Loader) -> Loader:
        LOADERS[name] = fn
        return fn

    return deco


def load_trace(path: str | Path, fmt: str = "native", **kwargs: Any) -> Trace:
    """Load a trace file with the loader registered as ``fmt``."""
    limit = kwargs.get("limit")
    if limit is not None and limit <= 0:
        raise ConfigError(f"limit must be positive, got {limit}")
    if fmt not in LOADERS:
        raise ConfigError(f"unknown trace format '{fmt}'; known: {', '.join(sorted(LOADERS))}")
    if not Path(path).is_file():
        raise ConfigError(f"trace file not found: {path}")
    return LOADERS[fmt](Path(path), **kwargs)


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; bad JSON names the line."""
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(str(path), lineno, None, f"bad JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(str(path), lineno, None, "expected a JSON object")
            yield lineno, obj


class FieldReader:
    """Reads typed fields of one JSON object, raising errors that name file, line and field."""

    __slots__ = ("lineno", "obj", "path")

    def __init__(self, path: Path, lineno: int, obj: dict[str, Any]) -> None:
        self.path = path
        self.lineno = lineno
        self.obj = obj

    def fail(self, field: str, message: str) -> TraceFormatError:
        return TraceFormatError(str(self.path), self.lineno, field, message)

    def _get(self, field: str, required: bool) -> Any:
        if field not in self.obj or self.obj[field] is None:
            if required:
                raise self.fail(field, "missing")
            return None
        return self.obj[field]

    def int_(self, field: str, required: bool = True, default: int = 0) -> int:
        v = self._get(field, required)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise self.fail(field, f"expected an integer, got {v!r}")
        if v < 0:
            raise self.fail(field, f"must be >= 0, got {v}")
        return v

    def float_(self, field: str, required: bool = True, default: float = 0.0) -> float:
        v = self._get(field, required)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(field, f"expected a number, got {v!r}")
        if v != v or v < 0:
            raise self.fail(field, f"must be a number >= 0, got {v}")
        return float(v)

    def str_(self, field: str) -> str | None:
        v = self._get(field, False)
        if v is None:
            return None
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            return str(v)
        raise self.fail(field, f"expected a string, got {v!r}")

    def int_list(self, field: str, required: bool = True, limit: int = 1 << 63) -> list[int] | None:
        v = self._get(field, required)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self.fail(field, "expected a list of integers")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < limit:
                raise self.fail(field, f"expected integers in [0, {limit}), found {x!r}")
        return v


def build_trace(
    path: Path, requests: Iterable[Request], limit: int | None, block_tokens: int | None = None
) -> Trace:
    """The shared tail of line loaders: take at most ``limit`` requests and build the trace."""
    taken = list(itertools.islice(requests, limit))
    if not taken:
        raise TraceFormatError(str(path), 0, None, "no requests in file")
    return Trace.from_requests(taken, block_tokens=block_tokens, name=path.stem)


def check_hash_ids(reader: FieldReader, hash_ids: list[int], hashed: int, bt: int) -> None:
    """hash_ids must cover every full block the request claims."""
    if len(set(hash_ids)) != len(hash_ids):
        seen: set[int] = set()
        for x in hash_ids:
            if x in seen:
                raise reader.fail("hash_ids", f"id {x} appears twice (an id names a prefix)")
            seen.add(x)
    if len(hash_ids) < hashed // bt:
        raise reader.fail(
            "hash_ids",
            f"{len(hash_ids)} ids but {hashed} hashed tokens claim {hashed // bt} full "
            f"{bt}-token blocks",
        )
