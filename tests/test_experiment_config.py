"""Experiment configs (issue 5, first part): TOML/YAML parsing, validation naming the key,
capacity resolution (blocks, fraction of the working set, UniCache's fraction A)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from prefixlab.errors import ConfigError
from prefixlab.experiments import load_config, parse_config, resolve_capacity
from prefixlab.experiments.config import available_kv_bytes
from prefixlab.model import get_model
from prefixlab.model.timing import get_gpu

TOML = """
name = "demo"
policies = ["lru", "s3fifo:small_ratio=0.1", "opt"]
seeds = [0, 1]

[workload]
source = "gen:mix"
params = { trace = 2, num_requests = 500 }

[model]
name = "llama-3.1-8b"
gpu = "h100"
timing = ["power:preset=llama-3.1-8b-h100", "tpot:s=0.02"]

[cache]
structure = "block"
block_tokens = 16
capacities = [2000, "0.5ws", "0.7A"]

[runner]
kind = "engine"
max_num_seqs = 64
"""


def test_toml_config_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "exp.toml"
    p.write_text(TOML)
    cfg = load_config(p)
    assert cfg.name == "demo" and cfg.seeds == [0, 1]
    assert cfg.policies == ["lru", "s3fifo:small_ratio=0.1", "opt"]
    assert cfg.workload.source == "gen:mix" and cfg.workload.params == {
        "trace": 2,
        "num_requests": 500,
    }
    assert cfg.cache.capacities == [2000, "0.5ws", "0.7A"] and cfg.cache.block_tokens == 16
    assert cfg.runner.kind == "engine" and cfg.runner.max_num_seqs == 64
    assert cfg.runner.max_num_batched_tokens == 8192  # default filled in
    out = cfg.write_resolved(tmp_path)
    resolved = json.loads(out.read_text())
    assert resolved["runner"]["max_num_batched_tokens"] == 8192
    assert resolved["model"]["timing"] == ["power:preset=llama-3.1-8b-h100", "tpot:s=0.02"]


def test_yaml_config_is_accepted(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    import tomllib

    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(tomllib.loads(TOML)))
    assert load_config(p) == load_config(_write(tmp_path / "exp.toml", TOML))


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def _base() -> dict[str, object]:
    return {
        "workload": {"source": "gen:sessions"},
        "cache": {"capacities": [100]},
        "policies": ["lru"],
    }


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"polices": ["lru"]}, "config key 'polices' unknown"),
        (
            {"cache": {"capacities": [100], "blocktokens": 16}},
            "config key 'cache.blocktokens' unknown",
        ),
        ({"cache": {"capacities": [100, "half"]}}, "cache.capacities[1]: 'half' is not a capacity"),
        ({"cache": {"capacities": [100, "1.5ws"]}}, "cache.capacities[1]"),
        ({"cache": {"capacities": [0]}}, "must be positive"),
        ({"cache": {"capacities": []}}, "cache.capacities: expected a non-empty list"),
        ({"cache": {"capacities": [100], "structure": "tree"}}, "cache.structure: 'tree' unknown"),
        ({"policies": ["lru", "nope"]}, "policies[1]: unknown policy 'nope'"),
        ({"policies": []}, "policies: expected a non-empty list"),
        ({"seeds": [-1]}, "seeds[0]: expected a value >= 0, got -1"),
        ({"seeds": []}, "seeds: expected a non-empty list, got []"),
        ({"seeds": [True]}, "seeds[0]: expected an integer, got True"),
        ({"runner": {"kind": "fast"}}, "runner.kind: 'fast' unknown"),
        ({"runner": {"kind": "engine"}}, "needs model.timing"),
        ({"runner": {"max_num_seqs": 0}}, "runner.max_num_seqs: expected a value >= 1, got 0"),
        ({"cache": {"capacities": ["0.5A"]}}, "needs model.name and model.gpu"),
        (
            {"workload": {"format": "mooncake"}},
            "config key 'workload.source' missing (a trace file",
        ),
        ({"model": {"reserve_gib": "3"}}, "model.reserve_gib: expected a number, got '3'"),
        ({"runner": {"gated": 1}}, "runner.gated: expected true or false, got 1"),
        ({"model": {"name": "llama-9"}}, "model.name: "),
        ({"model": {"gpu": "b300"}}, "model.gpu: "),
        ({"model": {"timing": ["power:a=oops"]}}, "model.timing: "),
        ({"workload": {"source": "gen:sessions:num_sesions=3"}}, "has no parameter 'num_sesions'"),
        ({"workload": {"source": "gen:nope"}}, "unknown generator 'nope'"),
        ({"workload": {"source": "gen:random-pool", "vary": {"p": []}}}, "workload.vary.p"),
        (
            {
                "cache": {"capacities": [100], "cache_partial": True},
                "runner": {"kind": "engine"},
                "model": {"timing": ["tpot:s=0.02"]},
            },
            "cache.cache_partial applies to",
        ),
        ({"runner": {"closed_loop": True}}, "apply to kind = 'engine'"),
        ({"runner": {"gated": True}}, "apply to kind = 'engine'"),
        (
            {
                "runner": {"kind": "engine", "gated": True, "closed_loop": True},
                "model": {"timing": ["tpot:s=0.02"]},
            },
            "two arrival modes",
        ),
    ],
)
def test_bad_configs_name_the_key(patch: dict[str, object], message: str) -> None:
    data = {**_base(), **patch}
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert message in str(exc.value)


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="bad TOML"):
        load_config(_write(tmp_path / "bad.toml", "[cache\ncapacities = 1"))
    with pytest.raises(ConfigError, match="config key 'workload' missing"):
        load_config(_write(tmp_path / "empty.toml", ""))


def test_capacity_resolution() -> None:
    # blocks as given; 0.5ws of 1,001 distinct blocks = 500
    assert resolve_capacity(2000, working_set_blocks=1001, block_tokens=16) == 2000
    assert resolve_capacity("0.5ws", working_set_blocks=1001, block_tokens=16) == 500
    # 0.7A on an H100 (80 GiB = 85,899,345,920 B) with Llama-3.1-8B (8,029,995,008 params
    # x 2 B = 16,059,990,016 B): 0.7 x 69,839,355,904 B / (16 x 131,072 B) = 23,311.6 -> 23,311.
    spec, gpu = get_model("llama-3.1-8b"), get_gpu("h100")
    free = gpu.mem_bytes - spec.num_parameters * 2
    want = int(0.7 * free // (16 * 131_072))
    got = resolve_capacity(
        "0.7A", working_set_blocks=1, block_tokens=16, model="llama-3.1-8b", gpu="h100"
    )
    assert got == want == 23_311
    # UniCache's Table 4 (Llama-3.2-3B on an A100: 63 GB of KV) with 0.9 utilisation and 3 GiB
    # reserved: 0.9 x 85,899,345,920 - 3,212,574,720 x 2 - 3 x 2^30 = 67,663,036,416 B
    # (63.02 GiB); / (16 x 114,688 B) = 36,873.9 -> 36,873 blocks, 0.9A -> 33,186.
    assert available_kv_bytes("llama-3.2-3b", "a100", 0.9, 3.0) == 67_663_036_416
    kw: dict[str, Any] = {
        "working_set_blocks": 1,
        "block_tokens": 16,
        "model": "llama-3.2-3b",
        "gpu": "a100",
        "memory_utilization": 0.9,
        "reserve_gib": 3.0,
    }
    assert resolve_capacity("1A", **kw) == 36_873 and resolve_capacity("0.9A", **kw) == 33_186
    cfg = parse_config(
        {
            **_base(),
            "model": {
                "name": "llama-3.2-3b",
                "gpu": "a100",
                "memory_utilization": 0.9,
                "reserve_gib": 3,
            },
        }
    )
    assert (cfg.model.memory_utilization, cfg.model.reserve_gib) == (0.9, 3.0)
    for bad, msg in (
        ({"memory_utilization": 0}, "> 0, got 0"),
        ({"reserve_gib": -1}, ">= 0, got -1"),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"model.{next(iter(bad))}: expected")):
            parse_config({**_base(), "model": {"name": "llama-3.2-3b", **bad}})
        with pytest.raises(ConfigError, match=re.escape(msg)):
            parse_config({**_base(), "model": {"name": "llama-3.2-3b", **bad}})
    with pytest.raises(ConfigError, match="weights"):
        resolve_capacity(
            "0.5A", working_set_blocks=1, block_tokens=16, model="mixtral-8x7b", gpu="a6000"
        )


def test_hybrid_cell_rejects_prefix_caching_false(tmp_path: Path) -> None:
    """The no-caching baseline of the hybrid cache is the vanilla policy, said in one line."""
    data = {
        "workload": {"source": "gen:sessions", "params": {"num_sessions": 5}},
        "model": {"name": "marconi-hybrid-7b"},
        "cache": {"structure": "hybrid", "capacities": ["10GB"]},
        "runner": {"prefix_caching": False},
        "policies": ["marconi"],
    }
    with pytest.raises(ConfigError, match="use the 'vanilla' policy"):
        parse_config(data)
    data["runner"] = {}
    data["cache"] = {"structure": "hybrid", "capacities": [4000]}
    from prefixlab.experiments import run_sweep

    with pytest.raises(ConfigError, match="cannot hold one state and one block"):
        run_sweep(parse_config(data), tmp_path)


def test_a_workload_can_be_retimed_and_swept_over_its_rate() -> None:
    from prefixlab.experiments.run import build_trace, fingerprint

    base = {
        "name": "t",
        "policies": ["lru"],
        "workload": {"source": "gen:sessions", "params": {"num_sessions": 6}},
        "cache": {"capacities": [50]},
    }
    cfg = parse_config(base)
    swept = parse_config(
        {**base, "workload": {**base["workload"], "vary": {"time_scale": [0.5, 2.0]}}}  # type: ignore[dict-item]
    )
    plain = build_trace(cfg, {}, 0)
    for scale in (0.5, 2.0):
        tr = build_trace(swept, {"time_scale": scale}, 0)
        assert tr.request_rate() == pytest.approx(plain.request_rate() / scale)
        assert tr.input_length.tolist() == plain.input_length.tolist()
    assert fingerprint(cfg) != fingerprint(
        parse_config(
            {
                **base,
                "workload": {
                    "source": "gen:sessions",
                    "params": {"num_sessions": 6, "request_rate": 3.0},
                },
            }
        )
    )
    with pytest.raises(ConfigError, match="request_rate must be a positive number"):
        build_trace(
            parse_config(
                {
                    **base,
                    "workload": {
                        "source": "gen:sessions",
                        "params": {"num_sessions": 6, "request_rate": 0},
                    },
                }
            ),
            {},
            0,
        )


def test_a_fleet_table_joins_the_cross_product() -> None:
    from prefixlab.experiments.run import plan, run_cell

    base: dict[str, Any] = {
        "name": "t",
        "policies": ["lru"],
        "workload": {"source": "gen:sessions", "params": {"num_sessions": 30}},
        "model": {"timing": ["power:preset=llama-3.1-8b-h100", "tpot:s=0.01"]},
        "cache": {"capacities": [3000], "block_tokens": 16},
        "runner": {"kind": "engine"},
    }
    plain = plan(parse_config(base))
    cfg = parse_config({**base, "fleet": {"replicas": [1, 3], "routers": ["random", "kv-aware"]}})
    cells = plan(cfg)
    assert [c.variant for c in cells] == [
        {"replicas": n, "router": r} for n in (1, 3) for r in ("random", "kv-aware")
    ]
    assert plain[0].cell_id not in {c.cell_id for c in cells}  # a fleet is another cell
    rows = {(c.variant["replicas"], c.variant["router"]): run_cell(cfg, c).row for c in cells}
    one = run_cell(parse_config(base), plain[0]).row
    for router in ("random", "kv-aware"):  # one replica: the engine, whatever the router
        assert rows[(1, router)]["token_hit_ratio"] == one["token_hit_ratio"]
        assert rows[(1, router)]["mean_ttft_s"] == one["mean_ttft_s"]
    assert rows[(3, "kv-aware")]["token_hit_ratio"] > rows[(3, "random")]["token_hit_ratio"]
    for patch, words in (
        ({"runner": {"kind": "replay"}}, "a fleet table needs runner.kind = 'engine'"),
        ({"fleet": {"routers": ["nearest"]}}, "fleet.routers[0]: unknown router 'nearest'"),
        ({"fleet": {"replicas": [0]}}, "fleet.replicas"),
    ):
        bad = {**base, "fleet": {"replicas": [2]}, **patch}
        with pytest.raises(ConfigError, match=re.escape(words)):
            parse_config(bad)
    clash = {**base, "fleet": {}, "workload": {"source": "t.jsonl", "vary": {"router": [1]}}}
    with pytest.raises(ConfigError, match="the name of a fleet dimension"):
        parse_config(clash)


def test_fleet_tier_setups_join_the_cross_product() -> None:
    from prefixlab.experiments.run import plan, run_cell

    base: dict[str, Any] = {
        "name": "t",
        "policies": ["lru"],
        "workload": {"source": "gen:sessions", "params": {"num_sessions": 30}},
        "model": {"name": "llama-3.1-8b", "timing": ["power:preset=llama-3.1-8b-h100"]},
        "cache": {"capacities": [1100], "block_tokens": 16},
        "runner": {"kind": "engine"},
        "fleet": {"replicas": [2]},
    }
    plain = plan(parse_config(base))
    assert [c.variant for c in plain] == [{"replicas": 2, "router": "round-robin"}]
    setups = [[], ["cpu:blocks=4000"], ["cpu:blocks=4000", "store:size=20GB,write=back"]]
    cfg = parse_config({**base, "fleet": {"replicas": [2], "tiers": setups}})
    cells = plan(cfg)
    labels = ["none", "cpu:blocks=4000", "cpu:blocks=4000 + store:size=20GB,write=back"]
    assert [c.variant["tiers"] for c in cells] == labels
    rows = [run_cell(cfg, c).row for c in cells]
    assert (
        rows[0]["token_hit_ratio"] == run_cell(parse_config(base), plain[0]).row["token_hit_ratio"]
    )
    assert math.isnan(rows[0]["cpu_token_hit_ratio"])
    assert rows[1]["cpu_token_hit_ratio"] > 0
    assert rows[1]["token_hit_ratio"] > rows[0]["token_hit_ratio"]
    assert rows[2]["gpu_token_hit_ratio"] + rows[2]["cpu_token_hit_ratio"] + rows[2][
        "store_token_hit_ratio"
    ] == pytest.approx(rows[2]["token_hit_ratio"])
    for setups, words in (
        ([["disk:blocks=4"]], "fleet.tiers[0]: tier 'disk'"),
        ([[], ["cpu:blocks=4", "cpu:blocks=8"]], "fleet.tiers[1]: tiers must be given top down"),
        ([["cpu:size=8GB"]], "needs a model"),
    ):
        bad = {**base, "fleet": {"tiers": setups}}
        if "model" in words:
            bad["model"] = {"timing": ["power:preset=llama-3.1-8b-h100"]}
        with pytest.raises(ConfigError, match=re.escape(words)):
            parse_config(bad)
