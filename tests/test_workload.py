"""Trace model (validation, take, sort), block layout arithmetic, the native JSONL, Mooncake,
Bailian, Marconi and Azure loaders, bad input."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import Request, Trace, load_trace, write_native
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.sources import open_trace
from prefixlab.workload.trace import TraceBuilder, to_hash_form
from tests.helpers import assert_identical

runner = CliRunner()


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    """The rows as a JSON-lines file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tok(inp: int, out: int = 0, start: int = 0, with_out: bool = True) -> Request:
    return Request(
        arrival_s=0.0,
        input_length=inp,
        output_length=out,
        input_tokens=list(range(start, start + inp)),
        output_tokens=list(range(10_000, 10_000 + out)) if with_out else None,
    )


# ---------------------------------------------------------------- layout arithmetic
def test_lookup_cap_and_held_blocks() -> None:
    # 4-token blocks. Input 8 (2 full blocks): cap 1 recomputed token -> 1 lookup block.
    # Input 9: 2 full blocks, 9-1=8 -> both can hit. Held = ceil((in+out)/4).
    tr = Trace.from_requests([_tok(8, 3), _tok(9, 0, with_out=False), _tok(3, 2)])
    lay = tr.block_layout(4)
    assert lay.num_lookup_blocks.tolist() == [1, 2, 0]
    assert lay.lookup_end_tokens.tolist() == [4, 8, 0]
    assert lay.num_blocks_held.tolist() == [3, 3, 2]
    # Keys cover full blocks of input + output: (8+3)//4 = 2, 9//4 = 2, (3+2)//4 = 1.
    assert np.diff(lay.key_offsets).tolist() == [2, 2, 1]
    lay0 = tr.block_layout(4, min_recompute_tokens=0)
    assert lay0.num_lookup_blocks.tolist() == [2, 2, 0]


def test_partial_block_lookup_only_without_recompute() -> None:
    # The hash-table report's setting: identical 15-token prompts, 16-token blocks.
    tr = Trace.from_requests([_tok(15, with_out=False), _tok(15, with_out=False)])
    lay = tr.block_layout(16, cache_partial=True, min_recompute_tokens=0)
    assert lay.num_lookup_blocks.tolist() == [1, 1]
    assert lay.lookup_end_tokens.tolist() == [15, 15]
    assert lay.request_keys(0).tolist() == lay.request_keys(1).tolist()
    capped = tr.block_layout(16, cache_partial=True, min_recompute_tokens=1)
    assert capped.num_lookup_blocks.tolist() == [0, 0]


def test_hash_form_keyed_blocks_and_shared_ids() -> None:
    reqs = [
        Request(0.0, 1100, 10, hash_ids=[1, 2, 3]),  # 1100 // 512 = 2 full keyed blocks
        Request(1.0, 1024, 0, hash_ids=[1, 2]),  # exact multiple: cap leaves 1 lookup
    ]
    tr = Trace.from_requests(reqs, block_tokens=512)
    lay = tr.block_layout()
    assert np.diff(lay.key_offsets).tolist() == [2, 2]
    assert lay.num_lookup_blocks.tolist() == [2, 1]
    assert lay.request_keys(0).tolist() == lay.request_keys(1).tolist()
    assert lay.num_blocks_held.tolist() == [3, 2]
    with pytest.raises(ConfigError, match="does not match"):
        tr.block_layout(16)


def test_hash_ids_shorter_than_claimed_is_an_error() -> None:
    tr = Trace.from_requests([Request(0.0, 2048, 0, hash_ids=[1, 2])], block_tokens=512)
    with pytest.raises(ConfigError, match="claims 4 full blocks"):
        tr.block_layout()


def test_to_hash_form_preserves_keys_and_counts() -> None:
    tr = generate_sessions(num_sessions=5, seed=1)
    hf = to_hash_form(tr, 16)
    a, b = tr.block_layout(16), hf.block_layout()
    assert a.num_lookup_blocks.tolist() == b.num_lookup_blocks.tolist()
    assert a.num_blocks_held.tolist() == b.num_blocks_held.tolist()
    assert a.raw_keys.tolist() == b.raw_keys.tolist()


def test_request_roundtrip_and_forms() -> None:
    tr = Trace.from_requests([_tok(5, 2), _tok(3, with_out=False)])
    assert tr[0].input_tokens == [0, 1, 2, 3, 4] and tr[0].output_tokens == [10_000, 10_001]
    assert tr[1].output_tokens is None and tr[-1].input_length == 3
    with pytest.raises(ConfigError):
        Trace.from_requests([_tok(3), Request(0.0, 3, 0, hash_ids=[1])], block_tokens=4)
    with pytest.raises(ConfigError):
        Trace.from_requests([])


# ---------------------------------------------------------------- trace model
def test_inconsistent_library_trace_is_refused_not_crashed() -> None:
    with pytest.raises(ConfigError, match="input_length=1 but it has 64 input tokens"):
        Trace.from_requests([Request(0.0, 1, 0, input_tokens=list(range(64)))])
    with pytest.raises(ConfigError, match="hashed_tokens=640 exceeds"):
        Trace.from_requests(
            [Request(0.0, 16, 0, hash_ids=list(range(40)), hashed_tokens=640)], block_tokens=16
        )
    repeated = Trace.from_requests([Request(0.0, 48, 0, hash_ids=[7, 7, 8])], block_tokens=16)
    with pytest.raises(ConfigError, match="block id 7 appears twice"):
        repeated.block_layout()


