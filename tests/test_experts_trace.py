"""Expert traces: the ExpertTrace invariants, the .npz and routing-JSONL formats, generators."""

from __future__ import annotations

import gzip
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.experts import routing_jsonl, trace, trace_io
from prefixlab.experts.generators import (
    EXPERT_GENERATORS,
    cross_layer_map,
    generate,
    zipf_layout,
    zipf_popularity,
)
from prefixlab.experts.routing_jsonl import load_routing_jsonl, write_routing_jsonl
from prefixlab.experts.trace import ExpertTrace
from prefixlab.experts.trace_io import load_expert_trace, load_trace, save_trace

# 2 tokens, 2 layers, top-2, lines out of order (n inferred as 4).
HAND = [
    '{"layer": 1, "token_idx": 0, "experts": [3, 1], "gating_probs": [0.6, 0.4]}',
    '{"layer": 0, "token_idx": 1, "experts": [1, 2], "gating_probs": [0.7, 0.3]}',
    '{"layer": 0, "token_idx": 0, "experts": [2, 0], "gating_probs": [0.5, 0.5]}',
    '{"layer": 1, "token_idx": 1, "experts": [0, 3], "gating_probs": [0.9, 0.1]}',
]


def _write(tmp_path: Path, lines: list[str], name: str = "r.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _trace(experts: list[int], num_layers: int = 2, num_experts: int = 4) -> ExpertTrace:
    rounds = len(experts) // num_layers
    tok = np.repeat(np.arange(rounds), num_layers)
    return ExpertTrace(num_layers, num_experts, np.array(experts), tok, np.zeros(len(experts), int))


# ------------------------------------------------------------------------------ the type


def test_pages_layers_and_counts_of_a_small_trace() -> None:
    tr = _trace([1, 3, 0, 2, 1, 1])
    tr.validate()
    assert tr.layer.tolist() == [0, 1, 0, 1, 0, 1]
    assert tr.pages.tolist() == [1, 7, 0, 6, 1, 5]
    assert (tr.num_requests, tr.num_rounds, tr.num_tokens, tr.top_k) == (6, 3, 3, 1)
    assert tr.take_rounds(2).pages.tolist() == [1, 7, 0, 6]
    assert tr.slice_rounds(1, 3).pages.tolist() == [0, 6, 1, 5]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_experts": -1}, "num_experts"),
        ({"num_experts": 2**62}, "num_experts"),  # 2 * 2**62 page ids overflow int64
        (  # 3 requests, 2 layers
            {
                "expert": np.array([0, 1, 2]),
                "token_idx": np.zeros(3, int),
                "rank": np.zeros(3, int),
            },
            "expert",
        ),
        ({"expert": np.array([0, 4, 0, 0])}, "expert"),  # 4 >= n
        ({"expert": np.array([0, -1, 0, 0])}, "expert"),
        ({"rank": np.array([0, 1, 0, 0])}, "rank"),  # ranks mixed in round 0
        ({"rank": np.array([-1, -1, 0, 0])}, "rank"),
        ({"token_idx": np.array([0, 0, 1, 2])}, "token_idx"),  # token changes mid-round
        ({"token_idx": np.array([0, 0, 1])}, "token_idx"),  # length
        ({"gate": np.array([0.5, 0.5, 1.5, 0.1])}, "gate"),
        ({"gate": np.array([0.5, 0.5])}, "gate"),
        ({"gate": np.array([0.5, np.nan, 0.5, 0.5])}, "gate"),
    ],
)
def test_validate_names_the_broken_field(change: dict[str, object], field: str) -> None:
    base: dict[str, object] = {
        "num_layers": 2,
        "num_experts": 4,
        "expert": np.array([0, 1, 2, 3]),
        "token_idx": np.array([0, 0, 1, 1]),
        "rank": np.zeros(4, dtype=np.int64),
    }
    tr = ExpertTrace(**{**base, **change})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"ExpertTrace\.{field}:"):
        tr.validate()


def test_float_experts_are_rejected_not_truncated() -> None:
    with pytest.raises(ConfigError, match="expert"):
        ExpertTrace(1, 4, np.array([1.5]), np.array([0]), np.array([0]))


def test_take_tokens_and_top_k_cut_keep_whole_tokens(tmp_path: Path) -> None:
    tr = load_routing_jsonl(_write(tmp_path, HAND))
    assert tr.take_tokens(1).pages.tolist() == [2, 7, 0, 5]
    assert tr.take_tokens(5).num_rounds == 4
    assert tr.with_top_k(1).pages.tolist() == [2, 7, 1, 4]
    with pytest.raises(ConfigError, match="top_k"):
        tr.with_top_k(3)


