"""Bailian and Marconi loaders on written fixtures that follow the published field lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixlab.errors import TraceFormatError
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import load_trace


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bailian_rows() -> list[dict[str, object]]:
    # Two conversations sharing a 2-block system prompt (ids 1, 2); 16-token blocks.
    # Conversation 10: turns 10 -> 12 -> 14. Conversation 11: 11 -> 13.
    return [
        {"chat_id": 10, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40,
         "output_length": 8, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
        {"chat_id": 11, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 36,
         "output_length": 5, "type": "search", "turn": 1, "hash_ids": [1, 2, 7]},
        {"chat_id": 12, "parent_chat_id": 10, "timestamp": 9.0, "input_length": 70,
         "output_length": 4, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]},
        {"chat_id": 13, "parent_chat_id": 11, "timestamp": 9.5, "input_length": 50,
         "output_length": 4, "type": "search", "turn": 2, "hash_ids": [1, 2, 7, 8]},
        {"chat_id": 14, "parent_chat_id": 12, "timestamp": 20.0, "input_length": 90,
         "output_length": 4, "type": "text", "turn": 3, "hash_ids": [1, 2, 3, 4, 5, 6]},
    ]  # fmt: skip


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


def test_marconi_loader(tmp_path: Path) -> None:
    rows = [
        {"session_id": "a", "turn_id": 0, "ts": 0.0, "num_input_tokens": 5,
         "num_output_tokens": 2, "input_tokens": [1, 2, 3, 4, 5], "output_tokens": [6, 7]},
        {"session_id": "a", "turn_id": 1, "ts": 3.5, "num_input_tokens": 9,
         "num_output_tokens": 1, "input_tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9],
         "output_tokens": [0]},
    ]  # fmt: skip
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
