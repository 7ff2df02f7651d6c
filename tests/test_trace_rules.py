"""One set of rules for a prefixlab trace request, whatever the file format.

The native JSONL loader and the Parquet loader read every request through
``workload.loaders.rules``: the same trace, written both ways, is accepted or refused by
both, with the same field and the same words; only the place differs (line or row).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from prefixlab.errors import TraceFormatError
from prefixlab.workload.loaders import load_trace, write_parquet

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

GOOD = {"arrival_s": 0.0, "input_tokens": [1, 2, 3], "output_length": 2}


def _write_both(tmp_path: Path, rows: list[dict[str, Any]], bt: int | None = None) -> list[Path]:
    """The rows as a native JSONL file and as a Parquet file (columns from the rows' keys,
    a key missing from a row is a null cell)."""
    header: dict[str, Any] = {"prefixlab_trace": 1}
    meta = {"prefixlab_trace": "1"}
    if bt is not None:
        header["block_tokens"] = bt
        meta["block_tokens"] = str(bt)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows]))
    names = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.Table.from_pylist([{k: r.get(k) for k in names} for r in rows])
    parquet = tmp_path / "t.parquet"
    pq.write_table(table.replace_schema_metadata(meta), parquet)
    return [jsonl, parquet]


BAD: list[tuple[str, list[dict[str, Any]], str, str]] = [
    # (case, rows, field, the rule's words); a string column is bad from its first row
    (
        "string output_length",
        [{**GOOD, "output_length": "12"}, {**GOOD, "output_length": "1"}],
        "output_length",
        "expected an integer, got '12'",
    ),
    ("null output_length", [GOOD, {**GOOD, "output_length": None}], "output_length", "missing"),
    (
        "negative length",
        [GOOD, {**GOOD, "output_length": -1}],
        "output_length",
        "must be >= 0, got -1",
    ),
    (
        "arrivals out of order",
        [{**GOOD, "arrival_s": 5.0}, {**GOOD, "arrival_s": 1.0}],
        "arrival_s",
        "1.0 is earlier than the previous request's 5.0: requests must be in arrival order",
    ),
    (
        "length disagrees with tokens",
        [GOOD, {**GOOD, "input_length": 4}],
        "input_length",
        "4 but input_tokens has 3",
    ),
    (
        "string arrival",
        [{**GOOD, "arrival_s": "soon"}, {**GOOD, "arrival_s": "1"}],
        "arrival_s",
        "expected a number, got 'soon'",
    ),
    (
        "negative token id",
        [GOOD, {**GOOD, "input_tokens": [1, -2]}],
        "input_tokens",
        "expected integers in [0, 9223372036854775808), found -2",
    ),
    (
        "infinite think time",
        [GOOD, {**GOOD, "think_s": float("inf")}],
        "think_s",
        "must be a finite number >= 0, got inf",
    ),
]


@pytest.mark.parametrize(("case", "rows", "field", "rule"), BAD, ids=[b[0] for b in BAD])
def test_both_formats_refuse_with_the_same_words(
    tmp_path: Path, case: str, rows: list[dict[str, Any]], field: str, rule: str
) -> None:
    jsonl, parquet = _write_both(tmp_path, rows)
    with pytest.raises(TraceFormatError) as line_err:
        load_trace(jsonl)
    with pytest.raises(TraceFormatError) as row_err:
        load_trace(parquet)
    for err in (line_err.value, row_err.value):
        assert (err.field, err.reason) == (field, rule), case
    bad = (
        next(i for i, r in enumerate(rows) if isinstance(r.get(field), str))
        if ("string" in case)
        else 1
    )
    assert line_err.value.line == bad + 2  # after the header line
    assert row_err.value.row == bad
    assert str(row_err.value) == f"{parquet}: row {bad}: field '{field}': {rule}"


def test_an_unknown_column_is_refused_like_an_unknown_field(tmp_path: Path) -> None:
    jsonl, parquet = _write_both(tmp_path, [{**GOOD, "sesion_id": "a"}])
    for path in (jsonl, parquet):
        with pytest.raises(TraceFormatError, match="unknown") as err:
            load_trace(path)
        assert err.value.field == "sesion_id"


def test_both_formats_accept_the_same_trace_alike(tmp_path: Path) -> None:
    rows = [
        {
            "arrival_s": 0.0,
            "input_tokens": [1, 2],
            "output_length": 1,
            "session_id": "a",
            "think_s": None,
        },
        {
            "arrival_s": 0.5,
            "input_tokens": [1, 2, 3],
            "output_tokens": [7],
            "turn": 1,
            "session_id": "a",
            "think_s": 0.25,
        },
    ]
    a, b = (load_trace(p) for p in _write_both(tmp_path, rows))
    assert a.input_tokens is not None and b.input_tokens is not None
    for x, y in zip(a.input_tokens, b.input_tokens, strict=True):
        assert x.tolist() == y.tolist()
    assert a.output_length.tolist() == b.output_length.tolist() == [1, 1]
    assert a.session_id == b.session_id == ["a", "a"]
    assert a.think_s.tolist()[1] == b.think_s.tolist()[1] == 0.25


def test_hash_form_needs_its_block_size(tmp_path: Path) -> None:
    rows = [{"arrival_s": 0.0, "hash_ids": [5, 6], "input_length": 40, "output_length": 1}]
    for path in _write_both(tmp_path, rows):
        with pytest.raises(TraceFormatError, match="block_tokens"):
            load_trace(path)
    for path in _write_both(tmp_path, rows, bt=16):
        tr = load_trace(path)
        assert tr.hash_ids is not None and tr.hash_ids[0].tolist() == [5, 6]
    rows[0]["hash_ids"] = [5]  # 40 tokens claim two full 16-token blocks
    for path in _write_both(tmp_path, rows, bt=16):
        with pytest.raises(TraceFormatError, match="1 ids but 40 hashed tokens") as err:
            load_trace(path)
        assert err.value.field == "hash_ids"


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parquet_errors_name_the_column(tmp_path: Path) -> None:
    p = _jsonl(tmp_path / "t.jsonl", [{"input_tokens": [1, 2], "output_length": 1}] * 3)
    good = tmp_path / "t.parquet"
    write_parquet(load_trace(p), good)
    table = pq.read_table(good)
    bad_len = table.set_column(
        table.schema.get_field_index("input_length"), "input_length", pa.array([2, -2, 2])
    )
    bad = tmp_path / "bad.parquet"
    pq.write_table(bad_len.replace_schema_metadata(table.schema.metadata), bad)
    with pytest.raises(
        TraceFormatError, match=r"bad\.parquet: row 1: field 'input_length': must be >= 0"
    ):
        load_trace(bad)
    # A row whose content disagrees with its length names the file, not a bare ConfigError.
    wrong = table.set_column(
        table.schema.get_field_index("input_length"), "input_length", pa.array([2, 5, 2])
    )
    pq.write_table(wrong.replace_schema_metadata(table.schema.metadata), bad)
    with pytest.raises(
        TraceFormatError,
        match=r"bad\.parquet: row 1: field 'input_length': 5 but input_tokens has 2",
    ):
        load_trace(bad)


@pytest.mark.parametrize(
    "err",
    [
        TraceFormatError("t.jsonl", 3, "input_length", "must be an integer"),
        TraceFormatError("t.parquet", None, "arrival_s", "must be sorted", row=7),
        TraceFormatError("t.jsonl", None, None, "bad JSON: Expecting value"),
    ],
)
def test_a_trace_error_pickles_whole(err: TraceFormatError) -> None:
    """A worker process (or Ray) hands the error back pickled: the same words and parts."""
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is TraceFormatError and str(back) == str(err)
    assert (back.path, back.line, back.field, back.reason, back.row) == (
        err.path,
        err.line,
        err.field,
        err.reason,
        err.row,
    )
