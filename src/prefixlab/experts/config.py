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
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from prefixlab.errors import ConfigError

Scalar = int | float | str | bool
_FRACTION = re.compile(r"^(?P<f>\d+(?:\.\d*)?|\.\d+)\s*nl$")


@dataclass(frozen=True, slots=True)
class ExpertSweepConfig:
    """A validated expert-cache sweep (``kind`` marks the results folder for the report)."""

    trace: str
    capacities: list[int | str]
    policies: list[str]
    params: dict[str, Scalar] = field(default_factory=dict)
    vary: dict[str, list[Scalar]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    name: str = "experts"
    kind: str = "experts"

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
        args = ",".join(f"{k}={_text(v)}" for k, v in values.items())
        return f"{self.trace}:{args}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _text(v: Scalar) -> str:
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


def _capacity(v: Any, where: str) -> int | str:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    if isinstance(v, str):
        s = v.strip()
        m = _FRACTION.match(s)
        if s == "all" or (m is not None and float(m.group("f")) > 0):
            return s
    raise ConfigError(
        f"{where}: {v!r} is not an expert-cache capacity; give pages (a positive integer), "
        "a fraction of all n x l pages ('0.25nl') or 'all' (every size from 1 to n x l)"
    )


def _scalar(v: Any, where: str) -> Scalar:
    if isinstance(v, (int, float, str, bool)):
        return v
    raise ConfigError(f"{where}: expected a number, string or boolean, got {v!r}")


def _table(d: Any, where: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a table of keys, got {d!r}")
    for key in d:
        if key not in known:
            raise ConfigError(
                f"config key '{where}.{key}' unknown; known here: {', '.join(sorted(known))}"
            )
    return d


def parse_sweep_config(data: Any, name: str = "experts") -> ExpertSweepConfig:
    """Validate a config dict (as TOML or YAML parse it); errors name the key."""
    top = _table(data, "config", {"name", "workload", "cache", "seeds", "kind"})
    if top.get("kind", "experts") != "experts":
        raise ConfigError(f"config.kind: expected 'experts', got {top['kind']!r}")
    w = _table(top.get("workload"), "workload", {"trace", "params", "vary"})
    trace = w.get("trace")
    if not isinstance(trace, str) or not trace:
        raise ConfigError("workload.trace: missing (a routing file or 'gen:KIND')")
    if trace.startswith("gen:") and trace.count(":") > 1:
        raise ConfigError(f"workload.trace: give parameters in workload.params, not {trace!r}")
    params = {k: _scalar(v, f"workload.params.{k}") for k, v in w.get("params", {}).items()}
    vary: dict[str, list[Scalar]] = {}
    for k, vs in _table(w.get("vary", {}), "workload.vary", set(w.get("vary", {}))).items():
        if not isinstance(vs, list) or not vs:
            raise ConfigError(f"workload.vary.{k}: expected a non-empty list, got {vs!r}")
        vary[k] = [_scalar(v, f"workload.vary.{k}") for v in vs]
    if (params or vary) and not trace.startswith("gen:"):
        raise ConfigError("workload.params / vary apply to generated traces ('gen:KIND') only")
    if "seed" in params or "seed" in vary:
        raise ConfigError("workload: give seeds as the top-level 'seeds' list, not a parameter")
    c = _table(top.get("cache"), "cache", {"capacities", "policies"})
    caps = c.get("capacities")
    if not isinstance(caps, list) or not caps:
        raise ConfigError("cache.capacities: expected a non-empty list")
    pols = c.get("policies")
    if not isinstance(pols, list) or not pols or not all(isinstance(p, str) for p in pols):
        raise ConfigError("cache.policies: expected a non-empty list of policy names")
    from prefixlab.experiments.config import parse_seeds

    seeds = parse_seeds(top)
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: a seed is listed twice in {seeds!r}")
    cfg = ExpertSweepConfig(
        trace=trace,
        capacities=[_capacity(v, f"cache.capacities[{i}]") for i, v in enumerate(caps)],
        policies=list(pols),
        params=params,
        vary=vary,
        seeds=list(seeds),
        name=str(top.get("name", name)),
    )
    _check_policies(cfg.policies)
    _check_generator(cfg)
    return cfg


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
    from prefixlab.experiments.config import read_config_file

    data, p = read_config_file(path)
    return parse_sweep_config(data if data is not None else {}, name=p.stem)
