"""Expert-cache sweep configs (TOML or YAML): a trace, cache sizes, policies and seeds.

::

    name = "zipf-a"
    [workload]
    trace = "gen:zipf"                       # or a routing file (.jsonl, .npz)
    params = { num_layers = 32, num_experts = 16, num_tokens = 2000 }
    vary = { a = [0.5, 1.0, 1.5] }           # each combination is a workload variant
    [cache]
    capacities = [64, 200, "0.5nl"]          # pages; "f nl" = f x n x l; "all" = 1..n*l
    policies = ["lru", "lru-dist", "llru", "marking", "opt", "opt-dist"]
    seeds = [0, 1]

A generator's ``seed`` parameter takes each seed of ``seeds``; policies with randomness
(``marking``) take it too. A file trace is the same for every seed (each cell reads it).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PlainValidator, WithJsonSchema, model_validator

from prefixlab.configfile import ConfigModel, Seeds, read_config_file, validate
from prefixlab.errors import ConfigError

Scalar = int | float | str | bool
_FRACTION = re.compile(r"^(?P<f>\d+(?:\.\d*)?|\.\d+)\s*nl$")


def _capacity(v: object) -> int | str:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    if isinstance(v, str):
        s = v.strip()
        m = _FRACTION.match(s)
        if s == "all" or (m is not None and float(m.group("f")) > 0):
            return s
    raise ValueError(
        f"{v!r} is not an expert-cache capacity; give pages (a positive integer), "
        "a fraction of all n x l pages ('0.25nl') or 'all' (every size from 1 to n x l)"
    )


def parse_capacity(v: int | str, where: str) -> int | str:
    """One capacity given outside a config file (``where`` names the option)."""
    try:
        return _capacity(v)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


#: an expert-cache size: pages, a fraction of all n x l pages, or every size
Capacity = Annotated[
    int | str,
    PlainValidator(_capacity),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "description": "pages"},
                {"type": "string", "pattern": r"^\s*(\d+(\.\d*)?|\.\d+)\s*nl\s*$"},
                {"const": "all", "description": "every size from 1 to n x l"},
            ]
        }
    ),
]


class ExpertWorkload(ConfigModel):
    """The routing trace: a file, or a generator with its parameters."""

    trace: str = Field(min_length=1)
    """a routing file (.jsonl, .npz) or gen:KIND (prefixlab experts trace --help)"""
    params: dict[str, Scalar] = {}
    """the generator's parameters (generated traces only)"""
    vary: dict[str, Annotated[list[Scalar], Field(min_length=1)]] = {}
    """generator parameters swept over: each combination is a workload variant"""

    @model_validator(mode="after")
    def _check(self) -> ExpertWorkload:
        generated = self.trace.startswith("gen:")
        if generated and self.trace.count(":") > 1:
            raise ConfigError(
                f"workload.trace: give parameters in workload.params, not {self.trace!r}"
            )
        if (self.params or self.vary) and not generated:
            raise ConfigError("workload.params / vary apply to generated traces ('gen:KIND') only")
        if "seed" in self.params or "seed" in self.vary:
            raise ConfigError("workload: give seeds as the top-level 'seeds' list, not a parameter")
        return self


class ExpertCache(ConfigModel):
    """The cache sizes and the policies compared at each."""

    capacities: Annotated[list[Capacity], Field(min_length=1)]
    """pages; 'f nl' = f x n x l; 'all' = every size from 1 to n x l"""
    policies: Annotated[list[str], Field(min_length=1)]
    """expert-cache policies (prefixlab experts policies)"""

    @model_validator(mode="after")
    def _check(self) -> ExpertCache:
        _check_policies(self.policies)
        return self


