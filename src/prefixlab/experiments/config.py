"""Experiment configs: typed, validated, read from TOML (or YAML).

::

    [workload]                     # a file (with format and loader options) or gen:NAME
    source = "gen:mix"
    params = { trace = 2, num_requests = 2000 }

    [model]                        # optional: bytes, roofline, capacities in GPU memory
    name = "llama-3.1-8b"
    gpu = "h100"
    timing = ["power:preset=llama-3.1-8b-h100", "tpot:s=0.02"]

    [cache]
    structure = "block"
    block_tokens = 16
    capacities = [2000, "0.5ws", "0.7A"]   # blocks; fraction of the working set; fraction of
                                            # GPU memory left after the weights (UniCache's A)
    [runner]
    kind = "engine"                # or "replay"
    max_num_seqs = 64

    policies = ["lru", "s3fifo:small_ratio=0.1", "opt"]   # top level
    seeds = [0, 1]

Every error names the key (``cache.capacities[1]: ...``). The resolved config (defaults
filled in) can be written beside the results as JSON.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from prefixlab.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

RUNNERS = ("replay", "engine")
STRUCTURES = ("block", "radix", "hybrid")
_CAPACITY = re.compile(r"^(?P<f>\d*\.?\d+)(?P<unit>ws|A)$")
_BYTES = re.compile(r"^(?P<n>\d*\.?\d+)\s*(?P<unit>B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def parse_bytes(text: str) -> int | None:
    """``"40GB"`` -> 40_000_000_000 (``GiB`` for powers of two); None if not a size."""
    m = _BYTES.match(text.strip())
    if m is None:
        return None
    return round(float(m.group("n")) * _UNITS[m.group("unit")])


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    source: str
    format: str = "native"
    params: dict[str, Any] = field(default_factory=dict)
    #: workload parameters swept over: each value list joins the cross product
    vary: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str | None = None
    gpu: str | None = None
    timing: list[str] = field(default_factory=list)
    #: the 'A' of a capacity 'f A': memory_utilization x GPU memory - weights - reserve_gib
    #: (1.0 and 0: all memory after the weights; vLLM's default gpu_memory_utilization is
    #: 0.9, and its profiled activation peak is the reserve)
    memory_utilization: float = 1.0
    reserve_gib: float = 0.0


@dataclass(frozen=True, slots=True)
class CacheConfig:
    capacities: list[int | str]
    structure: str = "block"
    block_tokens: int | None = None
    #: cache a prompt's trailing partial block too (the hash-table report; replay only)
    cache_partial: bool = False
    #: bound the pool of unreferenced cached blocks (the report's K; block structure only)
    max_free_blocks: int | None = None
    #: prompt tokens always recomputed (vLLM: 1; the report: 0)
    min_recompute_tokens: int = 1


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    kind: str = "replay"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    closed_loop: bool = False
    #: a session's turn waits for its previous turn to finish (UniCache's Algorithm 3)
    gated: bool = False
    chunked_prefill: bool = True
    #: False: nothing is ever looked up (vLLM's --no-enable-prefix-caching), the baseline
    prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class ExperimentConfig:
    workload: WorkloadConfig
    cache: CacheConfig
    policies: list[str]
    model: ModelConfig = field(default_factory=ModelConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    seeds: list[int] = field(default_factory=lambda: [0])
    name: str = "experiment"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def write_resolved(self, folder: str | Path) -> Path:
        """Save the resolved config beside the results (``config.resolved.json``)."""
        path = Path(folder) / "config.resolved.json"
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path


# ------------------------------------------------------------------ parsing
def _table(d: Any, where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a table of keys, got {d!r}")
    return d


def _keys(d: dict[str, Any], where: str, known: set[str]) -> None:
    for key in d:
        if key not in known:
            prefix = f"{where}." if where else ""
            raise ConfigError(
                f"config key '{prefix}{key}' unknown; known here: {', '.join(sorted(known))}"
            )


def _str(d: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    v = d.get(key, default)
    if v is not None and not isinstance(v, str):
        raise ConfigError(f"{where}.{key}: expected a string, got {v!r}")
    return v


def _int(d: dict[str, Any], key: str, where: str, default: int, low: int = 1) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"{where}.{key}: expected an integer >= {low}, got {v!r}")
    return v


def _float(
    d: dict[str, Any],
    key: str,
    where: str,
    default: float,
    low: float,
    high: float = math.inf,
    low_open: bool = False,
) -> float:
    v = d.get(key, default)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v > high or v < low or (low_open and v == low):
        bound = f"in ({low:g}, {high:g}]" if low_open else f">= {low:g}"
        raise ConfigError(f"{where}.{key}: expected a number {bound}, got {v!r}")
    return float(v)


def _bool(d: dict[str, Any], key: str, where: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{where}.{key}: expected true or false, got {v!r}")
    return v


def _str_list(d: dict[str, Any], key: str, where: str, required: bool = False) -> list[str]:
    v = d.get(key)
    if v is None:
        if required:
            raise ConfigError(f"{where}{key}: missing (a list of strings)")
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v) or not v:
        raise ConfigError(f"{where}{key}: expected a non-empty list of strings, got {v!r}")
    return list(v)


def _capacity(v: Any, where: str) -> int | str:
    if isinstance(v, bool):
        raise ConfigError(f"{where}: expected blocks (an integer) or a fraction like '0.5ws'")
    if isinstance(v, int):
        if v <= 0:
            raise ConfigError(f"{where}: a capacity in blocks must be positive, got {v}")
        return v
    if isinstance(v, str):
        m = _CAPACITY.match(v.strip())
        if m and 0 < float(m.group("f")) <= 1:
            return v.strip()
        size = parse_bytes(v)
        if size is not None and size > 0:
            return v.strip()
        raise ConfigError(
            f"{where}: {v!r} is not a capacity; give blocks (4000), a size (40GB), a fraction "
            "of the working set (0.5ws) or of the GPU memory left after the weights (0.7A), "
            "fractions in (0, 1]"
        )
    raise ConfigError(f"{where}: expected blocks or a fraction string, got {v!r}")


def parse_seeds(top: dict[str, Any]) -> list[int]:
    """The config's ``seeds``: a non-empty list of integers >= 0 (default ``[0]``)."""
    seeds = top.get("seeds", [0])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise ConfigError(f"seeds: expected a non-empty list of integers >= 0, got {seeds!r}")
    return list(seeds)


