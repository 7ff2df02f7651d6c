"""Run a reference driver in the reference's own Python and read its JSON lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def json_lines(python: str, driver: str, *args: str, timeout_s: float = 3600) -> list[Any]:
    """``python tests/reference/<driver> args...``; its stdout lines that hold JSON."""
    out = subprocess.run(
        [python, str(HERE / driver), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
