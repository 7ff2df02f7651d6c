"""The columnar Mooncake path builds exactly the line-by-line trace, or steps aside."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prefixlab._jit import COMPILED
from prefixlab.errors import TraceFormatError
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.loaders._columnar import read_mooncake, rows_have_repeats
from prefixlab.workload.loaders.base import LoadOptions
from prefixlab.workload.trace import Trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake"
needs_numba = pytest.mark.skipif(not COMPILED, reason="the columnar path needs numba")


def _lines(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def _row(ts: object = 0, inp: object = 600, out: object = 5, ids: object = (1, 2)) -> str:
    ids = list(ids) if isinstance(ids, tuple) else ids
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})


def _same(a: Trace, b: Trace) -> None:
    assert len(a) == len(b)
    for name in ("arrival_s", "input_length", "output_length", "turn", "hashed_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.think_s, b.think_s, equal_nan=True)
    assert a.hash_ids is not None and b.hash_ids is not None
    assert a.hash_ids[0].dtype == b.hash_ids[0].dtype == np.uint64
    assert np.array_equal(a.hash_ids[0], b.hash_ids[0])
    assert np.array_equal(a.hash_ids[1], b.hash_ids[1])
    assert (a.session_id, a.task, a.block_tokens, a.name) == (
        b.session_id,
        b.task,
        b.block_tokens,
        b.name,
    )


def _line_by_line(path: Path, **kw: object) -> Trace:
    # sample=1.0 keeps every request but is an option the columnar path leaves to the loader
    return load_trace(path, "mooncake", sample=1.0, **kw)  # type: ignore[arg-type]


@needs_numba
@pytest.mark.parametrize(
    "kw", [{}, {"limit": 1000}, {"start_s": 600.0, "end_s": 1800.0}, {"start_s": 60.0, "limit": 7}]
)
def test_columnar_equals_line_by_line_on_the_bundled_trace(kw: dict[str, object]) -> None:
    path = SHARED / "conversation_trace.jsonl"
    fast = read_mooncake(path, 512, LoadOptions(**kw))  # type: ignore[arg-type]
    assert fast is not None
    _same(fast, _line_by_line(path, **kw))
    _same(load_trace(path, "mooncake", **kw), fast)  # type: ignore[arg-type]


@needs_numba
def test_columnar_sorts_by_arrival_and_skips_blank_lines(tmp_path: Path) -> None:
    path = _lines(tmp_path, [_row(ts=30, ids=(5, 6)), "", _row(ts=10, ids=(5, 7)), _row(ts=20)])
    fast = read_mooncake(path, 512, LoadOptions())
    assert fast is not None
    assert fast.arrival_s.tolist() == [0.01, 0.02, 0.03]
    _same(fast, _line_by_line(path))


@needs_numba
@pytest.mark.parametrize(
    ("row", "where"),
    [
        (_row(inp=-1), "jsonl:2: field 'input_length'"),
        (_row(out=2.5), "jsonl:2: field 'output_length'"),
        (_row(ts=None), "jsonl:2: field 'timestamp'"),
        (_row(ts=float("inf")).replace("Infinity", "1e999"), "jsonl:2: field 'timestamp'"),
        (_row(ts=True), "jsonl:2: field 'timestamp'"),
        (_row(ids=(1, 2, 1)), "jsonl:2: field 'hash_ids'"),
        (_row(ids=(1, -2)), "jsonl:2: field 'hash_ids'"),
        (_row(ids=(1, 2**64)), "jsonl:2: field 'hash_ids'"),
        (_row(inp=2000), "jsonl:2: field 'hash_ids'"),
        (
            '{"timestamp": 1, "input_length": 600, "hash_ids": [1, 2]}',
            "jsonl:2: field 'output_length'",
        ),
        ('{"timestamp": 1, "input_length": 600, ', "jsonl:2: "),
    ],
)
def test_bad_lines_step_aside_and_the_loader_names_them(
    tmp_path: Path, row: str, where: str
) -> None:
    path = _lines(tmp_path, [_row(), row, _row(ts=5)])
    assert read_mooncake(path, 512, LoadOptions()) is None
    with pytest.raises(TraceFormatError, match=where):
        load_trace(path, "mooncake")


@needs_numba
def test_integer_valued_floats_take_the_line_by_line_path_and_load(tmp_path: Path) -> None:
    path = _lines(tmp_path, [_row(), _row(inp=600.0)])
    assert read_mooncake(path, 512, LoadOptions()) is None
    assert load_trace(path, "mooncake").input_length.tolist() == [600, 600]


def test_rows_have_repeats_by_hand() -> None:
    vals = np.array([3, 1, 2, 7, 7, 9], dtype=np.uint64)
    assert not rows_have_repeats(vals, np.array([0, 3, 4, 6]))  # [3 1 2] [7] [7 9]
    assert rows_have_repeats(vals, np.array([0, 3, 5, 6]))  # [7 7]
    assert not rows_have_repeats(vals[:0], np.array([0]))


@pytest.mark.parametrize("n", [31, 32, 33, 100])
def test_rows_have_repeats_short_and_long_rows(n: int) -> None:
    """Rows up to 32 values are checked pair by pair, longer ones by a sort: both find a
    repeat at either end of a row, and accept a row without one."""
    row = np.arange(10, 10 + n, dtype=np.uint64)
    offs = np.array([0, 2, 2 + n])
    vals = np.concatenate((np.array([1, 2], np.uint64), row))
    assert not rows_have_repeats(vals, offs)
    for i, j in ((0, n - 1), (n - 2, n - 1), (0, 1)):
        bad = vals.copy()
        bad[2 + j] = bad[2 + i]
        assert rows_have_repeats(bad, offs), (i, j)


@needs_numba
def test_whole_file_read_reports_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The columnar read says how far it is after every block it parses, up to the file's
    size, and builds the same trace as without a reporter."""
    from prefixlab.workload.loaders import _columnar
    from prefixlab.workload.loaders.base import load_progress

    rows = [
        json.dumps(
            {
                "timestamp": i,
                "input_length": 600,
                "output_length": 3,
                "hash_ids": [2 * i, 2 * i + 1],
            }
        )
        for i in range(3000)
    ]
    path = _lines(tmp_path, rows)
    monkeypatch.setattr(_columnar, "BLOCK_BYTES", 8192)
    seen: list[tuple[int, int]] = []
    with load_progress(lambda done, total: seen.append((done, total))):
        trace = load_trace(path, "mooncake")
    size = path.stat().st_size
    assert len(seen) > 5
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (size, size) and all(t == size for _, t in seen)
    assert trace.input_length.tolist() == load_trace(path, "mooncake").input_length.tolist()