def parse_config(data: dict[str, Any], name: str = "experiment") -> ExperimentConfig:
    """Validate a config dict (as TOML or YAML parse it); errors name the key."""
    top = _table(data, "config")
    _keys(top, "", {"workload", "model", "cache", "runner", "policies", "seeds", "name"})
    if "workload" not in top:
        raise ConfigError("config key 'workload' missing (a table with source = ...)")
    w = _table(top["workload"], "workload")
    _keys(w, "workload", {"source", "format", "params", "vary"})
    source = _str(w, "source", "workload")
    if not source:
        raise ConfigError("workload.source: missing (a trace file or gen:NAME)")
    params = _table(w.get("params", {}), "workload.params")
    vary = _table(w.get("vary", {}), "workload.vary")
    for key, values in vary.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"workload.vary.{key}: expected a non-empty list of values")
        if key in params:
            raise ConfigError(f"workload.vary.{key}: also set in workload.params; give one")
    fmt = _str(w, "format", "workload", "native") or "native"
    workload = WorkloadConfig(source, fmt, dict(params), {k: list(v) for k, v in vary.items()})
    _check_workload(workload)
    m = _table(top.get("model", {}), "model")
    _keys(m, "model", {"name", "gpu", "timing", "memory_utilization", "reserve_gib"})
    model = ModelConfig(
        _str(m, "name", "model"),
        _str(m, "gpu", "model"),
        _str_list(m, "timing", "model."),
        _float(m, "memory_utilization", "model", 1.0, 0.0, 1.0, low_open=True),
        _float(m, "reserve_gib", "model", 0.0, 0.0),
    )
    if "cache" not in top:
        raise ConfigError("config key 'cache' missing (a table with capacities = [...])")
    c = _table(top["cache"], "cache")
    _keys(
        c,
        "cache",
        {
            "capacities",
            "structure",
            "block_tokens",
            "cache_partial",
            "max_free_blocks",
            "min_recompute_tokens",
        },
    )
    caps = c.get("capacities")
    if not isinstance(caps, list) or not caps:
        raise ConfigError(f"cache.capacities: expected a non-empty list, got {caps!r}")
    capacities = [_capacity(v, f"cache.capacities[{i}]") for i, v in enumerate(caps)]
    structure = _str(c, "structure", "cache", "block") or "block"
    if structure not in STRUCTURES:
        raise ConfigError(f"cache.structure: {structure!r} unknown; known: {', '.join(STRUCTURES)}")
    bt = c.get("block_tokens")
    if bt is not None:
        bt = _int(c, "block_tokens", "cache", 16)
    mfb = c.get("max_free_blocks")
    if mfb is not None:
        mfb = _int(c, "max_free_blocks", "cache", 0, low=0)
        if structure != "block":
            raise ConfigError("cache.max_free_blocks applies to structure = 'block'")
    cache = CacheConfig(
        capacities,
        structure,
        bt,
        _bool(c, "cache_partial", "cache", False),
        mfb,
        _int(c, "min_recompute_tokens", "cache", 1, low=0),
    )
    r = _table(top.get("runner", {}), "runner")
    _keys(
        r,
        "runner",
        {
            "kind",
            "max_num_seqs",
            "max_num_batched_tokens",
            "closed_loop",
            "gated",
            "chunked_prefill",
            "prefix_caching",
        },
    )
    kind = _str(r, "kind", "runner", "replay") or "replay"
    if kind not in RUNNERS:
        raise ConfigError(f"runner.kind: {kind!r} unknown; known: {', '.join(RUNNERS)}")
    defaults = (
        ("closed_loop", False),
        ("gated", False),
        ("chunked_prefill", True),
        ("prefix_caching", True),
    )
    flags = {k: _bool(r, k, "runner", d) for k, d in defaults}
    runner = RunnerConfig(
        kind,
        _int(r, "max_num_seqs", "runner", 256),
        _int(r, "max_num_batched_tokens", "runner", 8192),
        **flags,
    )
    if structure == "hybrid":
        _check_hybrid(capacities, model)
        if not runner.prefix_caching:
            raise ConfigError(
                "runner.prefix_caching = false: for the hybrid cache use the 'vanilla' policy"
            )
    elif any(isinstance(x, str) and parse_bytes(x) for x in capacities) and not model.name:
        raise ConfigError("a capacity in bytes needs model.name (for the KV bytes per block)")
    if kind == "engine" and cache.cache_partial:
        raise ConfigError(
            "cache.cache_partial applies to runner.kind = 'replay' (vLLM and "
            "SGLang cache full blocks only)"
        )
    if kind == "replay" and (runner.closed_loop or runner.gated or not runner.chunked_prefill):
        raise ConfigError(
            "runner.closed_loop, runner.gated and runner.chunked_prefill apply to kind = 'engine'"
        )
    if runner.closed_loop and runner.gated:
        raise ConfigError("runner.closed_loop and runner.gated are two arrival modes: choose one")
    if kind == "engine" and not model.timing and not (model.name and model.gpu):
        raise ConfigError("runner.kind = 'engine' needs model.timing, or model.name and model.gpu")
    if any(isinstance(x, str) and x.endswith("A") for x in capacities) and not (
        model.name and model.gpu
    ):
        raise ConfigError(
            "a capacity in 'A' (GPU memory after weights) needs model.name and model.gpu"
        )
    _check_model(model)
    policies = _str_list(top, "policies", "", required=True)
    seeds = parse_seeds(top)
    cfg_name = top.get("name", name)
    if not isinstance(cfg_name, str) or not cfg_name:
        raise ConfigError(f"name: expected a non-empty string, got {cfg_name!r}")
    _check_policies(policies, structure)
    return ExperimentConfig(workload, cache, policies, model, runner, list(seeds), cfg_name)


