"""Config files (prefixlab.configfile): pydantic models, one-line errors, JSON Schema.

The error of a bad value names its key path, the rule and the value; the schemas in
docs/schema/ are the ones ``prefixlab schema KIND`` prints, and they accept the configs the
docs show and refuse what the models refuse.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.configfile import schema, validate
from prefixlab.errors import ConfigError
from prefixlab.experiments.config import ExperimentConfig, parse_config
from prefixlab.experts.config import ExpertSweepConfig, parse_sweep_config
from prefixlab.studies import get_kind

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _base() -> dict[str, Any]:
    return {
        "workload": {"source": "gen:sessions"},
        "cache": {"capacities": [100]},
        "policies": ["lru"],
    }


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        validate(ExperimentConfig, data)
    return str(info.value)


def test_unknown_nested_key_lists_the_keys_of_its_own_table() -> None:
    msg = _error({**_base(), "runner": {"max_seqs": 4}})
    known = (
        "closed_loop, gated, kind, load_overlap, max_num_batched_tokens, max_num_seqs, "
        "prefix_caching, sliding_window_rule"
    )
    assert msg == (
        "config key 'runner.max_seqs' unknown (did you mean 'max_num_seqs'?); "
        f"known here: chunked_prefill, {known}"
    )
    # a misspelt required key is reported as unknown first, the missing one counted after
    msg = _error(
        {"polices": ["lru"], "workload": {"source": "gen:sessions"}, "cache": {"capacities": [1]}}
    )
    assert msg.startswith("config key 'polices' unknown (did you mean 'policies'?)")
    assert msg.endswith("(and 1 more: policies)")


def test_missing_key_says_what_belongs_there() -> None:
    assert _error({"cache": {"capacities": [1]}, "policies": ["lru"]}) == (
        "config key 'workload' missing (a table with source = ...)"
    )
    assert _error({**_base(), "workload": {}}).startswith(
        "config key 'workload.source' missing (a trace file, or gen:NAME"
    )


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        # strict types: no bool for a number, no string for an integer
        ({"runner": {"max_num_seqs": True}}, "runner.max_num_seqs: expected an integer, got True"),
        ({"runner": {"max_num_seqs": "8"}}, "runner.max_num_seqs: expected an integer, got '8'"),
        (
            {"cache": {"capacities": [1], "block_tokens": 16.0}},
            "cache.block_tokens: expected an integer, got 16.0",
        ),
        (
            {"model": {"reserve_gib": float("nan")}},
            "model.reserve_gib: expected a finite number, got nan",
        ),
        (
            {"model": {"memory_utilization": 1.5}},
            "model.memory_utilization: expected a value <= 1, got 1.5",
        ),
        ({"runner": {"kind": "fast"}}, "runner.kind: 'fast' unknown; known: 'replay', 'engine'"),
        ({"cache": {"capacities": [1, [2]]}}, "cache.capacities[1]: [2] is not a capacity"),
        (
            {"workload": {"source": "gen:sessions", "vary": {"num_sessions": 3}}},
            "workload.vary.num_sessions: expected a list, got 3",
        ),
        ({"name": ""}, "name: expected a non-empty string, got ''"),
    ],
)
def test_a_bad_value_names_key_rule_and_value(patch: dict[str, Any], message: str) -> None:
    assert _error({**_base(), **patch}).startswith(message)


def test_every_bad_key_is_counted_and_the_first_ones_named() -> None:
    msg = _error(
        {**_base(), "runner": {"max_num_seqs": 0, "max_num_batched_tokens": 0}, "seeds": [-1]}
    )
    assert msg == (
        "runner.max_num_seqs: expected a value >= 1, got 0 "
        "(and 2 more: runner.max_num_batched_tokens, seeds[0])"
    )


def test_a_number_key_takes_an_integer_and_a_string_list_one_string() -> None:
    cfg = parse_config(
        {**_base(), "policies": "lru", "model": {"name": "llama-3.2-3b", "reserve_gib": 3}}
    )
    assert cfg.policies == ["lru"] and cfg.model.reserve_gib == 3.0
    assert isinstance(cfg.model.reserve_gib, float)


def test_configs_are_frozen_and_compare_by_value() -> None:
    a, b = parse_config(_base()), parse_config(_base())
    assert a == b and a is not b
    with pytest.raises(Exception, match="frozen"):
        a.name = "other"  # type: ignore[misc]


def test_not_a_table_is_one_line() -> None:
    assert _error([1, 2]) == "config: expected a table of keys, got [1, 2]"
    assert _error({**_base(), "cache": 4}).startswith("cache: expected a table of keys, got 4")


# ------------------------------------------------------------------ JSON Schema
@pytest.mark.parametrize("kind", ["experiment", "experts"])
def test_docs_schema_is_the_generated_one(kind: str) -> None:
    """docs/schema/KIND.schema.json is what ``prefixlab schema KIND`` prints (regenerate it
    with that command when a config model changes)."""
    out = CliRunner().invoke(app, ["schema", kind])
    assert out.exit_code == 0, out.output
    doc = (ROOT / "docs" / "schema" / f"{kind}.schema.json").read_text(encoding="utf-8")
    assert json.loads(out.output) == json.loads(doc) == schema(get_kind(kind).config)


def test_schema_of_an_unknown_kind_is_one_line() -> None:
    out = CliRunner().invoke(app, ["schema", "fleet"])
    assert out.exit_code == 2
    assert "unknown config kind 'fleet'; known: experiment, experts" in out.output


def _toml_blocks(path: Path, marker: str) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    return [tomllib.loads(b) for b in blocks if marker in b]


DOC_CONFIGS = [
    *[("experiment", d) for d in _toml_blocks(ROOT / "docs" / "experiments.md", "[cache]")],
    *[
        ("experiment", d)
        for d in _toml_blocks(ROOT / "README.md", "[cache]")
        if "source" in d.get("workload", {})
    ],
    *[("experts", d) for d in _toml_blocks(ROOT / "docs" / "experts.md", "[cache]")],
    (
        "experiment",
        tomllib.loads((ROOT / "src/prefixlab/experiments/demo.toml").read_text("utf-8")),
    ),
]


def test_the_docs_show_configs_of_both_kinds() -> None:
    kinds = [k for k, _ in DOC_CONFIGS]
    assert kinds.count("experiment") >= 2 and kinds.count("experts") >= 1


@pytest.mark.parametrize(("kind", "data"), DOC_CONFIGS)
def test_documented_configs_pass_the_model_and_the_schema(kind: str, data: dict[str, Any]) -> None:
    jsonschema.validate(data, schema(get_kind(kind).config))
    parse = parse_config if kind == "experiment" else parse_sweep_config
    cfg = parse(data)
    # the resolved config (defaults filled in) is itself a valid config of its kind
    jsonschema.validate(json.loads(cfg.to_json()), schema(get_kind(kind).config))
    assert parse(json.loads(cfg.to_json())) == cfg


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("experiment", {**_base(), "cache": {"capacities": ["half"]}}),
        ("experiment", {**_base(), "cache": {"capacities": [0]}}),
        ("experiment", {**_base(), "runner": {"kind": "fast"}}),
        ("experiment", {**_base(), "extra": 1}),
        ("experiment", {**_base(), "seeds": []}),
        (
            "experts",
            {
                "workload": {"trace": "gen:zipf"},
                "cache": {"capacities": ["2x"], "policies": ["lru"]},
            },
        ),
        (
            "experts",
            {"workload": {"trace": "gen:zipf"}, "cache": {"capacities": [4], "policies": []}},
        ),
        (
            "experts",
            {
                "workload": {"trace": "gen:zipf"},
                "cache": {"capacities": [4], "policies": ["lru"]},
                "kind": "x",
            },
        ),
    ],
)
def test_schema_and_model_refuse_the_same_shapes(kind: str, data: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema(get_kind(kind).config))
    parse = parse_config if kind == "experiment" else parse_sweep_config
    with pytest.raises(ConfigError):
        parse(data)


def test_expert_config_is_checked_by_the_same_rules() -> None:
    data = {
        "workload": {"trace": "gen:zipf"},
        "cache": {"capacities": [4], "policies": ["lru"]},
        "seeds": [0, True],
    }
    with pytest.raises(ConfigError, match=re.escape("seeds[1]: expected an integer, got True")):
        parse_sweep_config(data)
    assert isinstance(ExpertSweepConfig.model_json_schema(), dict)