def test_summary_counts_and_entropy() -> None:
    s = generate("cyclic", num_layers=3, num_experts=4, num_rounds=8).summary()
    assert (s.num_requests, s.num_rounds, s.num_tokens, s.num_distinct_pages) == (24, 8, 8, 12)
    assert s.layer_entropy_bits == pytest.approx((2.0, 2.0, 2.0))
    single = _trace([1, 2, 1, 2]).summary()
    assert single.layer_entropy_bits == (0.0, 0.0)
    assert single.as_dict()["max_entropy_bits"] == 2.0


# -------------------------------------------------------------------------- file formats


def test_top_k_lines_become_rounds_of_choices(tmp_path: Path) -> None:
    tr = load_routing_jsonl(_write(tmp_path, HAND))
    assert (tr.num_layers, tr.num_experts) == (2, 4)
    assert tr.pages.tolist() == [2, 7, 0, 5, 1, 4, 2, 7]
    assert tr.rank.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert tr.token_idx.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert tr.gate is not None
    assert tr.gate.tolist() == [0.5, 0.6, 0.5, 0.4, 0.7, 0.9, 0.3, 0.1]
    cut = load_routing_jsonl(_write(tmp_path, HAND), top_k=1, num_experts=6)
    assert cut.pages.tolist() == [2, 9, 1, 6]


def test_alias_keys_gzip_and_blank_lines(tmp_path: Path) -> None:
    lines = [
        '{"layer": 0, "token_idx": 5, "indices": [1], "scores": [1.0]}',
        "",
        '{"layer": 1, "token_idx": 5, "indices": [0], "scores": [1.0]}',
    ]
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    tr = load_expert_trace(path)
    assert tr.pages.tolist() == [1, 2] and tr.token_idx.tolist() == [5, 5]


GOOD = '{"layer": 0, "token_idx": 0, "experts": [1, 2]}'
MALFORMED = [
    ("{not json", None),
    ("[1, 2]", None),
    ('{"token_idx": 0, "experts": [1, 2]}', "layer"),
    ('{"layer": -1, "token_idx": 0, "experts": [1, 2]}', "layer"),
    ('{"layer": "1", "token_idx": 0, "experts": [1, 2]}', "layer"),
    ('{"layer": true, "token_idx": 0, "experts": [1, 2]}', "layer"),
    ('{"layer": 1, "experts": [1, 2]}', "token_idx"),
    ('{"layer": 1, "token_idx": 0.5, "experts": [1, 2]}', "token_idx"),
    ('{"layer": 1, "token_idx": 0}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": []}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": 3}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": [1, "2"]}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": [1, -2]}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": [2, 2]}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": [1, 2, 3]}', "experts"),  # k differs
    ('{"layer": 1, "token_idx": 0, "experts": [1, 2], "indices": [1, 2]}', "indices"),
    ('{"layer": 1, "token_idx": 0, "experts": [1, 2], "gating_probs": [0.5, 0.5]}', "gating_probs"),
    # ids must fit int64 (no OverflowError when the columns are built)
    ('{"layer": 1, "token_idx": 9223372036854775808, "experts": [1, 2]}', "token_idx"),
    ('{"layer": 18446744073709551616, "token_idx": 0, "experts": [1, 2]}', "layer"),
    ('{"layer": 1, "token_idx": 0, "experts": [1, 9223372036854775808]}', "experts"),
    ('{"layer": 1, "token_idx": 0, "experts": [1, 1' + "0" * 5000 + "]}", None),  # > 4300 digits
]


@pytest.mark.parametrize(("bad", "field"), MALFORMED)
def test_malformed_line_names_line_and_field(tmp_path: Path, bad: str, field: str | None) -> None:
    path = _write(tmp_path, [GOOD, "", bad])
    with pytest.raises(TraceFormatError) as err:
        load_routing_jsonl(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 3, field)
    assert f"{path}:3" in str(err.value)


