"""Fleet sizing (prefixlab.experiments.sizing, ``prefixlab plan``): the search by hand, the
answer against a scan of every replica count, the curve against CPU pool size against
fleets simulated on their own, the figure, the command, the errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.experiments.sizing import _smallest, cpu_curve, size_fleet
from prefixlab.model.timing import make_timing
from prefixlab.report.sizing import sizing_png
from prefixlab.runner.engine import EngineConfig
from prefixlab.runner.engine.tiers import TierConfig
from prefixlab.runner.fleet import FleetConfig, simulate_fleet
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.sources import retimed

TIMING = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.02")
CFG = EngineConfig(capacity_blocks=3000, block_tokens=16, model="llama-3.1-8b")


def _search(threshold: int, limit: int) -> tuple[int | None, list[int]]:
    tried: list[int] = []

    def meets(n: int) -> bool:
        tried.append(n)
        return n >= threshold

    return _smallest(meets, limit), tried


def test_the_search_doubles_then_bisects() -> None:
    assert _search(5, 64) == (5, [1, 2, 4, 8, 6, 5])
    assert _search(1, 64) == (1, [1])
    assert _search(8, 64) == (8, [1, 2, 4, 8, 6, 7])
    assert _search(3, 3) == (3, [1, 2, 3])
    assert _search(5, 3) == (None, [1, 2, 3])  # the limit is tried, once
    assert _search(40, 40) == (40, [1, 2, 4, 8, 16, 32, 40, 36, 38, 39])


def _busy() -> object:
    """300 chat sessions at ten times their rate: one replica cannot keep up."""
    trace = generate_sessions(num_sessions=150, seed=2, session_rate_per_s=8.0)
    return retimed(trace, time_scale=0.1)


def test_the_answer_is_the_first_count_that_meets_the_target() -> None:
    """Against a scan of every count: the answer is the first that meets the target, the
    one before it misses, and every point reported is the fleet's own result."""
    trace = _busy()
    slo = 0.5
    sizing = size_fleet(
        trace,  # type: ignore[arg-type]
        "lru",
        CFG,
        TIMING,
        routers=["round-robin", "least-loaded"],
        setups=[("none", ())],
        slo_p95_ttft_s=slo,
        max_replicas=16,
        curve=[1, 2, 3, 4, 5, 6, 7, 8],
    )
    for router in ("round-robin", "least-loaded"):
        scan = {
            p.replicas: p.p95_ttft_s for p in sizing.points if p.router == router
        }  # the curve: every count 1-8, simulated once each
        assert sorted(scan) == list(range(1, 9))
        first = min(n for n, p95 in scan.items() if p95 <= slo)
        assert sizing.answers[(router, "none")] == first
        assert first > 1 and scan[first - 1] > slo
        again = simulate_fleet(trace, "lru", CFG, FleetConfig(first, router), TIMING)  # type: ignore[arg-type]
        assert again.engine.metrics["p95_ttft_s"] == scan[first]
    assert sizing_png(sizing, "t")[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_target_no_count_meets_is_none() -> None:
    sizing = size_fleet(
        _busy(),  # type: ignore[arg-type]
        "lru",
        CFG,
        TIMING,
        routers=["round-robin"],
        setups=[("none", ())],
        slo_p95_ttft_s=1e-6,
        max_replicas=3,
    )
    assert sizing.answers == {("round-robin", "none"): None}
    assert [p.replicas for p in sizing.points] == [1, 2, 3]
    assert np.isnan(sizing.answer_rows()[0]["p95_ttft_s"])  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slo_p95_ttft_s": 0.0}, "positive number"),
        ({"max_replicas": 0}, "max_replicas must be an integer >= 1"),
        ({"routers": ["nearest"]}, "unknown router 'nearest'"),
        ({"curve": [0]}, "replica counts must be integers >= 1"),
    ],
)
def test_bad_sizing_arguments_are_named(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "routers": ["round-robin"],
        "setups": [("none", ())],
        "slo_p95_ttft_s": 1.0,
        **kwargs,
    }
    with pytest.raises(ConfigError, match=message):
        size_fleet(_busy(), "lru", CFG, TIMING, **args)  # type: ignore[arg-type]


