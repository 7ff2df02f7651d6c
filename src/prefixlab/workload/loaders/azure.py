"""Azure LLM inference trace loader (AzurePublicDataset, 2023 CSVs).

Columns: ``TIMESTAMP`` (``YYYY-MM-DD HH:MM:SS.fffffff``), ``ContextTokens``,
``GeneratedTokens``. The trace has arrivals and lengths but no content, so every block gets
an id of its own: nothing is shared, and a replay hits nothing. Use it for arrival and
length distributions, or combine it with a content generator. Arrivals are seconds from the
first row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload.loaders.base import Header, register_loader
from prefixlab.workload.trace import Request

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _seconds(text: str) -> float:
    """Parse a timestamp with up to 9 fractional digits (datetime takes at most 6)."""
    whole, _, frac = text.strip().partition(".")
    # The timestamps carry no zone: read them as UTC so arrivals do not depend on the host.
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    if frac and not frac.isdigit():
        raise ValueError(text)
    return base + (float(f"0.{frac}") if frac else 0.0)


def _utf8(path: Path, lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            str(path), lineno, None, f"not UTF-8 text (byte {exc.start + 1} of the line)"
        ) from None


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
def load_azure(path: Path, block_tokens: int = 16) -> Iterator[Request | Header]:
    """Read an Azure LLM inference CSV (hash form with unshared ids)."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens <= 0:
        raise ConfigError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    yield Header(block_tokens)
    first: float | None = None
    next_id = 0
    with path.open("rb") as raw:
        lines = (_utf8(path, i, b) for i, b in enumerate(raw, start=1))
        reader = csv.reader(lines)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != COLUMNS:
            raise TraceFormatError(str(path), 1, None, f"expected the header {','.join(COLUMNS)}")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < 3:
                raise TraceFormatError(str(path), lineno, COLUMNS[len(row)], "missing")
            try:
                t = _seconds(row[0])
            except ValueError:
                raise TraceFormatError(
                    str(path), lineno, "TIMESTAMP", f"bad time {row[0]!r}"
                ) from None
            first = t if first is None else first
            if t < first:
                raise TraceFormatError(
                    str(path),
                    lineno,
                    "TIMESTAMP",
                    f"{row[0].strip()} precedes the first row: arrivals are seconds from it",
                )
            inp = _count(path, lineno, "ContextTokens", row[1])
            blocks = -(-inp // block_tokens)
            yield Request(
                arrival_s=t - first,
                input_length=inp,
                output_length=_count(path, lineno, "GeneratedTokens", row[2]),
                # one id per block: nothing is shared
                hash_ids=np.arange(next_id, next_id + blocks, dtype=np.uint64),
                hashed_tokens=inp,
            )
            next_id += blocks
