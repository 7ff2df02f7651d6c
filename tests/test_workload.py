"""Trace model, block layout arithmetic, native JSONL and Mooncake loaders, bad input."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload import Request, Trace, load_trace, write_native
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.sources import open_trace
from prefixlab.workload.trace import to_hash_form


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
