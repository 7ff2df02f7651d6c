"""Shared test fixtures: the shared real data (skipped with a reason when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOONCAKE = SHARED_DATA / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="session")
def mooncake_path() -> Path:
    if not MOONCAKE.is_file():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE}")
    return MOONCAKE
