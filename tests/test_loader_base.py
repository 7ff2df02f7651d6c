"""Bad input through any loader (workload/loaders/base.py): non-UTF-8 files, infinite
numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import TraceFormatError
from prefixlab.workload import load_trace

runner = CliRunner()


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    """The rows as a JSON-lines file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- bad input, any format
@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        ("native", "t.jsonl"),
        ("mooncake", "m.jsonl"),
        ("sharegpt", "c.json"),
        ("swe-agent", "x.traj"),
        ("azure", "a.csv"),
    ],
)
def test_non_utf8_file_is_a_clear_error(tmp_path: Path, fmt: str, name: str) -> None:
    p = tmp_path / name
    p.write_bytes(b'\xff\xfe{"a": 1}\n')
    res = runner.invoke(app, ["trace", "stats", str(p), "-f", fmt, "--block-tokens", "16"])
    assert res.exit_code == 2, res.output
    assert str(p) in res.stderr and "not UTF-8" in res.stderr
    assert "Traceback" not in res.output


def test_infinite_numbers_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 1e400, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:1: field 'timestamp': must be a finite"):
        load_trace(p, "mooncake")
    n = _write(tmp_path / "n.jsonl", [{"input_tokens": [1], "output_length": 0}])
    n.write_text(n.read_text().replace("}", ', "think_s": 1e400}'))
    with pytest.raises(TraceFormatError, match="'think_s': must be a finite"):
        load_trace(n)
