"""Columnar fast path for hash-form JSON Lines (Mooncake): parse with pyarrow, check with numpy.

The line-by-line loaders decode one JSON object at a time in Python (about 15 us per
request). Hash-form traces of millions of requests are all numbers, which pyarrow's JSON
reader parses in C++ on every core into typed columns. This path then applies, vectorised,
every check the line-by-line loader makes (types, nulls, ranges, distinct ids within a
request, enough ids for the input's full blocks) and the load options (time window,
limit). It is only a fast path: on anything it does not accept (a parse error, a null, a
value out of range, a sample option) it returns None and the caller runs the line-by-line
loader, which names the file, line and field of the first problem. Both build the same
:class:`~prefixlab.workload.trace.Trace`, array for array (tested).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from prefixlab._jit import COMPILED, jit
from prefixlab.types import F64, I64, U64
from prefixlab.workload.loaders.base import LoadOptions, NotStreamable, report_progress
from prefixlab.workload.trace import Trace

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.json as pj
#: a whole-file read parses this many bytes at a time (a longer line is read line by line)
BLOCK_BYTES = 16 << 20
#: a streamed read parses this many bytes at a time (pyarrow reads ahead a few)
CHUNK_BYTES = 1 << 20


@jit(nogil=True)
def first_repeat_row(values: U64, offsets: I64) -> int:
    """The first row of a ragged uint64 array that holds a value twice, or -1 (rows are
    short: pairs compared in place up to 32 values, a sort beyond)."""
    for r in range(offsets.shape[0] - 1):
        a, b = offsets[r], offsets[r + 1]
        if b - a <= 32:
            for i in range(a + 1, b):
                v = values[i]
                for j in range(a, i):
                    if values[j] == v:
                        return r
            continue
        row = np.sort(values[a:b])
        for i in range(1, row.shape[0]):
            if row[i] == row[i - 1]:
                return r
    return -1


def rows_have_repeats(values: U64, offsets: I64) -> bool:
    """Whether any row of a ragged uint64 array holds a value twice."""
    return bool(first_repeat_row(values, offsets) >= 0)


def _schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("timestamp", pa.float64()),
            ("input_length", pa.int64()),
            ("output_length", pa.int64()),
            ("hash_ids", pa.list_(pa.uint64())),
        ]
    )


def _parse_options() -> pj.ParseOptions:
    import pyarrow.json as pj

    return pj.ParseOptions(explicit_schema=_schema(), unexpected_field_behavior="ignore")


def _to_trace(
    table: pa.Table, block_tokens: int, opts: LoadOptions, name: str, limit: int | None
) -> Trace | None:
    """The requests of one parsed table (a whole file, or a chunk of one) that ``opts``
    keeps, in file order, at most ``limit`` of them; None when any row fails a check of the
    line-by-line loader, or none is kept. Raises NotStreamable on a null or bad value."""
    if table.num_rows == 0:
        return None
    values, offsets, arrival, inp, out = _checked_columns(table, block_tokens)
    keep = np.ones(arrival.shape[0], dtype=bool)
    if opts.start_s is not None:
        keep &= arrival >= opts.start_s
    if opts.end_s is not None:
        keep &= arrival < opts.end_s
    rows = np.flatnonzero(keep)
    if limit is not None:
        rows = rows[:limit]
    if rows.shape[0] == 0:
        return None
    if rows.shape[0] != arrival.shape[0]:
        values, offsets = _take_rows(values, offsets, rows)
        arrival, inp, out = arrival[rows], inp[rows], out[rows]
    n = int(arrival.shape[0])
    return Trace(
        arrival_s=np.ascontiguousarray(arrival, dtype=np.float64),
        input_length=np.ascontiguousarray(inp),
        output_length=np.ascontiguousarray(out),
        session_id=[None] * n,
        turn=np.zeros(n, dtype=np.int64),
        task=[None] * n,
        hash_ids=(np.ascontiguousarray(values), offsets),
        hashed_tokens=np.ascontiguousarray(inp).copy(),
        block_tokens=block_tokens,
        name=name,
    )


def _checked_columns(table: pa.Table, block_tokens: int) -> tuple[U64, I64, F64, I64, I64]:
    """A table's hash ids (values and row offsets from 0), arrival times in seconds, input
    and output lengths, after every check of the line-by-line loader (NotStreamable on a
    null or a value out of range)."""
    if any(table.column(c).null_count for c in _schema().names):
        raise NotStreamable("a null field")
    col = table.column("hash_ids")
    ids_col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if ids_col.values.null_count:
        raise NotStreamable("a null hash id")
    offsets = np.asarray(ids_col.offsets, dtype=np.int64)
    values: U64 = np.asarray(ids_col.values, dtype=np.uint64)
    if offsets[0] != 0 or values.shape[0] != offsets[-1]:  # a sliced array: rebase
        values = values[offsets[0] : offsets[-1]]
        offsets = offsets - offsets[0]
    ts = table.column("timestamp").to_numpy()
    inp: I64 = table.column("input_length").to_numpy().astype(np.int64, copy=False)
    out: I64 = table.column("output_length").to_numpy().astype(np.int64, copy=False)
    counts = np.diff(offsets)
    if (
        not np.isfinite(ts).all()
        or (ts < 0).any()
        or (inp < 0).any()
        or (out < 0).any()
        or (counts < inp // block_tokens).any()
        or rows_have_repeats(values, offsets)
    ):
        raise NotStreamable("a value out of range")
    arrival: F64 = ts / 1000.0
    return values, offsets, arrival, inp, out


def _take_rows(values: U64, offsets: I64, rows: I64) -> tuple[U64, I64]:
    """Rows ``rows`` (ascending) of a ragged array: their values and new offsets."""
    starts, ends = offsets[rows], offsets[rows + 1]
    lens = ends - starts
    new_offs = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=new_offs[1:])
    take = np.repeat(starts - new_offs[:-1], lens) + np.arange(int(new_offs[-1]))
    return values[take], new_offs


def read_mooncake(path: Path, block_tokens: int, opts: LoadOptions) -> Trace | None:
    """The trace a Mooncake file holds under ``opts``, or None (use the line-by-line path)."""
    if not COMPILED or opts.sample is not None:
        return None
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        return None
    try:
        size = path.stat().st_size
        with pa.OSFile(str(path)) as src:
            reader = pj.open_json(
                src,
                read_options=pj.ReadOptions(block_size=BLOCK_BYTES),
                parse_options=_parse_options(),
            )
            batches = []
            for batch in reader:  # as fast as read_json, and it can say how far it is
                batches.append(batch)
                report_progress(src.tell(), size)
        table = pa.Table.from_batches(batches, schema=_schema())
        del batches
        trace = _to_trace(table, block_tokens, opts, path.stem, opts.limit)
    except (pa.ArrowException, OSError, ValueError, NotStreamable):
        return None
    return None if trace is None else trace.sorted_by_arrival()


def iter_mooncake_chunks(
    path: Path, block_tokens: int, opts: LoadOptions, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[Trace, int]]:
    """The requests a Mooncake file holds under ``opts``, in chunks of consecutive kept
    requests, each with the bytes of the file read so far; pyarrow parses about
    ``chunk_bytes`` of JSON at a time, so memory does not grow with the file.

    Raises :class:`NotStreamable` (then the caller loads the file whole, whose line-by-line
    loader names the first bad line, or sorts it) on anything :func:`read_mooncake` would not
    accept, and when arrivals decrease: a streamed replay cannot sort. Yields nothing if no
    request is kept."""
    if not COMPILED or opts.sample is not None:
        raise NotStreamable("sampling, or numba off")
    import pyarrow as pa
    import pyarrow.json as pj

    if not hasattr(pj, "open_json"):  # pragma: no cover - pyarrow < 19
        raise NotStreamable("this pyarrow has no streaming JSON reader")
    left = opts.limit
    last = -np.inf
    try:
        with pa.OSFile(str(path)) as src:
            reader = pj.open_json(
                src,
                read_options=pj.ReadOptions(block_size=chunk_bytes),
                parse_options=_parse_options(),
            )
            while left is None or left > 0:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                chunk = _to_trace(batch, block_tokens, opts, path.stem, left)
                if chunk is None:
                    continue
                arr = chunk.arrival_s
                if arr[0] < last or (arr.shape[0] > 1 and (np.diff(arr) < 0).any()):
                    raise NotStreamable("arrivals out of order")
                last = float(arr[-1])
                if left is not None:
                    left -= len(chunk)
                yield chunk, src.tell()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise NotStreamable(str(exc)) from None