def _mixed_output_trace() -> Trace:
    """Token form, some requests without output tokens, ties in arrival time."""
    reqs = []
    for i in range(12):
        has_out = i % 3 != 0
        reqs.append(
            Request(
                arrival_s=float(i // 3),
                input_length=i + 1,
                output_length=2,
                session_id=f"s{i % 4}",
                turn=i // 4,
                task="t" if i % 2 else None,
                input_tokens=list(range(i, 2 * i + 1)),
                output_tokens=[100 + i, 200 + i] if has_out else None,
                prompt_text=f"p{i}" if i % 2 else None,
                extra_key="k" if i == 5 else None,
                think_s=0.5 * i if i % 4 else None,
            )
        )
    return Trace.from_requests(reqs, name="mixed")


def _permutation_traces() -> list[Trace]:
    gen = generate_sessions(
        num_sessions=30,
        **{k: 6 for k in ("system_tokens", "mean_user_tokens", "mean_output_tokens")},
        closed_loop=True,
        seed=2,
    )
    return [gen, _mixed_output_trace(), to_hash_form(gen, 4)]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["sessions", "mixed-outputs", "hash-form"])
def test_take_permutation_preserves_each_request(which: int) -> None:
    tr = _permutation_traces()[which]
    perm = np.random.default_rng(which).permutation(len(tr))
    taken = tr.take(perm)
    assert len(taken) == len(tr)
    assert [taken[j] for j in range(len(tr))] == [tr[int(i)] for i in perm]
    assert taken.is_hash_form == tr.is_hash_form and taken.block_tokens == tr.block_tokens
    # Taking the inverse permutation restores the original exactly.
    assert_identical(taken.take(np.argsort(perm)), tr)
    # Negative rows and repeats work; out-of-range rows do not.
    sub = tr.take([-1, 0, 0])
    assert list(sub) == [tr[len(tr) - 1], tr[0], tr[0]]
    with pytest.raises(IndexError):
        tr.take([len(tr)])
    if tr.is_hash_form:
        assert tr.hashed_tokens is not None and taken.hashed_tokens is not None
        assert np.array_equal(taken.hashed_tokens, tr.hashed_tokens[perm])


def test_sorted_by_arrival_and_builder_sort_are_stable() -> None:
    base = _mixed_output_trace()
    order = np.random.default_rng(5).permutation(len(base))
    shuffled = base.take(order)
    srt = shuffled.sorted_by_arrival()
    want = np.argsort(shuffled.arrival_s, kind="stable")
    assert list(srt) == [shuffled[int(i)] for i in want]
    assert np.all(np.diff(srt.arrival_s) >= 0)
    # Ties keep their order in the shuffled trace.
    for t in np.unique(srt.arrival_s):
        got = [r.input_length for r in srt if r.arrival_s == t]
        assert got == [r.input_length for r in shuffled if r.arrival_s == t]
    assert srt.sorted_by_arrival() is srt
    builder = TraceBuilder(sort_by_arrival=True, name="b")
    for r in shuffled:
        builder.append(r)
    built = builder.build()
    assert list(built) == list(srt)
    assert built.name == "b"
    unsorted = TraceBuilder()
    for r in shuffled:
        unsorted.append(r)
    assert list(unsorted.build()) == list(shuffled)


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


# ---------------------------------------------------------------- generator + sources
def test_sessions_generator_deterministic_and_multi_turn() -> None:
    a = generate_sessions(num_sessions=20, seed=3)
    b = open_trace("gen:sessions:num_sessions=20,seed=3")
    assert a.input_tokens is not None and b.input_tokens is not None
    assert np.array_equal(a.input_tokens[0], b.input_tokens[0])
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.all(np.diff(a.arrival_s) >= 0)
    # Turn k+1's input starts with turn k's input and output.
    by_session: dict[str | None, list[int]] = {}
    for i in range(len(a)):
        by_session.setdefault(a.session_id[i], []).append(i)
    checked = 0
    for idx in by_session.values():
        for prev, nxt in itertools.pairwise(idx):
            p, n = a[prev], a[nxt]
            assert p.input_tokens is not None and p.output_tokens is not None
            history = list(p.input_tokens) + list(p.output_tokens)
            assert list(n.input_tokens or [])[: len(history)] == history
            assert n.turn == p.turn + 1
            checked += 1
    assert checked > 10
    c = generate_sessions(num_sessions=20, seed=4)
    assert c.input_tokens is not None
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_generator_bad_parameters() -> None:
    with pytest.raises(ConfigError, match="no parameter 'sesions'"):
        open_trace("gen:sessions:sesions=3")
    with pytest.raises(ConfigError, match="preset"):
        generate_sessions(preset="video")
    with pytest.raises(ConfigError, match="unknown generator"):
        open_trace("gen:nothing")