@pytest.mark.parametrize(
    ("first", "bad", "kwargs", "field"),
    [
        (GOOD, '{"layer": 2, "token_idx": 0, "experts": [1, 2]}', {"num_layers": 2}, "layer"),
        (GOOD, '{"layer": 1, "token_idx": 0, "experts": [1, 9]}', {"num_experts": 8}, "experts"),
        (GOOD, '{"layer": 1, "token_idx": 0, "experts": [1]}', {"top_k": 2}, "experts"),
        (
            '{"layer": 0, "token_idx": 0, "experts": [1], "gating_probs": [1.0]}',
            '{"layer": 1, "token_idx": 0, "experts": [1]}',
            {},
            "gating_probs",
        ),
        (
            GOOD,
            '{"layer": 1, "token_idx": 0, "experts": [1, 2], "gating_probs": [0.5]}',
            {},
            "gating_probs",
        ),
        (
            '{"layer": 0, "token_idx": 0, "experts": [1], "topk_weights": [1.0]}',
            '{"layer": 1, "token_idx": 0, "experts": [1], "topk_weights": [1.5]}',
            {},
            "topk_weights",
        ),
        (GOOD, '{"layer": 0, "token_idx": 0, "experts": [3, 2]}', {}, "layer"),  # duplicate
    ],
)
def test_inconsistent_lines_name_line_and_field(
    tmp_path: Path, first: str, bad: str, kwargs: dict[str, int], field: str
) -> None:
    with pytest.raises(TraceFormatError) as err:
        load_routing_jsonl(_write(tmp_path, [first, bad]), **kwargs)
    assert (err.value.line, err.value.field) == (2, field)


def test_missing_layer_names_the_token_and_layer(tmp_path: Path) -> None:
    lines = [*HAND[:3], '{"layer": 2, "token_idx": 0, "experts": [0, 1], "scores": [1, 0]}']
    with pytest.raises(TraceFormatError, match="token 1 has no line for layer 1") as err:
        load_routing_jsonl(_write(tmp_path, lines))
    assert err.value.field == "layer"


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no routing lines"):
        load_routing_jsonl(_write(tmp_path, [""]))
    with pytest.raises(ConfigError, match="not found"):
        load_routing_jsonl(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="top_k"):
        load_routing_jsonl(_write(tmp_path, HAND), top_k=0)


def _gated(tr: ExpertTrace) -> ExpertTrace:
    """``tr`` with gates that shrink with the rank (as a router's top-k) and vary by layer."""
    gate = 0.5**tr.rank * (0.3 + 0.7 * tr.layer / tr.num_layers)
    return ExpertTrace(
        tr.num_layers, tr.num_experts, tr.expert, tr.token_idx, tr.rank, gate, dict(tr.meta)
    )


