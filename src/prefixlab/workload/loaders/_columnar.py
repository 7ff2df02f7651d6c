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

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixlab._jit import COMPILED, jit
from prefixlab.workload.trace import Trace

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
#: pyarrow reads this many bytes per block (per thread)
BLOCK_BYTES = 16 << 20


@jit()
def rows_have_repeats(values: Any, offsets: Any) -> bool:
    """Whether any row of a ragged uint64 array holds a value twice (rows are short: a
    sort per row)."""
    for r in range(offsets.shape[0] - 1):
        a, b = offsets[r], offsets[r + 1]
        if b - a < 2:
            continue
        row = np.sort(values[a:b])
        for i in range(1, row.shape[0]):
            if row[i] == row[i - 1]:
                return True
    return False


def read_mooncake(path: Path, block_tokens: int, opts: Any) -> Trace | None:
    """The trace a Mooncake file holds under ``opts``, or None (use the line-by-line path)."""
    if not COMPILED or opts.sample is not None:
        return None
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        return None
    schema = pa.schema(
        [
            ("timestamp", pa.float64()),
            ("input_length", pa.int64()),
            ("output_length", pa.int64()),
            ("hash_ids", pa.list_(pa.uint64())),
        ]
    )
    try:
        table = pj.read_json(
            path,
            read_options=pj.ReadOptions(block_size=BLOCK_BYTES),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowException, OSError, ValueError):
        return None
    if table.num_rows == 0 or any(table.column(c).null_count for c in schema.names):
        return None
    ids_col = table.column("hash_ids").combine_chunks()
    if ids_col.values.null_count:
        return None
    offsets = np.asarray(ids_col.offsets, dtype=np.int64)
    values: U64 = np.asarray(ids_col.values, dtype=np.uint64)
    if offsets[0] != 0:  # a sliced array: rebase
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
        return None
    arrival = ts / 1000.0
    keep = np.ones(arrival.shape[0], dtype=bool)
    if opts.start_s is not None:
        keep &= arrival >= opts.start_s
    if opts.end_s is not None:
        keep &= arrival < opts.end_s
    rows = np.flatnonzero(keep)
    if opts.limit is not None:
        rows = rows[: opts.limit]
    if rows.shape[0] == 0:
        return None
    if rows.shape[0] != arrival.shape[0]:
        starts, ends = offsets[rows], offsets[rows + 1]
        lens = ends - starts
        new_offs = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=new_offs[1:])
        take = np.repeat(starts - new_offs[:-1], lens) + np.arange(int(new_offs[-1]))
        values, offsets = values[take], new_offs
        arrival, inp, out = arrival[rows], inp[rows], out[rows]
    n = int(arrival.shape[0])
    trace = Trace(
        arrival_s=np.ascontiguousarray(arrival, dtype=np.float64),
        input_length=np.ascontiguousarray(inp),
        output_length=np.ascontiguousarray(out),
        session_id=[None] * n,
        turn=np.zeros(n, dtype=np.int64),
        task=[None] * n,
        hash_ids=(np.ascontiguousarray(values), offsets),
        hashed_tokens=np.ascontiguousarray(inp).copy(),
        block_tokens=block_tokens,
        name=path.stem,
    )
    return trace.sorted_by_arrival()
