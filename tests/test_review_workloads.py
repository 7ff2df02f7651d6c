"""Regressions from the review of the workload layer: bad input gets a one-line error that
names the file (and line and field where there is one); out-of-order files are sorted;
measured think times never shorten open-loop gaps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli import app
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload.arrivals import make_arrivals
from prefixlab.workload.loaders import _jsonstream, load_trace, write_parquet
from prefixlab.workload.loaders.native import write_native

runner = CliRunner()


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("native", "t.jsonl"), ("mooncake", "m.jsonl"), ("sharegpt", "c.json"),
     ("swe-agent", "x.traj"), ("azure", "a.csv")],
)  # fmt: skip
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
    n = _jsonl(tmp_path / "n.jsonl", [{"input_tokens": [1], "output_length": 0}])
    n.write_text(n.read_text().replace("}", ', "think_s": 1e400}'))
    with pytest.raises(TraceFormatError, match="'think_s': must be a finite"):
        load_trace(n)


def test_native_unknown_field_is_named(tmp_path: Path) -> None:
    p = _jsonl(tmp_path / "t.jsonl", [{"input_tokens": [1, 2], "output_length": 1,
                                        "sesion_id": "s"}])  # fmt: skip
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: field 'sesion_id': unknown field"):
        load_trace(p)


def test_out_of_order_marconi_is_sorted_and_converts(tmp_path: Path) -> None:
    rows = [
        {"session_id": "a", "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2], "output_tokens": [3]},
        {"session_id": "a", "turn_id": 1, "ts": 10.0, "input_tokens": [1, 2, 3, 4],
         "output_tokens": [5]},
        {"session_id": "b", "turn_id": 0, "ts": 2.0, "input_tokens": [9], "output_tokens": [8]},
    ]  # fmt: skip
    tr = load_trace(_jsonl(tmp_path / "m.jsonl", rows), "marconi")
    assert tr.arrival_s.tolist() == [0.0, 2.0, 10.0]
    assert tr.session_id == ["a", "b", "a"]
    out = tmp_path / "native.jsonl"
    write_native(tr, out)
    assert load_trace(out).arrival_s.tolist() == [0.0, 2.0, 10.0]  # the native order check holds


def test_azure_row_before_the_first_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:40.0000000,10,4\n"
    )
    with pytest.raises(TraceFormatError, match=r"a\.csv:3: field 'TIMESTAMP': .* precedes"):
        load_trace(p, "azure")


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
    body = ",\n".join([json.dumps(good), '{"id": "bad", "conversations": [nope]}'] +
                      [json.dumps(good)] * 2000)  # fmt: skip
    p = tmp_path / "big.json"
    p.write_text("[\n" + body + "\n]\n")
    with pytest.raises(TraceFormatError, match=r"big\.json:3: bad JSON"):
        load_trace(p, "sharegpt", tokenizer="bytes")
    assert p.stat().st_size > 150_000 and fills < 10  # ~2 chunks, not ~600


def test_lone_surrogates_in_text_are_replaced(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text('[{"conversations": [{"from": "human", "value": "a\\ud800b"}]}]')
    for tok in ("bytes", "llama3"):
        tr = load_trace(p, "sharegpt", tokenizer=tok)
        assert tr.prompt_text == ["a\ud800b"]  # the text is kept as written
    tr = load_trace(p, "sharegpt", tokenizer="bytes")
    assert bytes(tr[0].input_tokens).endswith("a\ufffdb\n".encode())  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", ["abc", -1, 1.5, True])
def test_bad_loader_seed_is_a_config_error(seed: object) -> None:
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        load_trace(Path(__file__), "sharegpt", seed=seed)


@pytest.mark.parametrize(
    "spec", ["sessions:closed_loop=maybe", "lpc:closed_loop=1", "sessions:gap_sigma=inf"]
)
def test_arrival_spec_values_are_checked(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"closed_loop must be true or false|finite"):
        make_arrivals(spec)


@pytest.mark.parametrize(("opt", "value"), [("start_s", float("nan")), ("end_s", float("inf"))])
def test_window_bounds_must_be_finite(tmp_path: Path, opt: str, value: float) -> None:
    p = _jsonl(tmp_path / "t.jsonl", [{"input_tokens": [1], "output_length": 0}])
    with pytest.raises(ConfigError, match=f"{opt} must be a finite number"):
        load_trace(p, **{opt: value})  # type: ignore[arg-type]


def test_parquet_errors_name_the_column(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
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


def test_open_loop_agent_gaps_are_drawn_closed_loop_are_measured() -> None:
    """Open loop: the drawn agentic gap, floored by the tool's time; closed loop: the tool's."""
    model = make_arrivals("sessions:preset=agentic")
    rng = np.random.default_rng(1)
    times, thinks = model.schedule(4, rng, known=[None, 0.2, None, 50.0])
    assert thinks[1] == 0.2 and thinks[3] == 50.0
    gaps = np.diff(times)
    assert gaps[0] >= 0.2 and gaps[2] >= 50.0 - 1e-9
    assert gaps[1] == thinks[2]  # no known time: the drawn gap is both