@pytest.mark.parametrize("name", ["t.npz", "t.jsonl", "t.jsonl.gz"])
def test_save_load_round_trip_is_exact(tmp_path: Path, name: str) -> None:
    tr = generate("zipf", num_layers=3, num_experts=40, num_tokens=50, top_k=3, r=0.3, seed=4)
    for original in (tr, _gated(tr)):
        save_trace(original, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert (back.num_layers, back.num_experts) == (3, 40)  # n from the header, not max + 1
        assert back.equals(original), back.meta  # meta too: the header carries it as it was
        assert load_expert_trace(tmp_path / name).equals(original)


def test_a_loaded_routing_file_saves_and_loads_back_equal(tmp_path: Path) -> None:
    first = load_routing_jsonl(_write(tmp_path, HAND))  # no header: meta says where from
    assert first.meta == {
        "source": str(tmp_path / "r.jsonl"),
        "format": "routing-jsonl",
        "top_k": "2",
    }
    write_routing_jsonl(first, tmp_path / "again.jsonl")
    assert load_routing_jsonl(tmp_path / "again.jsonl").equals(first)


def test_gzip_output_is_byte_identical_across_runs(tmp_path: Path) -> None:
    tr = generate("uniform", num_layers=2, num_experts=4, num_tokens=5)
    save_trace(tr, tmp_path / "a.jsonl.gz")
    save_trace(tr, tmp_path / "b.jsonl.gz")
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_writer_rejects_traces_that_are_not_whole_top_k_tokens(tmp_path: Path) -> None:
    uneven = ExpertTrace(1, 4, np.array([0, 1, 2]), np.array([0, 0, 1]), np.array([0, 1, 0]))
    with pytest.raises(ConfigError, match=r"rank 0\.\.k-1"):
        write_routing_jsonl(uneven, tmp_path / "x.jsonl")
    backwards = _trace([0, 1, 2, 3])
    backwards = ExpertTrace(2, 4, backwards.expert, np.array([1, 1, 0, 0]), backwards.rank)
    with pytest.raises(ConfigError, match="increase"):
        write_routing_jsonl(backwards, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


def test_rows_writer_with_header(tmp_path: Path) -> None:
    rows = [json.loads(x) for x in HAND]
    path = tmp_path / "rows.jsonl"
    assert write_routing_jsonl(rows, path, num_experts=10, meta={"model": "tiny"}) == 4
    tr = load_routing_jsonl(path)
    assert tr.num_experts == 10 and tr.meta == {"model": "tiny"}  # the header's meta, as given
    assert tr.pages.tolist() == [2, 13, 0, 11, 1, 10, 2, 13]


def test_bad_npz_files_raise_trace_format_errors(tmp_path: Path) -> None:
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceFormatError, match=r"not a prefixlab expert trace \(\.npz\)"):
        load_trace(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", x=np.arange(3))
    with pytest.raises(TraceFormatError) as err:
        load_trace(tmp_path / "other.npz")
    assert err.value.field == "format"


def test_load_expert_trace_sources(tmp_path: Path) -> None:
    tr = load_expert_trace("gen:zipf:num_layers=2,num_experts=4,num_tokens=10,top_k=2,seed=1")
    assert tr.num_requests == 40 and tr.meta["generator"] == "zipf"
    assert load_expert_trace(tr.meta["spec"]).equals(tr)  # the spec reproduces the trace
    assert load_expert_trace("gen:zipf:num_layers=2,num_tokens=10,top_k=2", top_k=1).top_k == 1
    save_trace(tr, tmp_path / "t.npz")
    assert load_expert_trace(tmp_path / "t.npz").equals(tr)
    with pytest.raises(ConfigError, match="num_experts=4, not 5"):
        load_expert_trace(tmp_path / "t.npz", num_experts=5)
    with pytest.raises(ConfigError, match="unknown expert generator 'nope'"):
        load_expert_trace("gen:nope")
    with pytest.raises(ConfigError, match="no parameter 'x'"):
        load_expert_trace("gen:zipf:x=1")
    with pytest.raises(ConfigError, match=r"\.npz, \.jsonl"):
        load_expert_trace(tmp_path / "t.csv")
    with pytest.raises(ConfigError, match="inside the spec"):
        load_expert_trace("gen:uniform", num_layers=3)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda num_layers: st.tuples(
            st.just(num_layers),
            st.integers(1, 3),  # top-k
            st.lists(st.integers(0, 50), min_size=1, max_size=5, unique=True),  # token ids
            st.randoms(use_true_random=False),
        )
    )
)
def test_written_rows_load_back_as_the_naive_page_sequence(case: tuple) -> None:  # type: ignore[type-arg]
    num_layers, k, token_ids, rnd = case
    n = 5
    table = {(t, j): rnd.sample(range(n), k) for t in token_ids for j in range(num_layers)}
    rows = [{"layer": j, "token_idx": t, "experts": e} for (t, j), e in table.items()]
    rnd.shuffle(rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        write_routing_jsonl(rows, path, num_experts=n)
        pages = load_routing_jsonl(path).pages.tolist()
    naive = [
        j * n + table[(t, j)][r]
        for t in sorted(token_ids)
        for r in range(k)
        for j in range(num_layers)
    ]
    assert pages == naive


# ------------------------------------------------------ module split and re-exported names


def test_the_format_names_are_the_package_s_and_trace_imports_no_format() -> None:
    """The formats' names come from their modules, and through ``prefixlab.experts``; the
    trace module no longer re-exports them (its lazy re-export tied the three modules into
    an import cycle, issue 19)."""
    import prefixlab.experts as experts

    assert experts.load_routing_jsonl is routing_jsonl.load_routing_jsonl
    assert experts.write_routing_jsonl is routing_jsonl.write_routing_jsonl is write_routing_jsonl
    assert experts.load_expert_trace is trace_io.load_expert_trace is load_expert_trace
    assert experts.save_trace is trace_io.save_trace and experts.load_trace is trace_io.load_trace
    assert trace_io.NPZ_FORMAT == "prefixlab-expert-trace"
    for name in ("EXPERT_KEYS", "load_routing_jsonl", "NPZ_FORMAT", "load_expert_trace"):
        assert not hasattr(trace, name), name
    source = Path(trace.__file__).read_text(encoding="utf-8")
    assert "routing_jsonl import" not in source and "trace_io import" not in source


# ---------------------------------------------------- damaged files give TraceFormatError


def _good_bytes(tmp_path: Path, name: str) -> bytes:
    save_trace(
        generate("uniform", num_layers=2, num_experts=4, num_tokens=200, seed=1), tmp_path / name
    )
    return (tmp_path / name).read_bytes()


def _damaged_npz(tmp_path: Path) -> dict[str, bytes]:
    good = _good_bytes(tmp_path, "good.npz")
    np.save(tmp_path / "lone.npy", np.arange(3))
    flipped = bytearray(good)
    flipped[60:90] = b"x" * 30  # inside the first member's deflate stream
    return {
        "empty": b"",
        "cut short": good[: len(good) // 2],
        "garbage": b"\x93NUMPY garbage",  # an .npy magic, then nonsense
        "corrupt deflate": bytes(flipped),
        "lone .npy": (tmp_path / "lone.npy").read_bytes(),
    }


@pytest.mark.parametrize("case", ["empty", "cut short", "garbage", "corrupt deflate", "lone .npy"])
def test_damaged_npz_is_a_trace_format_error(tmp_path: Path, case: str) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(_damaged_npz(tmp_path)[case])
    with pytest.raises(TraceFormatError, match=r"not a prefixlab expert trace \(\.npz\)") as err:
        load_expert_trace(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), None, None)


def test_npz_with_wrong_arrays_names_the_field(tmp_path: Path) -> None:
    tr = generate("uniform", num_layers=2, num_experts=4, num_tokens=3)
    save_trace(tr, tmp_path / "t.npz")
    arrays = dict(np.load(tmp_path / "t.npz"))
    for key, value in [
        ("num_layers", np.array([2, 2])),
        ("num_experts", np.array(2**63, dtype=np.uint64)),
        ("expert", np.array([0.5] * 6)),
        ("meta", np.array("[1, 2]")),
        ("meta", np.array("{oops")),
        ("gate", np.array(["a"] * 6)),
    ]:
        np.savez(tmp_path / "w.npz", **{**arrays, key: value})
        with pytest.raises(TraceFormatError) as err:
            load_trace(tmp_path / "w.npz")
        assert err.value.field == key


def _gzip_body(tmp_path: Path) -> bytes:
    return _good_bytes(tmp_path, "good.jsonl.gz")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (lambda good: good[: len(good) // 2], "truncated or corrupt gzip data after line"),
        (lambda good: b"\x1f\x8b garbage after the gzip magic", "truncated or corrupt gzip"),
        (lambda good: good[:40] + b"\xff" * 40 + good[80:], "truncated or corrupt gzip"),
    ],
    ids=["cut short", "bad header", "corrupt deflate"],
)
def test_damaged_gzip_is_a_trace_format_error(tmp_path: Path, data: object, match: str) -> None:
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(data(_gzip_body(tmp_path)))  # type: ignore[operator]
    with pytest.raises(TraceFormatError, match=match) as err:
        load_expert_trace(path)
    assert err.value.path == str(path) and err.value.line is None


def test_non_utf8_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\n" + b'{"layer": 1, "note": "caf\xe9"}\n')
    with pytest.raises(TraceFormatError, match="not UTF-8") as err:
        load_routing_jsonl(path)
    assert (err.value.line, err.value.field) == (3, None)
    assert f"{path}:3" in str(err.value)


@pytest.mark.parametrize("name", ["empty.npz", "half.jsonl.gz"])
def test_cli_reports_a_damaged_file_in_one_line_not_aborted(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"" if name.endswith(".npz") else _gzip_body(tmp_path)[:60])
    result = CliRunner().invoke(app, ["experts", "info", str(path)])
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert out.startswith("error:") and str(path) in out and "Aborted" not in out


# ------------------------------------------------------------ ids, inferred shape, header


def test_inferred_shape_above_the_limit_is_refused_with_advice(tmp_path: Path) -> None:
    huge = '{"layer": 0, "token_idx": 0, "topk_ids": [1, 1000000000000]}'
    with pytest.raises(TraceFormatError, match="pass num_experts or give it in a header") as err:
        load_routing_jsonl(_write(tmp_path, [GOOD.replace("[1, 2]", "[1, 3]"), huge]))
    assert (err.value.line, err.value.field) == (2, "topk_ids")
    deep = '{"layer": 5000000, "token_idx": 0, "experts": [1]}'
    with pytest.raises(TraceFormatError, match="pass num_layers") as err:
        load_routing_jsonl(_write(tmp_path, [deep]))
    assert (err.value.line, err.value.field) == (1, "layer")
    # given, the same ids are fine (and checked against the given n)
    tr = load_routing_jsonl(_write(tmp_path, [huge]), num_experts=10**12 + 1)
    assert tr.num_experts == 10**12 + 1 and tr.expert.tolist() == [1, 10**12]


def test_inferred_shape_limit_is_two_to_the_twenty(tmp_path: Path) -> None:
    limit = routing_jsonl.MAX_INFERRED
    assert limit == 2**20
    line = '{"layer": 0, "token_idx": 0, "experts": [%d]}'
    assert load_routing_jsonl(_write(tmp_path, [line % (limit - 1)])).num_experts == limit
    with pytest.raises(TraceFormatError, match=f"num_experts={limit + 1}"):
        load_routing_jsonl(_write(tmp_path, [line % limit]))


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ('{"format": "prefixlab-routing", "num_experts": 9223372036854775808}', "num_experts"),
        ('{"format": "prefixlab-routing", "num_layers": 0}', "num_layers"),
        ('{"format": "prefixlab-routing", "num_layers": 2, "meta": [1]}', "meta"),
    ],
)
def test_bad_header_names_the_field(tmp_path: Path, header: str, field: str) -> None:
    with pytest.raises(TraceFormatError) as err:
        load_routing_jsonl(_write(tmp_path, [header, GOOD]))
    assert (err.value.line, err.value.field) == (1, field)