class ExpertSweepConfig(ConfigModel):
    """An expert-cache study (``kind`` marks the results folder for the report)."""

    workload: ExpertWorkload
    cache: ExpertCache
    seeds: Seeds = [0]
    name: str = Field("experts", min_length=1)
    """the study's name (default: the file's stem)"""
    kind: Literal["experts"] = "experts"

    @model_validator(mode="after")
    def _check(self) -> ExpertSweepConfig:
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds: a seed is listed twice in {self.seeds!r}")
        _check_generator(self)
        return self

    @property
    def trace(self) -> str:
        return self.workload.trace

    @property
    def params(self) -> dict[str, Scalar]:
        return self.workload.params

    @property
    def vary(self) -> dict[str, list[Scalar]]:
        return self.workload.vary

    @property
    def capacities(self) -> list[int | str]:
        return self.cache.capacities

    @property
    def policies(self) -> list[str]:
        return self.cache.policies

    def variants(self) -> list[dict[str, Scalar]]:
        """The cross product of ``vary``, in the order the config lists keys and values."""
        keys = list(self.vary)
        return [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.vary[k] for k in keys))
        ]

    def is_generated(self) -> bool:
        return self.trace.startswith("gen:")

    def trace_spec(self, variant: dict[str, Scalar], seed: int) -> str:
        """The ``gen:KIND:k=v,...`` spec of one variant and seed (the path for a file)."""
        if not self.is_generated():
            return self.trace
        values = {**self.params, **variant, "seed": seed}
        args = ",".join(f"{k}={spec_text(v)}" for k, v in values.items())
        return f"{self.trace}:{args}"


def spec_text(v: Scalar) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def resolve_capacities(
    capacities: list[int | str], num_layers: int, num_experts: int
) -> list[tuple[str, int]]:
    """``(label, pages)`` per capacity entry: ints as given, ``f nl`` = round(f x n x l)
    (at least 1), ``all`` = every size from 1 to n x l. Repeated sizes are kept once."""
    total = num_layers * num_experts
    out: dict[int, str] = {}
    for c in capacities:
        if isinstance(c, int):
            out.setdefault(c, str(c))
        elif c == "all":
            for k in range(1, total + 1):
                out.setdefault(k, str(k))
        else:
            m = _FRACTION.match(c)
            assert m is not None  # parse_sweep_config checked the form
            out.setdefault(max(1, round(float(m.group("f")) * total)), c)
    return [(label, pages) for pages, label in out.items()]


def parse_sweep_config(data: object, name: str = "experts") -> ExpertSweepConfig:
    """Validate a config dict (as TOML or YAML parse it); errors name the key."""
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": name}
    return validate(ExpertSweepConfig, data)


def _check_policies(policies: list[str]) -> None:
    from prefixlab.experts.policies import make_policy

    for i, p in enumerate(policies):
        if p in policies[:i]:
            raise ConfigError(f"cache.policies[{i}]: {p!r} is listed twice")
        try:
            make_policy(p)
        except ConfigError as exc:
            raise ConfigError(f"cache.policies[{i}]: {exc}") from None


def _check_generator(cfg: ExpertSweepConfig) -> None:
    """Check the generator and every variant's parameters now, before any cell runs."""
    if not cfg.is_generated():
        return
    from prefixlab.experts.generators import EXPERT_GENERATORS
    from prefixlab.workload.generators.base import resolve_params

    kind = cfg.trace[4:]
    if kind not in EXPERT_GENERATORS:
        known = ", ".join(sorted(EXPERT_GENERATORS))
        raise ConfigError(f"workload.trace: unknown expert generator '{kind}'; known: {known}")
    info = EXPERT_GENERATORS[kind]
    names = {f.name for f in fields(info.params)}
    for where, given in (("workload.params", cfg.params), ("workload.vary", cfg.vary)):
        for name in given:
            if name not in names:
                raise ConfigError(f"{where}.{name}: the {kind} generator has no such parameter")
    for variant in cfg.variants():
        try:
            resolve_params(info.params, None, {**cfg.params, **variant}, kind)
        except ConfigError as exc:
            label = ",".join(f"{k}={v}" for k, v in variant.items()) or "workload.params"
            raise ConfigError(f"{label}: {exc}") from None


def load_sweep_config(path: str | Path) -> ExpertSweepConfig:
    """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) expert sweep config."""
    data, p = read_config_file(path)
    return parse_sweep_config(data if data is not None else {}, name=p.stem)
