"""Loader registry, the streaming load pipeline and the field checks loaders share."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from prefixlab.errors import ConfigError, PrefixlabError, TraceFormatError
from prefixlab.types import JSON
from prefixlab.workload.idcheck import (
    IdConflictMode,
    ParentCheck,
    id_conflict_mode,
    settle,
    trace_keys,
)
from prefixlab.workload.trace import Request, Trace, TraceBuilder


@dataclass(frozen=True, slots=True)
class Header:
    """Yielded by a loader before its requests: facts of the whole file.

    ``block_tokens``: the block size hash ids cover (hash form). ``sort_by_arrival``: the
    loader yields requests session by session with synthesised times, so the trace must be
    sorted by arrival once built.
    """

    block_tokens: int | None = None
    sort_by_arrival: bool = False


#: A loader streams a file: an optional :class:`Header`, then requests in file order.
Loader = Callable[..., Iterator[Request | Header]]
LOADERS: dict[str, Loader] = {}
#: Columnar fast paths: (path, options) -> the whole trace, or None to stream instead (a
#: fast path accepts only what its loader accepts, and leaves errors to the loader)
FAST_LOADERS: dict[str, Callable[[Path, LoadOptions], Trace | None]] = {}


class NotStreamable(Exception):
    """A chunked reader met what it does not accept (a bad line, arrivals out of order):
    load the file whole instead, whose line-by-line loader names the problem or sorts."""


#: Chunked readers: (path, options) -> chunks of consecutive kept requests in arrival
#: order, each with the bytes read so far; raises ``NotStreamable`` on anything it does not
#: accept (the caller then loads the file whole). For streamed replays.
CHUNK_LOADERS: dict[str, Callable[[Path, LoadOptions], Iterator[tuple[Trace, int]]]] = {}


#: requests per chunk when a format's own loader feeds a streamed replay
CHUNK_REQUESTS = 8192


def iter_chunks(
    path: str | Path,
    fmt: str,
    *,
    limit: int | None = None,
    sample: float | None = None,
    sample_seed: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
    chunk_requests: int | None = None,
    id_conflicts: str = "error",
    **kwargs: object,
) -> Iterator[tuple[Trace, int]] | None:
    """The file (or folder) as chunks of consecutive kept requests, each with the bytes read
    so far (0 when the reader cannot tell), in the order a whole load gives them; None when
    ``path`` does not exist (a whole load says so).

    A format's chunked reader (``CHUNK_LOADERS``) serves it when it applies; any other
    format goes through its loader, ``chunk_requests`` (default ``CHUNK_REQUESTS``) requests
    per chunk, built as
    :func:`load_trace` builds a whole trace. Raises :class:`NotStreamable` (the caller then
    loads the file whole, which names the problem or sorts) on anything the whole load
    would refuse, and when the loader asks for sorting and arrivals decrease.

    Hash ids are checked against every id before them (:mod:`~prefixlab.workload.idcheck`):
    with ``id_conflicts="error"`` an id under another parent raises ``NotStreamable`` (the
    whole load names it); with ``"warn"`` a warning with their count follows the last chunk;
    ``"ignore"`` does not look (memory stays flat)."""
    if not Path(path).exists():
        return None
    mode = id_conflict_mode(id_conflicts)
    opts = LoadOptions(limit, sample, sample_seed, start_s, end_s)
    opts.validate()
    reader = CHUNK_LOADERS.get(fmt)
    chunks: Iterator[tuple[Trace, int]] | None = None
    if reader is not None and not kwargs and Path(path).is_file() and sample is None:
        from prefixlab._jit import COMPILED

        if COMPILED:
            chunks = reader(Path(path), opts)
    if chunks is None:
        chunks = _chunked(path, fmt, opts, kwargs, chunk_requests or CHUNK_REQUESTS)
    return chunks if mode == "ignore" else _id_checked(chunks, str(path), mode)


def _id_checked(
    chunks: Iterator[tuple[Trace, int]], path: str, mode: IdConflictMode
) -> Iterator[tuple[Trace, int]]:
    check = ParentCheck()
    for chunk, nbytes in chunks:
        if chunk.hash_ids is not None:
            check.add(*trace_keys(chunk))
            if mode == "error" and check.conflicts is not None:
                raise NotStreamable("a hash id under another parent")
        yield chunk, nbytes
    settle(check, path, mode)


def _chunked(
    path: str | Path, fmt: str, opts: LoadOptions, kwargs: dict[str, object], size: int
) -> Iterator[tuple[Trace, int]]:
    builder: TraceBuilder | None = None
    header = Header()
    last = -math.inf
    try:
        for item in _open(path, fmt, opts, kwargs):
            if isinstance(item, Header):
                header = item
                continue
            if header.sort_by_arrival:  # a whole load sorts; a stream cannot
                if item.arrival_s < last:
                    raise NotStreamable("arrivals out of order")
                last = item.arrival_s
            if builder is None:
                builder = TraceBuilder(block_tokens=header.block_tokens, name=Path(path).stem)
            builder.append(item)
            if len(builder) == size:
                yield builder.build(), 0
                builder = None
        if builder is not None:
            yield builder.build(), 0
    except PrefixlabError as exc:  # the whole load names it, with its file and line
        raise NotStreamable(str(exc)) from None


def register_loader(name: str) -> Callable[[Loader], Loader]:
    """Register a loader under a format name (``--format NAME``)."""

    def deco(fn: Loader) -> Loader:
        LOADERS[name] = fn
        return fn

    return deco


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """Which requests of a file to keep; every loader honours them, streaming.

    * ``start_s``/``end_s``: keep arrivals in ``[start_s, end_s)`` (seconds, the trace's own
      clock as loaded);
    * ``sample``: keep this fraction of sessions (whole sessions, so prefix reuse inside a
      session survives; requests without a session are sampled one by one), chosen by a
      hash of the session id and ``sample_seed``: reproducible, and independent of order;
    * ``limit``: stop after this many kept requests.
    """

    limit: int | None = None
    sample: float | None = None
    sample_seed: int = 0
    start_s: float | None = None
    end_s: float | None = None

    def validate(self) -> None:
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit <= 0):
            raise ConfigError(f"limit must be positive, got {self.limit}")
        if self.sample is not None and not 0.0 < self.sample <= 1.0:
            raise ConfigError(f"sample must be a fraction in (0, 1], got {self.sample}")
        for name in ("start_s", "end_s", "sample"):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            ):
                raise ConfigError(f"{name} must be a finite number, got {v!r}")
        if isinstance(self.sample_seed, bool) or not isinstance(self.sample_seed, int):
            raise ConfigError(f"sample_seed must be an integer, got {self.sample_seed!r}")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ConfigError(
                f"the time window is empty: end_s={self.end_s} <= start_s={self.start_s}"
            )

    @property
    def filters(self) -> bool:
        return self.sample is not None or self.start_s is not None or self.end_s is not None

    def keep(self, index: int, r: Request) -> bool:
        """Whether request number ``index`` of the file (0-based) is kept."""
        if self.start_s is not None and r.arrival_s < self.start_s:
            return False
        if self.end_s is not None and r.arrival_s >= self.end_s:
            return False
        if self.sample is None or self.sample >= 1.0:
            return True
        key = r.session_id if r.session_id is not None else f"#request{index}"
        return _unit_hash(key, self.sample_seed) < self.sample


def _unit_hash(key: str, seed: int) -> float:
    """A uniform number in [0, 1) from a string and a seed, stable across runs and hosts."""
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def iter_requests(
    path: str | Path, fmt: str = "native", options: LoadOptions | None = None, **kwargs: object
) -> Iterator[Request]:
    """Stream the kept requests of a file without building a trace (constant memory)."""
    opts = options or LoadOptions()
    for item in _open(path, fmt, opts, kwargs):
        if isinstance(item, Request):
            yield item


def loader_options(fmt: str) -> list[str]:
    """The keyword options a format's loader takes (besides the path)."""
    params = list(inspect.signature(LOADERS[fmt]).parameters)
    return params[1:]