def test_arguments_beyond_int64_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_experts must be a positive integer"):
        load_routing_jsonl(_write(tmp_path, HAND), num_experts=2**63)


def test_a_layer_missing_everywhere_is_inferred_away_but_a_gap_is_an_error(
    tmp_path: Path,
) -> None:
    no_last = [x for x in HAND if '"layer": 1' not in x]  # layer 1 absent from every token
    assert load_routing_jsonl(_write(tmp_path, no_last)).num_layers == 1  # documented
    with pytest.raises(TraceFormatError, match="token 0 has no line for layer 1"):
        load_routing_jsonl(_write(tmp_path, no_last), num_layers=2)
    gap = [x.replace('"layer": 1', '"layer": 2') for x in HAND]  # layers 0 and 2: l = 3
    with pytest.raises(TraceFormatError, match=r"token 0 has no line for layer 1 \(needs 0\.\.2\)"):
        load_routing_jsonl(_write(tmp_path, gap))


def test_a_huge_declared_layer_count_fails_fast_on_the_first_gap(tmp_path: Path) -> None:
    header = '{"format": "prefixlab-routing", "num_layers": 1000000000000}'
    with pytest.raises(TraceFormatError, match="token 0 has no line for layer 1 ") as err:
        load_routing_jsonl(_write(tmp_path, [header, GOOD]))
    assert err.value.field == "layer"


