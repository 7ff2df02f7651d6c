"""Hash ids name prefixes: an id reused under another parent is refused, or counted.

Hand-computed cases, a property test against a dictionary, and the paths a user meets:
whole loads, streamed chunks and the command line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import TraceFormatError
from prefixlab.workload.idcheck import (
    IdConflictWarning,
    ParentCheck,
    check_id_parents,
    id_conflict_mode,
)
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.loaders.base import NotStreamable, iter_chunks


def _ragged(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    values = np.array([x for r in rows for x in r], dtype=np.uint64)
    offsets = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    return values, offsets


def test_the_issues_case_is_one_conflict() -> None:
    # [1, 2, 3] then [2, 3]: id 2 opened by nothing where it followed 1; id 3 still follows 2
    found = check_id_parents(*_ragged([[1, 2, 3], [2, 3]]))
    assert found is not None
    assert (found.count, found.request, found.block_id) == (1, 1, 2)
    assert (found.parent, found.first_parent) == (None, 1)
    assert "first: request 1, id 2 opening a request, first seen after id 1" in found.describe()


def test_shared_prefixes_and_branches_are_no_conflict() -> None:
    assert check_id_parents(*_ragged([[1, 2, 3], [1, 2, 4], [1, 5], [6], [1]])) is None


def test_every_later_use_counts_and_the_first_is_named() -> None:
    # 9 follows 7, then 8 twice (two uses), then 7 again (fine); 8 opens, then follows 9
    rows = [[7, 9], [8, 9], [5], [8, 9], [7, 9], [9, 8]]
    found = check_id_parents(*_ragged(rows))
    assert found is not None
    assert (found.count, found.request, found.block_id) == (4, 1, 9)
    assert (found.parent, found.first_parent) == (8, 7)


def test_ids_above_two_to_the_63_keep_their_value() -> None:
    big = (1 << 64) - 5
    found = check_id_parents(*_ragged([[big, 3], [4, 3]]))
    assert found is not None and (found.block_id, found.parent, found.first_parent) == (3, 4, big)
    found = check_id_parents(*_ragged([[big], [2, big]]))
    assert found is not None and (found.block_id, found.first_parent) == (big, None)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 11), max_size=5, unique=True), max_size=25),
    cut=st.integers(0, 25),
)
def test_matches_a_dictionary_in_one_go_and_in_two_chunks(rows: list[list[int]], cut: int) -> None:
    """Against the rule written out: the first parent each id follows, and every later use
    under another counted; chunked like a streamed replay (the table grows from 4,096)."""
    first: dict[int, int | None] = {}
    count, where = 0, None
    for r, ids in enumerate(rows):
        for i, x in enumerate(ids):
            parent = ids[i - 1] if i else None
            if x not in first:
                first[x] = parent
            elif first[x] != parent:
                count += 1
                where = where or (r, x, parent, first[x])
    found = check_id_parents(*_ragged(rows)) if rows else None
    check = ParentCheck()
    for part in (rows[:cut], rows[cut:]):
        if part:
            check.add(*_ragged(part))
    for got in (found, check.conflicts):
        if count == 0:
            assert got is None
        else:
            assert got is not None
            assert (got.count, (got.request, got.block_id, got.parent, got.first_parent)) == (
                count,
                where,
            )


def test_the_table_grows_past_its_first_size() -> None:
    rows = [list(range(i * 50, i * 50 + 50)) for i in range(400)]  # 20,000 distinct ids
    rows.append([20_000, 0])  # id 0 opened its request; here it follows 20,000
    found = check_id_parents(*_ragged(rows))
    assert found is not None and (found.count, found.request, found.block_id) == (1, 400, 0)


def _mooncake(path: Path, rows: list[list[int]]) -> Path:
    lines = [
        {"timestamp": i, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids}
        for i, ids in enumerate(rows)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_load_refuses_or_warns(tmp_path: Path) -> None:
    p = _mooncake(tmp_path / "t.jsonl", [[1, 2, 3], [2, 3]])
    with pytest.raises(TraceFormatError, match=r"t\.jsonl: field 'hash_ids': 1 use of a hash id"):
        load_trace(p, "mooncake")
    with pytest.warns(IdConflictWarning, match="1 use of a hash id") as caught:
        tr = load_trace(p, "mooncake", id_conflicts="warn")
    assert len(tr) == 2 and caught[0].message.conflicts.count == 1  # type: ignore[union-attr]
    assert len(load_trace(p, "mooncake", id_conflicts="ignore")) == 2
    with pytest.raises(Exception, match="must be one of error, warn, ignore, got 'skip'"):
        id_conflict_mode("skip")


def test_a_native_trace_salted_by_extra_key_is_two_blocks(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    header = {"prefixlab_trace": 1, "block_tokens": 16}
    rows = [
        {"hash_ids": [1, 2], "input_length": 32, "output_length": 0, "extra_key": "a"},
        {"hash_ids": [2], "input_length": 16, "output_length": 0, "extra_key": "b"},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows]))
    assert len(load_trace(p)) == 2  # id 2 under "b" is another block than under "a"
    rows[1]["extra_key"] = "a"
    p.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows]))
    with pytest.raises(TraceFormatError, match="id 2 opening a request, first seen after id 1"):
        load_trace(p)


@pytest.mark.parametrize("size", [1, 2])
def test_a_stream_stops_or_counts_across_chunks(tmp_path: Path, size: int) -> None:
    rows = [[1, 2, 3], [4], [2, 3], [5, 2]]  # id 2 after nothing, then after 5: two uses
    p = _mooncake(tmp_path / "t.jsonl", rows)
    chunks = iter_chunks(p, "mooncake", chunk_requests=size)
    assert chunks is not None
    with pytest.raises(NotStreamable):
        list(chunks)
    chunks = iter_chunks(p, "mooncake", chunk_requests=size, id_conflicts="warn")
    assert chunks is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [len(c) for c, _ in chunks]
    assert sum(got) == 4
    found = [w.message for w in caught if isinstance(w.message, IdConflictWarning)]
    assert len(found) == 1 and found[0].conflicts.count == 2
    assert found[0].conflicts.request == 2


@pytest.mark.parametrize("stream", [[], ["--no-stream"]])
def test_the_command_line_says_it_in_one_line(tmp_path: Path, stream: list[str]) -> None:
    p = _mooncake(tmp_path / "t.jsonl", [[1, 2, 3], [2, 3]])
    base = ["replay", str(p), "-f", "mooncake", "--capacity-blocks", "10", "-p", "lru", *stream]
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 2
    assert "error:" in result.output and "--id-conflicts warn loads it anyway" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, [*base, "--id-conflicts", "warn", "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.count("warning:") == 1
    assert "1 use of a hash id" in result.output