def _open(
    path: str | Path, fmt: str, opts: LoadOptions, kwargs: dict[str, object]
) -> Iterator[Request | Header]:
    opts.validate()
    if fmt == "native" and str(path).endswith(".parquet"):
        fmt = "parquet"
    if fmt not in LOADERS:
        raise ConfigError(f"unknown trace format '{fmt}'; known: {', '.join(sorted(LOADERS))}")
    if not Path(path).exists():
        raise ConfigError(f"trace file not found: {path}")
    accepted = loader_options(fmt)
    for key in kwargs:
        if key not in accepted:
            takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
            raise ConfigError(f"option {key!r} does not apply to the {fmt} format; {takes}")
    kept = 0
    index = -1
    try:
        for item in LOADERS[fmt](Path(path), **kwargs):
            if isinstance(item, Header):
                yield item
                continue
            index += 1
            if opts.keep(index, item):
                yield item
                kept += 1
                if opts.limit is not None and kept >= opts.limit:
                    return
    except OSError as exc:  # the trace itself cannot be read: one line, not a traceback
        if exc.filename is None or Path(exc.filename) != Path(path):
            raise
        why = (
            f"a folder, not a file (the {fmt} format reads one file)"
            if Path(path).is_dir()
            else f"cannot read it ({exc.strerror or exc})"
        )
        raise TraceFormatError(str(path), None, None, why) from None


