"""The Azure LLM inference trace loader (workload/loaders/azure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.errors import TraceFormatError
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import load_trace

runner = CliRunner()


# ---------------------------------------------------------------- Azure
def test_azure_shared_csv(tmp_path: Path) -> None:
    from tests.conftest import SHARED_DATA

    path = SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    if not path.is_file():
        pytest.skip(f"shared Azure trace not found at {path}")
    tr = load_trace(path, "azure")
    # 19,366 rows (the last one has no trailing newline).
    assert len(tr) == 19366 and tr.is_hash_form and tr.block_tokens == 16
    # First rows: 18:15:46.6805900 (374, 44), then 18:15:50.9951690 (396, 109).
    assert tr.input_length[:2].tolist() == [374, 396]
    assert tr.output_length[:2].tolist() == [44, 109]
    assert tr.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    assert (tr.arrival_s >= 0).all() and tr.arrival_s[0] == 0.0
    # No content: every block has an id of its own, so nothing can hit.
    res = replay(tr, "lru", ReplayConfig(capacity_blocks=10**6), fast=False)
    assert res.metrics["num_hit_tokens"] == 0


def test_azure_bad_rows(tmp_path: Path) -> None:
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\n"
    cases = [
        ("2023-11-16 18:15:47.1,-4,2\n", "ContextTokens"),
        ("2023-11-16 18:15:47.1,4,x\n", "GeneratedTokens"),
        ("yesterday,4,2\n", "TIMESTAMP"),
        ("2023-11-16 18:15:47.1,4\n", "GeneratedTokens"),
    ]
    for row, field in cases:
        p = tmp_path / "a.csv"
        p.write_text(head + row)
        with pytest.raises(TraceFormatError) as info:
            load_trace(p, "azure")
        assert info.value.line == 3 and info.value.field == field
    p.write_text("time,in,out\n")
    with pytest.raises(TraceFormatError, match="header"):
        load_trace(p, "azure")


def test_azure_row_before_the_first_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:40.0000000,10,4\n"
    )
    with pytest.raises(TraceFormatError, match=r"a\.csv:3: field 'TIMESTAMP': .* precedes"):
        load_trace(p, "azure")
