"""The Bailian (Alibaba) loader (workload/loaders/bailian.py): sessions from the parent
chain, slices with missing parents, out-of-order lines, bad lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.errors import TraceFormatError
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import load_trace

runner = CliRunner()


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    """The rows as a JSON-lines file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- Bailian
# Written fixtures that follow the published field lists (as for Marconi below).
def _bailian_rows() -> list[dict[str, object]]:
    # Two conversations sharing a 2-block system prompt (ids 1, 2); 16-token blocks.
    # Conversation 10: turns 10 -> 12 -> 14. Conversation 11: 11 -> 13.
    return [
        {
            "chat_id": 10,
            "parent_chat_id": -1,
            "timestamp": 0.0,
            "input_length": 40,
            "output_length": 8,
            "type": "text",
            "turn": 1,
            "hash_ids": [1, 2, 3],
        },
        {
            "chat_id": 11,
            "parent_chat_id": -1,
            "timestamp": 0.5,
            "input_length": 36,
            "output_length": 5,
            "type": "search",
            "turn": 1,
            "hash_ids": [1, 2, 7],
        },
        {
            "chat_id": 12,
            "parent_chat_id": 10,
            "timestamp": 9.0,
            "input_length": 70,
            "output_length": 4,
            "type": "text",
            "turn": 2,
            "hash_ids": [1, 2, 3, 4, 5],
        },
        {
            "chat_id": 13,
            "parent_chat_id": 11,
            "timestamp": 9.5,
            "input_length": 50,
            "output_length": 4,
            "type": "search",
            "turn": 2,
            "hash_ids": [1, 2, 7, 8],
        },
        {
            "chat_id": 14,
            "parent_chat_id": 12,
            "timestamp": 20.0,
            "input_length": 90,
            "output_length": 4,
            "type": "text",
            "turn": 3,
            "hash_ids": [1, 2, 3, 4, 5, 6],
        },
    ]


def test_bailian_sessions_from_parent_chain(tmp_path: Path) -> None:
    tr = load_trace(_write(tmp_path / "b.jsonl", _bailian_rows()), "bailian")
    assert tr.block_tokens == 16 and tr.is_hash_form
    assert tr.session_id == ["10", "11", "10", "11", "10"]
    assert tr.task == ["text", "search", "text", "search", "text"]
    assert tr.turn.tolist() == [1, 1, 2, 2, 3]
    # Replay with room for everything: hits are the cached full blocks of the prefix.
    # r0 40 tok: nothing cached. r1: ids 1,2 cached -> 32. r2: 1,2,3 cached (40//16 = 2 full
    # blocks of r0 were keyed: 1,2 only; 3 was partial) -> 32. r3: 1,2,7 (7 was r1's partial
    # block: not keyed) -> 32. r4: 1,2,3,4 keyed by r2 (70//16 = 4) -> 64.
    res = replay(tr, "lru", ReplayConfig(capacity_blocks=100))
    assert res.hit_tokens.tolist() == [0, 32, 32, 32, 64]


def test_bailian_slice_with_missing_parents(tmp_path: Path) -> None:
    """A time slice starts mid-conversation: children of an absent parent share a session."""
    rows = _bailian_rows()[2:]  # chats 12, 13, 14; parents 10 and 11 are not in the file
    tr = load_trace(_write(tmp_path / "slice.jsonl", rows), "bailian")
    assert tr.session_id == ["10", "11", "10"]  # 14's parent 12 has root 10


def test_bailian_out_of_order_lines_are_sorted(tmp_path: Path) -> None:
    rows = _bailian_rows()
    rows[1], rows[3] = rows[3], rows[1]  # 13 (t=9.5, parent 11) now precedes 11 (t=0.5)
    tr = load_trace(_write(tmp_path / "b.jsonl", rows), "bailian")
    assert tr.arrival_s.tolist() == sorted(tr.arrival_s.tolist())
    # 13 came before its parent 11: it roots at 11 by id, so the session is the same.
    by_time = dict(zip(tr.arrival_s.tolist(), tr.session_id, strict=True))
    assert by_time[0.5] == by_time[9.5] == "11"


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"chat_id": 10}, "chat_id", "appears twice"),
        ({"hash_ids": [1]}, "hash_ids", "claim 4"),
        ({"timestamp": -1}, "timestamp", ">= 0"),
        ({"parent_chat_id": "x"}, "parent_chat_id", "chat id or -1"),
    ],
)
def test_bailian_bad_lines(
    tmp_path: Path, patch: dict[str, object], field: str, words: str
) -> None:
    rows = _bailian_rows()
    rows[2] = {**rows[2], **patch}
    p = _write(tmp_path / "b.jsonl", rows)
    with pytest.raises(TraceFormatError) as info:
        load_trace(p, "bailian")
    assert info.value.line == 3 and info.value.field == field and words in str(info.value)