def load_trace(
    path: str | Path,
    fmt: str = "native",
    *,
    limit: int | None = None,
    sample: float | None = None,
    sample_seed: int = 0,
    start_s: float | None = None,
    end_s: float | None = None,
    id_conflicts: str = "error",
    **kwargs: object,
) -> Trace:
    """Load a trace file with the loader registered as ``fmt``, keeping what the options say.

    The file is streamed into compact columns; it never has to fit in memory as text.
    Extra keyword arguments go to the loader (e.g. ``tokenizer=`` for text formats).
    A hash-form trace whose ids change parents between requests is refused
    (``id_conflicts="error"``), loaded with an :class:`IdConflictWarning` (``"warn"``), or
    not checked (``"ignore"``).
    """
    mode = id_conflict_mode(id_conflicts)
    trace = _load(path, fmt, LoadOptions(limit, sample, sample_seed, start_s, end_s), kwargs)
    if trace.hash_ids is not None and mode != "ignore":
        check = ParentCheck()
        check.add(*trace_keys(trace))
        settle(check, str(path), mode)
    return trace


def _load(path: str | Path, fmt: str, opts: LoadOptions, kwargs: dict[str, object]) -> Trace:
    fast = FAST_LOADERS.get(fmt)
    if fast is not None and not kwargs and Path(path).is_file():
        opts.validate()
        trace = fast(Path(path), opts)
        if trace is not None:
            return trace
    builder = TraceBuilder(name=Path(path).stem)
    for item in _open(path, fmt, opts, kwargs):
        if isinstance(item, Header):
            builder.block_tokens = item.block_tokens
            builder.sort_by_arrival = item.sort_by_arrival
        else:
            try:
                builder.append(item)
            except ConfigError as exc:
                where = f"kept request {len(builder)}"
                raise TraceFormatError(str(path), None, None, f"{where}: {exc}") from None
    if not len(builder):
        why = "no requests in the selected window or sample" if opts.filters else "no requests"
        raise TraceFormatError(str(path), None, None, why)
    try:
        return builder.build()
    except ConfigError as exc:
        # Checks across columns (lengths against content): name the file, and the request.
        raise TraceFormatError(str(path), None, None, str(exc)) from None


#: called with (bytes read, bytes in the file) while a file loads; see :func:`load_progress`
_REPORT: ContextVar[Callable[[int, int], None] | None] = ContextVar("load_report", default=None)


@contextmanager
def load_progress(report: Callable[[int, int], None] | None) -> Iterator[None]:
    """Within the block, loaders that read a file front to back call ``report(bytes read,
    file size)`` as they go (a progress bar's feed); None: no reports."""
    token = _REPORT.set(report)
    try:
        yield
    finally:
        _REPORT.reset(token)


def report_progress(done: int, total: int) -> None:
    """Tell the current :func:`load_progress` reporter, if any, how far a read is."""
    report = _REPORT.get()
    if report is not None:
        report(done, total)


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, JSON]]]:
    """Yield ``(line_number, object)`` for each non-blank line; bad JSON names the line.
    Reports its progress every 4,096 lines (:func:`load_progress`)."""
    report = _REPORT.get()
    size = path.stat().st_size if report is not None else 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if report is not None and lineno % 4096 == 0:
                report(fh.tell(), size)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(
                    str(path), lineno, None, f"not UTF-8 text (byte {exc.start + 1} of the line)"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(str(path), lineno, None, f"bad JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(str(path), lineno, None, "expected a JSON object")
            yield lineno, obj


_INT_ONLY = {int}


class FieldReader:
    """Reads typed fields of one JSON object, raising errors that name file, line and field."""

    __slots__ = ("lineno", "obj", "path")

    def __init__(self, path: Path, lineno: int, obj: dict[str, JSON]) -> None:
        self.path = path
        self.lineno = lineno
        self.obj = obj

    def fail(self, field: str, message: str) -> TraceFormatError:
        return TraceFormatError(str(self.path), self.lineno, field, message)

    def _get(self, field: str, required: bool) -> JSON:
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
        if not math.isfinite(v) or v < 0:
            raise self.fail(field, f"must be a finite number >= 0, got {v}")
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
        ints = cast("list[int]", v)  # checked next: the fast path's test, or item by item
        # Fast path: exact ints (not bools) within range, checked with C-level builtins.
        if not ints or (set(map(type, ints)) == _INT_ONLY and min(ints) >= 0 and max(ints) < limit):
            return ints
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < limit:
                raise self.fail(field, f"expected integers in [0, {limit}), found {x!r}")
        return ints


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
