"""`trace stats`: summary numbers and the infinite-cache hit ratio against brute force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.analysis import trace_stats
from prefixlab.cli.main import app
from prefixlab.workload import load_trace
from prefixlab.workload.generators import generate_sessions


def brute_force_ceiling(path: Path, block_tokens: int = 512) -> tuple[int, int]:
    """Hit tokens with a cache that keeps everything, from the raw JSON and a Python set."""
    seen: set[int] = set()
    hit = total = 0
    for line in path.open():
        req = json.loads(line)
        n, ids = req["input_length"], req["hash_ids"]
        lookups = min(n // block_tokens, (n - 1) // block_tokens)
        k = 0
        while k < lookups and ids[k] in seen:
            k += 1
        hit += k * block_tokens
        total += n
        seen.update(ids[: n // block_tokens])  # full input blocks are cached
    return hit, total


def test_mooncake_ceiling_matches_brute_force(mooncake_path: Path) -> None:
    stats = trace_stats(load_trace(mooncake_path, "mooncake"))
    hit, total = brute_force_ceiling(mooncake_path)
    assert stats["num_input_tokens"] == total == 144_793_823
    assert stats["infinite_cache_token_hit_ratio"] == hit / total
    assert hit == 54_063_104
    assert stats["num_requests"] == 12031 and stats["block_tokens"] == 512


def test_stats_of_generated_sessions() -> None:
    tr = generate_sessions(num_sessions=25, seed=9)
    stats = trace_stats(tr, 16)
    assert stats["num_sessions"] == 25
    assert stats["tasks"] == {"chat": len(tr)}
    assert stats["input_length"]["max"] == float(tr.input_length.max())
    assert stats["arrival_span_s"] == pytest.approx(float(tr.arrival_s[-1] - tr.arrival_s[0]))
    assert stats["request_rate_per_s"] == pytest.approx((len(tr) - 1) / stats["arrival_span_s"])
    assert 0.5 < stats["infinite_cache_token_hit_ratio"] < 1.0  # multi-turn: mostly reused


def test_trace_stats_cli() -> None:
    res = CliRunner().invoke(app, ["trace", "stats", "gen:sessions:num_sessions=10", "--json"])
    assert res.exit_code == 2 and "--block-tokens" in res.stderr
    res = CliRunner().invoke(
        app, ["trace", "stats", "gen:sessions:num_sessions=10", "--block-tokens", "16", "--json"]
    )
    assert res.exit_code == 0
    stats = json.loads(res.stdout)
    assert stats["num_requests"] == len(generate_sessions(num_sessions=10))
    assert set(stats["input_length"]) == {"mean", "p5", "p50", "p95", "p99", "max"}
