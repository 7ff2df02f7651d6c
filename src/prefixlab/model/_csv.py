"""Reading the small measurement CSVs (timing tables, fits) with clear errors."""

from __future__ import annotations

import csv
from pathlib import Path

from prefixlab.errors import TraceFormatError


def read_csv(path: Path) -> csv.DictReader[str]:
    """A DictReader over the file's text; a file that is not UTF-8 names itself."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TraceFormatError(str(path), None, None, "not UTF-8 text") from None
    return csv.DictReader(text.splitlines())
