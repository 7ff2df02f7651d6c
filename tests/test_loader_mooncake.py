"""The Mooncake loader (workload/loaders/mooncake.py): the shared trace, bad lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.errors import TraceFormatError
from prefixlab.workload import load_trace

runner = CliRunner()


# ---------------------------------------------------------------- Mooncake
def test_mooncake_shared_trace(mooncake_path: Path) -> None:
    tr = load_trace(mooncake_path, "mooncake")
    assert len(tr) == 12031
    assert tr.block_tokens == 512 and tr.is_hash_form
    assert int(tr.input_length.sum()) == 144_793_823
    first = json.loads(mooncake_path.open().readline())
    assert tr[0].hash_ids == first["hash_ids"]
    assert tr.arrival_s[0] == first["timestamp"] / 1000.0
    assert np.all(np.diff(tr.arrival_s) >= 0)
    assert len(load_trace(mooncake_path, "mooncake", limit=10)) == 10


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}', "output_length"),
        (
            '{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []}',
            "input_length",
        ),
        (
            '{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [1]}',
            "timestamp",
        ),
    ],
)
def test_mooncake_bad_lines(tmp_path: Path, line: str, field: str) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [5]}\n' + line
    )
    with pytest.raises(TraceFormatError) as info:
        load_trace(p, "mooncake")
    assert info.value.line == 2 and info.value.field == field
