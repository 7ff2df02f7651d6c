"""Azure LLM inference trace loader (AzurePublicDataset, 2023 CSVs).

Columns: ``TIMESTAMP`` (``YYYY-MM-DD HH:MM:SS.fffffff``), ``ContextTokens``,
``GeneratedTokens``. The trace has arrivals and lengths but no content, so every block gets
an id of its own: nothing is shared, and a replay hits nothing. Use it for arrival and
length distributions, or combine it with a content generator. Arrivals are seconds from the
first row.
"""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from prefixlab.errors import TraceFormatError
from prefixlab.workload.loaders.base import register_loader
from prefixlab.workload.trace import Trace

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _seconds(text: str) -> float:
    """Parse a timestamp with up to 9 fractional digits (datetime takes at most 6)."""
    whole, _, frac = text.strip().partition(".")
    # The timestamps carry no zone: read them as UTC so arrivals do not depend on the host.
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    if frac and not frac.isdigit():
        raise ValueError(text)
    return base + (float(f"0.{frac}") if frac else 0.0)


def _count(path: Path, lineno: int, field: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(
            str(path), lineno, field, f"expected an integer, got {text!r}"
        ) from None
    if value < 0:
        raise TraceFormatError(str(path), lineno, field, f"must be >= 0, got {value}")
    return value


@register_loader("azure")
def load_azure(path: Path, limit: int | None = None, block_tokens: int = 16) -> Trace:
    """Read an Azure LLM inference CSV (hash form with unshared ids)."""
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != COLUMNS:
            raise TraceFormatError(str(path), 1, None, f"expected the header {','.join(COLUMNS)}")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise TraceFormatError(str(path), lineno, COLUMNS[len(row)], "missing")
            try:
                times.append(_seconds(row[0]))
            except ValueError:
                raise TraceFormatError(
                    str(path), lineno, "TIMESTAMP", f"bad time {row[0]!r}"
                ) from None
            inputs.append(_count(path, lineno, "ContextTokens", row[1]))
            outputs.append(_count(path, lineno, "GeneratedTokens", row[2]))
            if limit is not None and len(times) >= limit:
                break
    if not times:
        raise TraceFormatError(str(path), 1, None, "no requests in file")
    arrival = np.array(times) - times[0]
    input_length = np.array(inputs, dtype=np.int64)
    counts = -(-input_length // block_tokens)
    offsets = np.zeros(len(inputs) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.arange(int(offsets[-1]), dtype=np.uint64)  # one id per block: nothing shared
    n = len(inputs)
    return Trace(
        arrival_s=arrival,
        input_length=input_length,
        output_length=np.array(outputs, dtype=np.int64),
        session_id=[None] * n,
        turn=np.zeros(n, dtype=np.int64),
        task=[None] * n,
        hash_ids=(ids, offsets),
        hashed_tokens=input_length.copy(),
        block_tokens=block_tokens,
        name=path.stem,
    )
