"""Shared test fixtures: the shared real data (skipped with a reason when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The command line's tables follow COLUMNS, which pytest-xdist's workers set to 80: unset
# before any fixture runs, every test sees the same piped width (140) wherever it runs
# (tests/test_cli_tables.py sets it where it means to).
os.environ.pop("COLUMNS", None)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOONCAKE = SHARED_DATA / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="session")
def mooncake_path() -> Path:
    if not MOONCAKE.is_file():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE}")
    return MOONCAKE