def _check_hybrid(capacities: list[int | str], model: ModelConfig) -> None:
    """The hybrid cache (KV + SSM states) has one byte budget, sized by the model."""
    if not model.name:
        raise ConfigError("cache.structure = 'hybrid' needs model.name (KV and state bytes)")
    for i, cap in enumerate(capacities):
        if isinstance(cap, str) and cap.endswith("ws"):
            raise ConfigError(
                f"cache.capacities[{i}]: {cap!r}: the hybrid cache's capacity is bytes "
                "(an integer, '40GB') or a fraction of GPU memory ('0.7A')"
            )


def _check_model(m: ModelConfig) -> None:
    """Unknown presets and bad timing specs fail now, not when the first cell runs."""
    from prefixlab.model.spec import get_model
    from prefixlab.model.timing import get_gpu, make_timing

    for key, value, get in (("model.name", m.name, get_model), ("model.gpu", m.gpu, get_gpu)):
        if value is not None:
            try:
                get(value)
            except ConfigError as exc:
                raise ConfigError(f"{key}: {exc}") from None
    if m.timing:
        try:
            make_timing(m.timing, m.name, m.gpu)
        except ConfigError as exc:
            raise ConfigError(f"model.timing: {exc}") from None


def _check_workload(w: WorkloadConfig) -> None:
    """A generator's parameters are checked now (names, types), a file's when it loads."""
    if not w.source.startswith("gen:"):
        return
    from prefixlab.policies.base import parse_spec
    from prefixlab.workload.generators import GENERATORS

    name, inline = parse_spec(w.source[4:], "workload.source")
    if name not in GENERATORS:
        raise ConfigError(
            f"workload.source: unknown generator '{name}'; known: {', '.join(sorted(GENERATORS))}"
        )
    known = {f.name for f in fields(GENERATORS[name].params)}
    for where, keys in (
        ("workload.source", inline),
        ("workload.params", w.params),
        ("workload.vary", w.vary),
    ):
        for key in keys:
            if key not in known:
                raise ConfigError(
                    f"{where}: generator '{name}' has no parameter '{key}'; "
                    f"it takes: {', '.join(sorted(known))}"
                )


