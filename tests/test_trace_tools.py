"""`trace generate` (every generator, its options and its errors) and `trace convert`:
written files reload to the same trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import load_trace
from prefixlab.workload.generators import GENERATORS, generate_lpc, generate_sessions
from tests.helpers import content_equal

runner = CliRunner()


def test_generate_writes_the_seeded_trace(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    res = runner.invoke(
        app,
        ["trace", "generate", "sessions", "--seed", "4", "--num-sessions", "12", "-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    back = load_trace(out)
    want = generate_sessions(num_sessions=12, seed=4)
    assert len(back) == len(want) and back[5] == want[5]
    assert np.array_equal(back.arrival_s, want.arrival_s)


def test_convert_mooncake_to_native_keeps_replay_results(
    tmp_path: Path, mooncake_path: Path
) -> None:
    out = tmp_path / "m.jsonl"
    res = runner.invoke(
        app, ["trace", "convert", str(mooncake_path), "-f", "mooncake", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    original = load_trace(mooncake_path, "mooncake", limit=1500)
    converted = load_trace(out, limit=1500)
    cfg = ReplayConfig(capacity_blocks=3000)
    a, b = replay(original, "vllm", cfg), replay(converted, "vllm", cfg)
    assert np.array_equal(a.hit_tokens, b.hit_tokens) and a.metrics["num_hit_tokens"] > 0


def test_convert_errors_are_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["trace", "convert", "gen:sessions", "-o", "/nonexistent/x.jsonl"])
    assert res.exit_code == 2 and "does not exist" in res.stderr
    res = runner.invoke(app, ["trace", "generate", "nope", "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "No such command 'nope'" in res.output
    assert not (tmp_path / "x.jsonl").exists()


CLI_CASES: list[tuple[str, list[str], dict[str, Any]]] = [
    (
        "sessions",
        [
            "--num-sessions",
            "20",
            "--system-tokens",
            "8",
            "--preset",
            "agentic",
            "--closed-loop",
            "--gap-mu",
            "-0.5",
            "--seed",
            "3",
        ],
        {
            "num_sessions": 20,
            "system_tokens": 8,
            "preset": "agentic",
            "closed_loop": True,
            "gap_mu": -0.5,
            "seed": 3,
        },
    ),
    (
        "lpc",
        [
            "--num-conversations",
            "15",
            "--n-conv",
            "3",
            "--lambda-chat",
            "7.5",
            "--closed-loop",
            "--mean-output-tokens",
            "9",
            "--seed",
            "2",
        ],
        {
            "num_conversations": 15,
            "n_conv": 3,
            "lambda_chat": 7.5,
            "closed_loop": True,
            "mean_output_tokens": 9,
            "seed": 2,
        },
    ),
    (
        "templated",
        [
            "--num-requests",
            "30",
            "--task-weights",
            "1,0,2,1",
            "--templates-per-task",
            "3",
            "--document-tokens",
            "40",
            "--seed",
            "8",
        ],
        {
            "num_requests": 30,
            "task_weights": "1,0,2,1",
            "templates_per_task": 3,
            "document_tokens": 40,
            "seed": 8,
        },
    ),
    (
        "mix",
        [
            "--trace",
            "2",
            "--num-requests",
            "40",
            "--agentic-fraction",
            "0.7",
            "--multi-turn-fraction",
            "0.6",
            "--system-tokens",
            "8",
            "--seed",
            "5",
        ],
        {
            "trace": 2,
            "num_requests": 40,
            "agentic_fraction": 0.7,
            "multi_turn_fraction": 0.6,
            "system_tokens": 8,
            "seed": 5,
        },
    ),
    (
        "random-pool",
        [
            "--num-requests",
            "50",
            "--p",
            "0.3",
            "--pool-size",
            "4",
            "--prompt-tokens",
            "7",
            "--seed",
            "6",
        ],
        {"num_requests": 50, "p": 0.3, "pool_size": 4, "prompt_tokens": 7, "seed": 6},
    ),
]


@pytest.mark.parametrize(("kind", "args", "kwargs"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_generate_writes_the_generated_trace(
    tmp_path: Path, kind: str, args: list[str], kwargs: dict[str, Any]
) -> None:
    out = tmp_path / f"{kind}.jsonl"
    res = runner.invoke(app, ["trace", "generate", kind, "-o", str(out), *args])
    assert res.exit_code == 0, res.stderr
    want = GENERATORS[kind].fn(**kwargs)
    assert f"wrote {len(want):,} requests" in res.stdout
    got = load_trace(out)
    assert content_equal(got, want)
    if kwargs.get("closed_loop"):
        assert (~np.isnan(got.think_s)).sum() > 0


def test_cli_generate_parquet_and_no_closed_loop(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "x.parquet"
    args = ["--num-conversations", "12", "--closed-loop", "--seed", "4"]
    res = runner.invoke(app, ["trace", "generate", "lpc", "-o", str(out), *args])
    assert res.exit_code == 0, res.stderr
    assert out.read_bytes()[:4] == b"PAR1"
    want = generate_lpc(num_conversations=12, closed_loop=True, seed=4)
    got = load_trace(out, "parquet")
    assert content_equal(got, want)
    assert not np.isnan(got.think_s).all()
    # --no-closed-loop: no think times at all.
    out2 = tmp_path / "y.jsonl"
    res = runner.invoke(
        app,
        [
            "trace",
            "generate",
            "sessions",
            "-o",
            str(out2),
            "--num-sessions",
            "10",
            "--no-closed-loop",
        ],
    )
    assert res.exit_code == 0, res.stderr
    got2 = load_trace(out2)
    assert np.isnan(got2.think_s).all()
    assert content_equal(got2, generate_sessions(num_sessions=10))


@pytest.mark.parametrize(
    ("kind", "args", "name"),
    [
        ("random-pool", ["--p", "1.5"], "p must be"),
        ("mix", ["--trace", "9"], "trace must be"),
        ("lpc", ["--n-conv", "0"], "n_conv must be"),
        ("sessions", ["--preset", "slow"], "preset 'slow'"),
        ("templated", ["--task-weights", "1,2"], "task_weights"),
    ],
)
def test_cli_generate_bad_value_exits_2_without_file(
    tmp_path: Path, kind: str, args: list[str], name: str
) -> None:
    out = tmp_path / "bad.jsonl"
    res = runner.invoke(app, ["trace", "generate", kind, "-o", str(out), *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert name in lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    assert list(tmp_path.iterdir()) == []


def test_cli_error_echoes_the_value_verbatim(tmp_path: Path) -> None:
    out = tmp_path / "bad.jsonl"
    args = ["trace", "generate", "templated", "-o", str(out), "--task-weights", "[x]1"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "'[x]1'" in res.stderr