# ------------------------------------------------------------------------------ gate order


def test_a_line_out_of_gate_order_is_sorted_by_descending_gate(tmp_path: Path) -> None:
    lines = [
        '{"layer": 0, "token_idx": 0, "experts": [3, 1, 2], "gating_probs": [0.1, 0.6, 0.3]}',
        '{"layer": 1, "token_idx": 0, "experts": [0, 2, 1], "gating_probs": [0.2, 0.4, 0.4]}',
    ]
    tr = load_routing_jsonl(_write(tmp_path, lines))
    # rounds: rank 0 of both layers, then rank 1, then rank 2; the tie 0.4/0.4 keeps 2 before 1
    assert tr.expert.tolist() == [1, 2, 2, 1, 3, 0]
    assert tr.gate is not None and tr.gate.tolist() == [0.6, 0.4, 0.3, 0.4, 0.1, 0.2]
    assert load_routing_jsonl(_write(tmp_path, lines), top_k=1).expert.tolist() == [1, 2]


def test_writer_refuses_gates_that_grow_with_the_rank(tmp_path: Path) -> None:
    tr = generate("uniform", num_layers=2, num_experts=4, num_tokens=3, top_k=2)
    rising = ExpertTrace(2, 4, tr.expert, tr.token_idx, tr.rank, 0.2 + 0.5 * tr.rank)
    with pytest.raises(ConfigError, match="gates that do not grow with the rank"):
        write_routing_jsonl(rising, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


# ---------------------------------------------------------------------------- generators


def test_every_generator_is_registered_and_deterministic() -> None:
    assert set(EXPERT_GENERATORS) >= {"zipf", "uniform", "cyclic", "thm31", "thm33"}
    cases: list[tuple[str, dict[str, object]]] = [
        ("zipf", {"num_layers": 3, "num_tokens": 200, "r": 0.4, "c": 0.3, "top_k": 3}),
        ("uniform", {"num_layers": 3, "num_tokens": 200, "top_k": 2}),
    ]
    for kind, kw in cases:
        a, b = generate(kind, seed=9, **kw), generate(kind, seed=9, **kw)
        assert a.equals(b)
        assert not np.array_equal(a.expert, generate(kind, seed=10, **kw).expert)
        a.validate()


def _first_choice_ranks(tr: ExpertTrace) -> np.ndarray:
    """Popularity rank of each first choice, ``(token, layer)`` (traces made with seed 0)."""
    layout = zipf_layout(tr.num_layers, tr.num_experts, shuffle=True, seed=0)
    grid = tr.expert[tr.rank == 0].reshape(-1, tr.num_layers)
    ranks: np.ndarray = np.argsort(layout, axis=1)[np.arange(tr.num_layers), grid]
    return ranks


def test_zipf_frequencies_match_the_popularity_law() -> None:
    n, a, b = 8, 1.2, 0.5
    tr = generate("zipf", num_layers=2, num_experts=n, num_tokens=100_000, a=a, b=b)
    p = zipf_popularity(n, a, b)
    assert p[0] / p[1] == pytest.approx(((2 + b) / (1 + b)) ** a)
    ranks = _first_choice_ranks(tr)
    for j in range(2):
        freq = np.bincount(ranks[:, j], minlength=n) / ranks.shape[0]
        assert np.abs(freq - p).max() < 0.005
    # shuffle gives the layers different hot experts; without it expert e has rank e
    assert not np.array_equal(zipf_layout(2, n, shuffle=True, seed=0)[0], np.arange(n))
    plain = generate("zipf", num_layers=2, num_experts=n, num_tokens=1000, shuffle=False)
    assert np.bincount(plain.expert, minlength=n).argmax() == 0


def test_independent_draws_repeat_at_the_collision_rate() -> None:
    n, a = 6, 1.0
    tr = generate("zipf", num_layers=2, num_experts=n, num_tokens=100_000, a=a)
    ranks = _first_choice_ranks(tr)
    collide = float((zipf_popularity(n, a) ** 2).sum())
    assert (ranks[1:, 0] == ranks[:-1, 0]).mean() == pytest.approx(collide, abs=0.01)
    assert (ranks[:, 1] == ranks[:, 0]).mean() == pytest.approx(collide, abs=0.01)


def test_temporal_reuse_is_a_markov_stay_probability() -> None:
    n, r = 6, 0.6
    tr = generate("zipf", num_layers=2, num_experts=n, num_tokens=100_000, r=r)
    ranks = _first_choice_ranks(tr)
    collide = float((zipf_popularity(n, 1.0) ** 2).sum())
    repeat = (ranks[1:, 0] == ranks[:-1, 0]).mean()
    assert repeat == pytest.approx(r + (1 - r) * collide, abs=0.01)
    freq = np.bincount(ranks[:, 1], minlength=n) / ranks.shape[0]  # marginal stays Zipf
    assert np.abs(freq - zipf_popularity(n, 1.0)).max() < 0.02
    stay = generate("zipf", num_layers=4, num_experts=n, num_tokens=500, r=1.0, top_k=2)
    first = stay.expert[stay.rank == 0].reshape(-1, 4)
    assert (first == first[0]).all()
    assert len(set(stay.expert[stay.rank == 1].tolist())) > 1  # later choices still vary


def test_full_cross_layer_correlation_follows_the_rank_map() -> None:
    tr = generate("zipf", num_layers=5, num_experts=8, num_tokens=2000, c=1.0, seed=3)
    layout = zipf_layout(5, 8, shuffle=True, seed=3)
    link = cross_layer_map(layout)
    grid = tr.expert.reshape(-1, 5)
    for j in range(1, 5):
        assert np.array_equal(grid[:, j], link[j, grid[:, j - 1]])
    ranks = np.argsort(layout, axis=1)
    assert np.array_equal(ranks[4, grid[:, 4]], ranks[0, grid[:, 0]])  # same rank all along
    assert len(set(grid[:, 0].tolist())) > 1


def test_top_k_choices_are_distinct_and_follow_sampling_without_replacement() -> None:
    n, a = 5, 1.0
    tr = generate("zipf", num_layers=1, num_experts=n, num_tokens=60_000, top_k=3, a=a)
    grid = tr.expert.reshape(-1, 3)
    assert (np.sort(grid, axis=1)[:, 1:] != np.sort(grid, axis=1)[:, :-1]).all()
    assert tr.rank.tolist()[:6] == [0, 1, 2, 0, 1, 2]
    p = zipf_popularity(n, a)
    layout = zipf_layout(1, n, shuffle=True, seed=0)[0]
    second = np.argsort(layout)[grid[:, 1]]
    want = np.array([sum(p[f] * p[s] / (1 - p[f]) for f in range(n) if f != s) for s in range(n)])
    assert np.abs(np.bincount(second, minlength=n) / grid.shape[0] - want).max() < 0.01
    skewed = generate("zipf", num_layers=2, num_experts=6, num_tokens=300, top_k=6, a=6.0)
    assert (np.sort(skewed.expert.reshape(-1, 6, 2), axis=1) == np.arange(6)[:, None]).all()


def test_uniform_and_cyclic() -> None:
    uni = generate("uniform", num_layers=2, num_experts=4, num_tokens=40_000, top_k=2)
    freq = np.bincount(uni.pages, minlength=8) / uni.num_requests
    assert np.abs(freq - 1 / 8).max() < 0.01
    assert uni.meta["generator"] == "uniform"
    cyc = generate("cyclic", num_layers=3, num_experts=4, num_rounds=6)
    assert cyc.expert.reshape(-1, 3)[:, 0].tolist() == [0, 1, 2, 3, 0, 1]
    assert (cyc.expert.reshape(-1, 3) == cyc.expert.reshape(-1, 3)[:, :1]).all()


@pytest.mark.parametrize(("k", "l"), [(7, 4), (5, 2), (11, 3), (3, 4)])
def test_thm33_cycles_through_k_plus_1_pages(k: int, l: int) -> None:  # noqa: E741
    tr = generate("thm33", k=k, l=l, num_cycles=3)
    n = (k + 1) // l
    assert (tr.num_layers, tr.num_experts) == (l, n)
    assert tr.num_requests == 3 * (k + 1)
    period = tr.pages[: k + 1]
    assert sorted(period.tolist()) == list(range(k + 1))  # k + 1 distinct pages
    assert np.array_equal(tr.pages, np.tile(period, 3))
    tr.validate()


def test_thm33_rejects_a_layer_count_that_does_not_divide() -> None:
    with pytest.raises(ConfigError, match=r"\(k \+ 1\) % l == 0"):
        generate("thm33", k=6, l=4)


def test_thm31_one_layer_cycles_the_rest_stay() -> None:
    k, layers = 12, 3
    tr = generate("thm31", k=k, l=layers, num_rounds=50, layer=1)
    share = math.ceil(k / layers)
    grid = tr.expert.reshape(-1, layers)
    assert len(set(grid[:, 1].tolist())) == share + 1
    assert (grid[:, [0, 2]] == 0).all()
    assert len(set(tr.pages.tolist())) == share + layers <= k
    assert tr.num_experts == share + 1
    assert generate("thm31", k=k, l=layers, num_experts=16).num_experts == 16
    with pytest.raises(ConfigError, match="more than k"):
        generate("thm31", k=4, l=3)
    with pytest.raises(ConfigError, match="layer"):
        generate("thm31", k=8, l=2, layer=2)


@pytest.mark.parametrize(
    ("kind", "kw", "match"),
    [
        ("zipf", {"r": 1.5}, "r must be a probability"),
        ("zipf", {"c": -0.1}, "c must be >= 0"),
        ("zipf", {"top_k": 17}, "top_k=17 exceeds"),
        ("zipf", {"b": -1.0}, "b must be > -1"),
        ("zipf", {"num_tokens": 2.5}, "num_tokens must be an integer"),
        ("uniform", {"top_k": 0}, "top_k must be >= 1"),
    ],
)
def test_generator_parameter_errors(kind: str, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        generate(kind, **kw)


def test_zipf_a_spread_gives_each_layer_its_own_exponent() -> None:
    from prefixlab.experts.generators import (
        ZipfParams,
        generate,
        layer_exponents,
        zipf_popularity,
    )

    base = {"num_layers": 6, "num_experts": 8, "num_tokens": 20_000, "a": 1.0, "seed": 4}
    # a_spread = 0 is the plain generator, array for array
    plain = generate("zipf", **base).expert
    assert np.array_equal(generate("zipf", **base, a_spread=0.0).expert, plain)
    q = ZipfParams(**base, a_spread=2.0)
    a = layer_exponents(q)
    assert a.shape == (6,) and (a >= 0).all() and (a <= 3.0).all() and np.ptp(a) > 0.5
    assert np.array_equal(a, layer_exponents(q))  # seeded
    trace = generate("zipf", **base, a_spread=2.0, shuffle=False)
    grid = trace.expert.reshape(-1, 6)  # one row per token, one column per layer
    for j in range(6):
        freq = np.bincount(grid[:, j], minlength=8) / grid.shape[0]
        assert np.abs(freq - zipf_popularity(8, float(a[j]))).max() < 0.02, j