def _check_policies(policies: list[str], structure: str) -> None:
    from prefixlab.policies.base import make_policy

    for i, spec in enumerate(policies):
        try:
            make_policy(spec, structure)
        except ConfigError as exc:
            raise ConfigError(f"policies[{i}]: {exc}") from None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) experiment config."""
    data, p = read_config_file(path)
    return parse_config(data if data is not None else {}, name=p.stem)


def config_from_text(
    text: str, name: str = "experiment", *, yaml: bool = False, where: str = "config"
) -> ExperimentConfig:
    """Parse and validate a config given as TOML (or YAML) text."""
    data = parse_config_text(text, yaml=yaml, where=where)
    return parse_config(data if data is not None else {}, name=name)


def read_config_file(path: str | Path) -> tuple[Any, Path]:
    """The parsed contents of a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    return parse_config_text(text, yaml=p.suffix in (".yaml", ".yml"), where=str(p)), p


def parse_config_text(text: str, *, yaml: bool = False, where: str = "config") -> Any:
    """TOML (or YAML) text as Python data; syntax errors name ``where``."""
    if yaml:
        try:
            import yaml as pyyaml
        except ImportError:
            raise ConfigError("YAML configs need PyYAML (pip install pyyaml)") from None
        try:
            data = pyyaml.safe_load(text)
        except pyyaml.YAMLError as exc:
            raise ConfigError(f"{where}: bad YAML: {exc}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: bad TOML: {exc}") from None
    return data


