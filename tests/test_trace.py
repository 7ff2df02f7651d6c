"""Block layout arithmetic and the trace model (workload/trace.py): the lookup cap, held
blocks, hash-form keys, validation of library traces, take and stable sorting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.errors import ConfigError
from prefixlab.workload import Request, Trace
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.trace import TraceBuilder, to_hash_form
from tests.helpers import assert_identical

runner = CliRunner()


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


# ------------------------------------------------------------------ retiming
def _hash_trace() -> Trace:
    reqs = [
        Request(
            arrival_s=10.0 + 2.0 * i, input_length=32, output_length=4, hash_ids=[i % 3, 10 + i]
        )
        for i in range(6)
    ]
    reqs[2] = Request(14.0, 32, 4, hash_ids=[2, 12], session_id="s", turn=1, think_s=3.0)
    return Trace.from_requests(reqs, block_tokens=16)


def test_time_scale_stretches_gaps_and_keeps_content() -> None:
    tr = _hash_trace()
    half = tr.time_scaled(0.5)
    assert half.arrival_s.tolist() == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]  # from the first
    assert half.think_s[2] == 1.5 and np.isnan(half.think_s[0])
    assert tr.arrival_s.tolist() == [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]  # a new trace
    a, b = tr.block_layout(), half.block_layout()
    assert a.keys.tolist() == b.keys.tolist() and half.is_hash_form
    assert tr.request_rate() == pytest.approx(0.5) and half.request_rate() == pytest.approx(1.0)


def test_retimed_to_a_request_rate() -> None:
    from prefixlab.workload.sources import retimed

    tr = _hash_trace()
    assert retimed(tr) is tr
    fast = retimed(tr, request_rate=5.0)
    assert fast.request_rate() == pytest.approx(5.0)
    assert retimed(tr, time_scale=3.0).arrival_s[-1] == pytest.approx(40.0)
    for kwargs, words in (
        ({"time_scale": 1.0, "request_rate": 1.0}, "not both"),
        ({"time_scale": 0.0}, "time_scale must be a positive number, got 0.0"),
        ({"request_rate": -2}, "request_rate must be a positive number, got -2"),
        ({"time_scale": float("inf")}, "time_scale must be a positive number"),
    ):
        with pytest.raises(ConfigError, match=words):
            retimed(tr, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="span no time"):
        retimed(tr.take([0]), request_rate=1.0)


def test_every_source_retimes_from_the_command_line(tmp_path: Path) -> None:
    from prefixlab.cli.main import app
    from prefixlab.workload.loaders.write import write_trace
    from prefixlab.workload.sources import open_trace

    path = tmp_path / "t.jsonl"
    write_trace(_hash_trace(), path)
    assert open_trace(str(path), request_rate=2.0).request_rate() == pytest.approx(2.0)
    gen = "gen:sessions:num_sessions=5,seed=1"
    base, slow = open_trace(gen), open_trace(gen, time_scale=4.0)
    assert slow.request_rate() == pytest.approx(base.request_rate() / 4)
    out = CliRunner().invoke(app, ["trace", "stats", str(path), "--request-rate", "0"])
    assert out.exit_code == 2 and "request_rate must be a positive number" in out.output
