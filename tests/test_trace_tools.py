"""`trace generate` and `trace convert`: written files reload to the same trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from prefixlab.cli import app
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import load_trace
from prefixlab.workload.generators import generate_sessions

runner = CliRunner()


def test_generate_writes_the_seeded_trace(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    res = runner.invoke(
        app, ["trace", "generate", "sessions", "--seed", "4", "--num-sessions", "12",
              "-o", str(out)],
    )  # fmt: skip
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
