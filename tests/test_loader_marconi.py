"""The Marconi trace loader (workload/loaders/marconi.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.errors import TraceFormatError
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import load_trace, write_native

runner = CliRunner()


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    """The rows as a JSON-lines file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- Marconi
def test_marconi_loader(tmp_path: Path) -> None:
    rows = [
        {
            "session_id": "a",
            "turn_id": 0,
            "ts": 0.0,
            "num_input_tokens": 5,
            "num_output_tokens": 2,
            "input_tokens": [1, 2, 3, 4, 5],
            "output_tokens": [6, 7],
        },
        {
            "session_id": "a",
            "turn_id": 1,
            "ts": 3.5,
            "num_input_tokens": 9,
            "num_output_tokens": 1,
            "input_tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9],
            "output_tokens": [0],
        },
    ]
    tr = load_trace(_write(tmp_path / "m.jsonl", rows), "marconi")
    assert tr[1].input_tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9] and tr[1].turn == 1
    assert tr.arrival_s.tolist() == [0.0, 3.5] and tr.session_id == ["a", "a"]
    # 2-token blocks: turn 0 leaves (5+2)//2 = 3 keyed blocks = tokens 1..6; turn 1 may hit
    # min(9//2, (9-1)//2) = 4 lookup blocks, of which the first 3 are cached.
    res = replay(tr, "lru", ReplayConfig(capacity_blocks=50, block_tokens=2))
    assert res.hit_tokens.tolist() == [0, 6]
    bad = [{**rows[0], "num_input_tokens": 4}]
    with pytest.raises(TraceFormatError, match="num_input_tokens"):
        load_trace(_write(tmp_path / "bad.jsonl", bad), "marconi")
    with pytest.raises(TraceFormatError, match="output_tokens"):
        load_trace(_write(tmp_path / "bad2.jsonl", [{"input_tokens": [1]}]), "marconi")


def test_out_of_order_marconi_is_sorted_and_converts(tmp_path: Path) -> None:
    rows = [
        {"session_id": "a", "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2], "output_tokens": [3]},
        {
            "session_id": "a",
            "turn_id": 1,
            "ts": 10.0,
            "input_tokens": [1, 2, 3, 4],
            "output_tokens": [5],
        },
        {"session_id": "b", "turn_id": 0, "ts": 2.0, "input_tokens": [9], "output_tokens": [8]},
    ]
    tr = load_trace(_write(tmp_path / "m.jsonl", rows), "marconi")
    assert tr.arrival_s.tolist() == [0.0, 2.0, 10.0]
    assert tr.session_id == ["a", "b", "a"]
    out = tmp_path / "native.jsonl"
    write_native(tr, out)
    assert load_trace(out).arrival_s.tolist() == [0.0, 2.0, 10.0]  # the native order check holds