def test_the_plan_command(tmp_path: Path) -> None:
    args = ["plan", "gen:sessions:num_sessions=150,seed=2,session_rate_per_s=8"]
    args += ["--time-scale", "0.1", "--block-tokens", "16", "--capacity-blocks", "3000"]
    args += ["--model", "llama-3.1-8b", "--timing", "power:preset=llama-3.1-8b-h100+tpot:s=0.02"]
    args += ["--slo-p95-ttft", "0.5", "--tiers", "none", "--tiers", "cpu:blocks=20000"]
    png = tmp_path / "plan.png"
    out = CliRunner().invoke(app, [*args, "--json", "--quiet", "--plot", str(png)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert [a["tiers"] for a in doc["answers"]] == ["none", "cpu:blocks=20000"]
    for answer in doc["answers"]:
        n = answer["replicas"]
        assert answer["p95_ttft_s"] <= 0.5
        misses = [p for p in doc["points"] if p["tiers"] == answer["tiers"] and not p["meets"]]
        assert max(p["replicas"] for p in misses) == n - 1
    assert png.read_bytes()[:4] == b"\x89PNG"
    table = CliRunner().invoke(app, [*args, "--quiet"])
    assert table.exit_code == 0 and "replicas needed for P95 TTFT <= 0.5 s" in table.output
    bad = CliRunner().invoke(app, [*args, "--curve", "1,x"])
    assert bad.exit_code == 2 and "'x' is not a replica count" in bad.output


def test_the_cpu_size_curve_is_each_size_s_own_fleet() -> None:
    """Each point of the curve against CPU pool size is the fleet with that pool, simulated
    on its own; the points stay out of the search's."""
    trace = _busy()
    sizing = size_fleet(
        trace,  # type: ignore[arg-type]
        "lru",
        CFG,
        TIMING,
        routers=["round-robin"],
        setups=[("none", ())],
        slo_p95_ttft_s=0.5,
        max_replicas=8,
    )
    searched = list(sizing.points)
    cpu_curve(trace, "lru", CFG, TIMING, sizing, routers=["round-robin"], cpu_gb=[0, 8], replicas=2)  # type: ignore[arg-type]
    assert sizing.points == searched
    assert [(p.cpu_gb, p.tiers, p.replicas) for p in sizing.cpu_points] == [
        (0.0, "none", 2),
        (8.0, "cpu:size=8GB", 2),
    ]
    blocks = 8 * 10**9 // (32 * 8 * 128 * 2 * 2 * 16)  # 8 GB of 2 MiB blocks
    for point, tiers in zip(sizing.cpu_points, [(), (TierConfig("cpu", blocks),)], strict=True):
        cfg = dataclasses.replace(CFG, tiers=tiers)
        m = simulate_fleet(trace, "lru", cfg, FleetConfig(2), TIMING).engine.metrics  # type: ignore[arg-type]
        assert (point.p95_ttft_s, point.token_hit_ratio) == (m["p95_ttft_s"], m["token_hit_ratio"])
    assert sizing.cpu_points[1].token_hit_ratio > sizing.cpu_points[0].token_hit_ratio
    assert sizing_png(sizing, "t")[:4] == b"\x89PNG"
    with pytest.raises(ConfigError, match="must be >= 0 GB"):
        cpu_curve(
            trace, "lru", CFG, TIMING, sizing, routers=["round-robin"], cpu_gb=[-1], replicas=2
        )  # type: ignore[arg-type]


def test_the_plan_command_draws_the_cpu_curve(tmp_path: Path) -> None:
    args = ["plan", "gen:sessions:num_sessions=60,seed=2,session_rate_per_s=8"]
    args += ["--time-scale", "0.1", "--block-tokens", "16", "--capacity-blocks", "3000"]
    args += ["--model", "llama-3.1-8b", "--timing", "power:preset=llama-3.1-8b-h100+tpot:s=0.02"]
    args += ["--slo-p95-ttft", "0.5", "--cpu-sizes", "0,8", "--at-replicas", "2"]
    out = CliRunner().invoke(app, [*args, "--json", "--plot", str(tmp_path / "p.png")])
    assert out.exit_code == 0, out.output
    curve = json.loads(out.output)["cpu_curve"]
    assert [(p["cpu_gb"], p["replicas"]) for p in curve] == [(0.0, 2), (8.0, 2)]
    assert (tmp_path / "p.png").stat().st_size > 1000
    bad = CliRunner().invoke(app, [*args, "--cpu-sizes", "0,lots"])
    assert bad.exit_code == 2 and "'lots' is not a size in GB" in bad.output
