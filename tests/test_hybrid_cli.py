"""The hybrid cache from the command line and in experiments (issue 6)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.experiments import parse_config, run_sweep
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.workload.generators import GENERATORS

runner = CliRunner()
GEN = "gen:sessions:num_sessions=30,preset=agentic"
HYBRID = ["--structure", "hybrid", "--model", "marconi-7b-hybrid"]


def test_replay_hybrid_json_and_per_request(tmp_path: Path) -> None:
    out = tmp_path / "per.csv"
    result = runner.invoke(
        app,
        [
            "replay",
            GEN,
            *HYBRID,
            "--capacity-bytes",
            "8000000000",
            "-p",
            "vllm+",
            "-p",
            "sglang+",
            "-p",
            "marconi:alpha=1.0",
            "--json",
            "--per-request",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["policy"] for r in rows] == ["vllm+", "sglang+", "marconi:alpha=1"]
    trace = GENERATORS["sessions"].fn(num_sessions=30, preset="agentic")
    for row in rows:
        assert row["structure"] == "hybrid" and row["model"] == "marconi-hybrid-7b"
        split = sum(row[f"flops_saved_{t}"] for t in ("attention", "mlp", "moe", "ssm"))
        assert split == pytest.approx(row["flops_saved"], rel=1e-12)
        assert row["flops_saved_ssm"] > 0 and row["flops_saved_moe"] == 0
        assert row["state_bytes_per_checkpoint"] == 26_787_840
        # the CLI adds nothing: a direct replay gives the same hits
        direct = replay_hybrid(trace, row["policy"], HybridConfig(8_000_000_000))
        assert direct.metrics["num_hit_tokens"] == row["num_hit_tokens"]
    # several policies: one CSV each, named after the policy
    files = sorted(tmp_path.glob("per.*.csv"))
    assert len(files) == 3
    with files[0].open() as fh:
        lines = list(csv.reader(fh))
    assert lines[0] == ["index", "hit_tokens", "input_tokens"] and len(lines) == len(trace) + 1
    # vLLM+'s state every 32 tokens cannot compete with judicious admission here
    assert rows[0]["token_hit_ratio"] < rows[1]["token_hit_ratio"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-p", "marconi", "--capacity-blocks", "100", "--model", "marconi-hybrid-7b"],
            "capacity is in bytes",
        ),
        (["-p", "marconi", "--capacity-bytes", "1000000000"], "needs --model and --capacity-bytes"),
        (
            ["-p", "lru", "--capacity-bytes", "1000000000", "--model", "marconi-hybrid-7b"],
            "policy 'lru' does not apply to the hybrid structure",
        ),
        (
            [
                "-p",
                "marconi:alpha=-1",
                "--capacity-bytes",
                "1000000000",
                "--model",
                "marconi-hybrid-7b",
            ],
            "alpha must be a finite number >= 0",
        ),
    ],
)
def test_replay_hybrid_errors_are_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["replay", GEN, "--structure", "hybrid", *args])
    assert result.exit_code == 2
    out = result.output.strip()
    assert len(out.splitlines()) == 1 and message in out, out


def test_hash_form_trace_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n'
    )
    result = runner.invoke(
        app,
        [
            "replay",
            str(trace),
            "--format",
            "mooncake",
            *HYBRID,
            "--capacity-bytes",
            "10000000000",
            "-p",
            "marconi:alpha=1",
        ],
    )
    assert result.exit_code == 2 and "needs token ids" in result.output


def test_hybrid_sweep_rows(tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "workload": {"source": "gen:sessions", "params": {"num_sessions": 20}},
            "model": {"name": "marconi-hybrid-7b", "gpu": "h100"},
            "cache": {"structure": "hybrid", "capacities": ["2GB", 4_000_000_000, "0.1A"]},
            "policies": ["sglang+", "marconi:alpha=1"],
        }
    )
    run_sweep(cfg, tmp_path)
    rows = pq.read_table(tmp_path / "results.parquet").to_pylist()
    assert [r["capacity_bytes"] for r in rows[:4:2]] == [2_000_000_000, 4_000_000_000]
    assert all(r["structure"] == "hybrid" and r["capacity_blocks"] == -1 for r in rows)
    trace = GENERATORS["sessions"].fn(num_sessions=20, seed=0)
    direct = replay_hybrid(trace, "marconi:alpha=1", HybridConfig(4_000_000_000))
    row = next(r for r in rows if r["capacity"] == "4000000000" and r["policy"].startswith("m"))
    assert row["num_hit_tokens"] == direct.metrics["num_hit_tokens"]
    assert row["flops_saved"] == direct.metrics["flops_saved"]
    # 0.1A: a tenth of an H100's memory left after the 7B hybrid's weights
    from prefixlab.model import get_model
    from prefixlab.model.timing import get_gpu

    spec = get_model("marconi-hybrid-7b")
    free = get_gpu("h100").mem_bytes - spec.num_parameters * spec.dtype_bytes
    assert rows[-1]["capacity_bytes"] == int(0.1 * free)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"runner": {"kind": "engine"}}, "needs model.timing, or model.name and model.gpu"),
        ({"cache": {"structure": "hybrid", "capacities": ["0.5A"]}}, "model.gpu"),
        ({"model": {}}, "needs model.name"),
        ({"cache": {"structure": "hybrid", "capacities": ["0.5ws"]}}, "capacity is bytes"),
        ({"policies": ["lru"]}, "does not apply to the hybrid structure"),
    ],
)
def test_hybrid_config_errors(patch: dict[str, object], message: str) -> None:
    data: dict[str, object] = {
        "workload": {"source": "gen:sessions"},
        "model": {"name": "marconi-hybrid-7b"},
        "cache": {"structure": "hybrid", "capacities": ["10GB"]},
        "policies": ["marconi"],
    }
    data.update(patch)
    with pytest.raises(ConfigError, match=message):
        parse_config(data)
