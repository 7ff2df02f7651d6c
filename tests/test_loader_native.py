"""The native JSONL loader (workload/loaders/native.py): round trips, and bad lines named
by file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload import load_trace, write_native
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.trace import to_hash_form

runner = CliRunner()


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    """The rows as a JSON-lines file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- native JSONL
def test_native_roundtrip_token_and_hash(tmp_path: Path) -> None:
    tr = generate_sessions(num_sessions=4, seed=2)
    p = tmp_path / "t.jsonl"
    write_native(tr, p)
    back = load_trace(p)
    assert len(back) == len(tr)
    assert back[3] == tr[3]
    hf = to_hash_form(tr, 16)
    write_native(hf, p)
    back = load_trace(p)
    assert back.block_tokens == 16 and back.is_hash_form
    assert back.block_layout().raw_keys.tolist() == hf.block_layout().raw_keys.tolist()
    assert not list(tmp_path.glob(".*tmp")), "temporary file left behind"


BAD_LINES = [
    ("{not json", None, "bad JSON"),
    ('{"input_length": 5, "output_length": 1}', "input_tokens", "exactly one"),
    ('{"input_tokens": [1,2], "output_length": -3}', "output_length", ">= 0"),
    ('{"input_tokens": [1,2], "output_length": "x"}', "output_length", "integer"),
    ('{"input_tokens": [1,-2], "output_length": 1}', "input_tokens", "integers in [0, "),
    ('{"input_tokens": [1,2], "input_length": 3, "output_length": 1}', "input_length", "3"),
    ('{"hash_ids": [1], "input_length": 40, "output_length": 0}', "hash_ids", "claim 2"),
    ('{"hash_ids": [1], "output_length": 0}', "input_length", "missing"),
    ('{"input_tokens": [1], "output_length": 0, "arrival_s": -1}', "arrival_s", ">= 0"),
]


@pytest.mark.parametrize(("line", "field", "words"), BAD_LINES)
def test_native_bad_line_names_file_line_field(
    tmp_path: Path, line: str, field: str | None, words: str
) -> None:
    p = tmp_path / "bad.jsonl"
    good = json.dumps({"input_tokens": [1, 2, 3], "output_length": 2})
    p.write_text('{"prefixlab_trace": 1, "block_tokens": 16}\n' + good + "\n" + line + "\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(p)
    err = info.value
    assert err.path == str(p) and err.line == 3 and err.field == field
    assert f"{p}:3" in str(err) and words in str(err)


def test_native_header_must_come_first(tmp_path: Path) -> None:
    p = tmp_path / "h.jsonl"
    p.write_text('{"input_tokens": [1], "output_length": 0}\n{"prefixlab_trace": 1}\n')
    with pytest.raises(TraceFormatError, match="first line"):
        load_trace(p)


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown trace format"):
        load_trace(tmp_path / "x", "nope")
    with pytest.raises(ConfigError, match="not found"):
        load_trace(tmp_path / "missing.jsonl")


def test_native_loader_refuses_repeated_and_huge_ids(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"prefixlab_trace": 1, "block_tokens": 16}\n'
        '{"hash_ids": [7, 7, 8], "input_length": 48, "output_length": 0}\n'
    )
    with pytest.raises(Exception, match="id 7 appears twice"):
        load_trace(p)
    p.write_text(f'{{"input_tokens": [1, {1 << 63}], "output_length": 0}}\n')
    with pytest.raises(Exception, match="input_tokens"):
        load_trace(p)


def test_native_requests_must_be_in_arrival_order(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"arrival_s": 5, "input_tokens": [1], "output_length": 0}\n'
        '{"arrival_s": 2, "input_tokens": [1], "output_length": 0}\n'
    )
    with pytest.raises(Exception, match="arrival order") as info:
        load_trace(p)
    assert f"{p}:2" in str(info.value)


def test_native_unknown_field_is_named(tmp_path: Path) -> None:
    p = _write(
        tmp_path / "t.jsonl", [{"input_tokens": [1, 2], "output_length": 1, "sesion_id": "s"}]
    )
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: field 'sesion_id': unknown field"):
        load_trace(p)