# ------------------------------------------------------------------ capacities
def available_kv_bytes(
    model: str, gpu: str, memory_utilization: float = 1.0, reserve_gib: float = 0.0
) -> int:
    """UniCache's ``A`` (Sec. 6.2: "the available GPU memory A after loading model weights"):
    ``memory_utilization x memory - weights - reserve``. Table 4 (Llama-3.2-3B: A6000 35 GB,
    A100 63, H200 117) fits vLLM's ``gpu_memory_utilization = 0.9`` with 2.2-3.0 GiB
    reserved for activations; the paper names neither."""
    from prefixlab.model.spec import get_model
    from prefixlab.model.timing import get_gpu

    spec, g = get_model(model), get_gpu(gpu)
    free = memory_utilization * g.mem_bytes - spec.num_parameters * spec.dtype_bytes
    return int(free - reserve_gib * 2**30)


def resolve_capacity_bytes(
    capacity: int | str,
    model: str,
    gpu: str | None = None,
    memory_utilization: float = 1.0,
    reserve_gib: float = 0.0,
) -> int:
    """Bytes for a hybrid-cache capacity: bytes as given, ``"40GB"``, or ``f A``."""
    if isinstance(capacity, int):
        return capacity
    size = parse_bytes(capacity)
    if size is not None:
        return size
    m = _CAPACITY.match(capacity)
    if m is None or m.group("unit") != "A":
        raise ConfigError(f"capacity {capacity!r} is not bytes, a size or 'f A'")

    if gpu is None:
        raise ConfigError(f"capacity {capacity!r} needs model.gpu")
    free = available_kv_bytes(model, gpu, memory_utilization, reserve_gib)
    if free <= 0:
        raise ConfigError(f"capacity {capacity!r}: {model}'s weights (and the reserve) fill {gpu}")
    return int(float(m.group("f")) * free)


def resolve_capacity(
    capacity: int | str,
    *,
    working_set_blocks: int,
    block_tokens: int,
    model: str | None = None,
    gpu: str | None = None,
    memory_utilization: float = 1.0,
    reserve_gib: float = 0.0,
) -> int:
    """Blocks for a capacity: blocks as given; ``f ws`` = f x the trace's distinct blocks;
    ``f A`` = f x :func:`available_kv_bytes` / KV bytes per block (UniCache's 0.5A-0.9A)."""
    if isinstance(capacity, int):
        return capacity
    size = parse_bytes(capacity)
    if size is not None:
        from prefixlab.model.spec import capacity_blocks_for_bytes

        if model is None:
            raise ConfigError(f"capacity {capacity!r} needs a model (KV bytes per block)")
        return capacity_blocks_for_bytes(size, model, block_tokens)
    m = _CAPACITY.match(capacity)
    if m is None:
        raise ConfigError(f"capacity {capacity!r} is not blocks, a size, 'f ws' or 'f A'")
    f = float(m.group("f"))
    if m.group("unit") == "ws":
        return max(1, int(f * working_set_blocks))
    from prefixlab.model.spec import get_model
    from prefixlab.model.timing import get_gpu

    if model is None or gpu is None:
        raise ConfigError(f"capacity {capacity!r} needs a model and a GPU")
    spec, g = get_model(model), get_gpu(gpu)
    free = available_kv_bytes(model, gpu, memory_utilization, reserve_gib)
    per_block = spec.kv_bytes_per_block(block_tokens)
    if free <= 0 or per_block <= 0:
        raise ConfigError(
            f"capacity {capacity!r}: {spec.name}'s weights (and the reserve) do "
            f"not leave KV room on {g.name}"
        )
    return max(1, int(f * free // per_block))
