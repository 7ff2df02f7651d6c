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

import re
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    JsonValue,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)

from prefixlab.configfile import (
    ConfigModel,
    Seeds,
    parse_bytes,
    parse_config_text,
    read_config_file,
    validate,
)
from prefixlab.errors import ConfigError
from prefixlab.policies.block_admission import check_structure, is_default, make_admission

_CAPACITY = re.compile(r"^(?P<f>\d*\.?\d+)(?P<unit>ws|A)$")


def _capacity(v: object) -> int | str:
    if isinstance(v, int) and not isinstance(v, bool):
        if v <= 0:
            raise ValueError(f"a capacity in blocks must be positive, got {v}")
        return v
    if isinstance(v, str):
        m = _CAPACITY.match(v.strip())
        if m and 0 < float(m.group("f")) <= 1:
            return v.strip()
        size = parse_bytes(v)
        if size is not None and size > 0:
            return v.strip()
    raise ValueError(
        f"{v!r} is not a capacity; give blocks (4000), a size (40GB), a fraction of the "
        "working set (0.5ws) or of the GPU memory left after the weights (0.7A), fractions "
        "in (0, 1]"
    )


def _listed(v: object) -> object:
    """One string stands for a list of one."""
    return [v] if isinstance(v, str) else v


#: a cache size: blocks, bytes ('40GB'), a fraction of the working set or of 'A'
Capacity = Annotated[
    int | str,
    PlainValidator(_capacity),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "description": "blocks"},
                {
                    "type": "string",
                    "pattern": r"^\s*\d*\.?\d+(ws|A|\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB))\s*$",
                    "description": "bytes ('40GB', '8GiB'), a fraction of the working set "
                    "('0.5ws') or of the GPU memory left after the weights ('0.7A')",
                },
            ]
        }
    ),
]
StrList = Annotated[list[str], BeforeValidator(_listed), Field(min_length=1)]


class WorkloadConfig(ConfigModel):
    """The trace: a file (with its format and loader options) or a generator."""

    source: str = Field(min_length=1)
    """a trace file, or gen:NAME for a generator (prefixlab trace generate --help)"""
    format: str = "native"
    """the file's format (prefixlab trace formats)"""
    params: dict[str, JsonValue] = {}
    """the generator's parameters, or the loader's options for a file"""
    vary: dict[str, Annotated[list[JsonValue], Field(min_length=1)]] = {}
    """workload parameters swept over: each value list joins the cross product"""

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        for key in self.vary:
            if key in self.params:
                raise ConfigError(f"workload.vary.{key}: also set in workload.params; give one")
        _check_workload(self)
        return self


class ModelConfig(ConfigModel):
    """The model and GPU: bytes per block, the roofline, capacities in GPU memory."""

    name: str | None = None
    """a model preset (prefixlab models)"""
    gpu: str | None = None
    """a GPU preset"""
    timing: Annotated[list[str], BeforeValidator(_listed)] = []
    """prefill / decode timing specs (docs/engine.md)"""
    memory_utilization: float = Field(1.0, gt=0, le=1)
    """the 'A' of a capacity 'f A': memory_utilization x GPU memory - weights - reserve_gib
    (vLLM's default gpu_memory_utilization is 0.9, and its profiled activation peak is the
    reserve)"""
    reserve_gib: float = Field(0.0, ge=0)
    """GiB held back from 'A' (activations)"""
    tp: int = Field(1, ge=1)
    """tensor-parallel degree: the roofline runs on tp GPUs, and 'A' is what tp GPUs hold
    for KV after 1/tp of the weights each (docs/models.md)"""

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        _check_model(self)
        return self


class CacheConfig(ConfigModel):
    """The cache structure and the capacities swept."""

    capacities: Annotated[list[Capacity], Field(min_length=1)]
    """cache sizes, each a column of the sweep"""
    structure: Literal["block", "radix", "hybrid"] = "block"
    """block hashes (vLLM), a radix tree (SGLang) or KV + SSM states (Marconi)"""
    block_tokens: int | None = Field(None, ge=1)
    """tokens per block (default: the trace's, else 16)"""
    cache_partial: bool = False
    """cache a prompt's trailing partial block too (the hash-table report; replay only)"""
    max_free_blocks: int | None = Field(None, ge=0)
    """bound the pool of unreferenced cached blocks (the report's K; block structure only)"""
    min_recompute_tokens: int = Field(1, ge=0)
    """prompt tokens always recomputed (vLLM: 1; the report: 0)"""
    admission: str = "all"
    """which new blocks are cached: all (every engine), seen:n=2, ... (block and radix)"""

    @model_validator(mode="after")
    def _check(self) -> CacheConfig:
        if self.max_free_blocks is not None and self.structure != "block":
            raise ConfigError("cache.max_free_blocks applies to structure = 'block'")
        check_structure(self.admission, self.structure)
        if not is_default(self.admission):
            make_admission(self.admission)
        return self


class RunnerConfig(ConfigModel):
    """How requests run: the sequential replay, or the serving engine on a virtual clock."""

    kind: Literal["replay", "engine"] = "replay"
    max_num_seqs: int = Field(256, ge=1)
    """the engine's batch bound in requests"""
    max_num_batched_tokens: int = Field(8192, ge=1)
    """the engine's batch bound in tokens"""
    closed_loop: bool = False
    """a session's next turn arrives when its previous one finishes"""
    gated: bool = False
    """a session's turn waits for its previous turn to finish (UniCache's Algorithm 3)"""
    chunked_prefill: bool = True
    prefix_caching: bool = True
    """False: nothing is ever looked up (vLLM's --no-enable-prefix-caching), the baseline"""
    load_overlap: bool = False
    """loads from KV tiers (fleet.tiers) run under the prefill of the rest of the prompt"""
    sliding_window_rule: Literal["window", "full"] = "window"
    """how the cache keeps a model's sliding-window layers: 'window', the engine's rule
    (on the block structure vLLM's hybrid KV-cache manager, on the radix one SGLang's SWA
    radix cache), or 'full', every layer of every block (docs/models.md)"""


#: the keys a fleet table adds to each cell's variant (``tiers`` only when it lists some)
FLEET_KEYS = ("replicas", "router", "tiers")


class FleetTable(ConfigModel):
    """Replicas behind a router (the engine runner): each list joins the cross product."""

    replicas: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] = [1]
    """engine replicas, each with the cache's capacity (docs/fleet.md)"""
    routers: StrList = ["round-robin"]
    """router specs (round-robin, random, session, least-loaded, power-of-two, cache-aware,
    kv-aware)"""
    tiers: Annotated[list[list[str]], Field(min_length=1)] = [[]]
    """tier setups, each a list of tier specs top down as --tier takes them
    (["cpu:size=200GB", "store:size=2TB"]); [] is GPU memory alone"""

    @model_validator(mode="after")
    def _check(self) -> FleetTable:
        from prefixlab.routers import make_router

        for i, spec in enumerate(self.routers):
            try:
                make_router(spec)
            except ConfigError as exc:
                raise ConfigError(f"fleet.routers[{i}]: {exc}") from None
        return self


def _check_tiers(cfg: ExperimentConfig) -> None:
    """Each fleet tier setup reads, with the model and block size it will run with."""
    from prefixlab.runner.engine.tiers import check_tiers, tier_of

    assert cfg.fleet is not None
    for i, specs in enumerate(cfg.fleet.tiers):
        try:
            bt = cfg.cache.block_tokens or 16
            tiers = [tier_of(spec, cfg.model.name, bt) for spec in specs]
            check_tiers(tiers, cfg.cache.structure, cfg.model.name)
        except ConfigError as exc:
            raise ConfigError(f"fleet.tiers[{i}]: {exc}") from None


class ExperimentConfig(ConfigModel):
    """A prefix-cache (or hybrid-cache) study: workload x capacities x policies x seeds."""

    workload: WorkloadConfig
    """a table with source = ..."""
    cache: CacheConfig
    """a table with capacities = [...]"""
    policies: StrList
    """policy specs (prefixlab policies), each a row of the sweep"""
    model: ModelConfig = Field(default_factory=ModelConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    seeds: Seeds = [0]
    fleet: FleetTable | None = None
    """replicas x routers (engine runner; absent: one engine)"""
    name: str = Field("experiment", min_length=1)
    """the study's name (default: the file's stem)"""
    kind: Literal["experiment"] = "experiment"
    """the study kind (prefixlab schema); an expert-cache study says kind = 'experts'"""

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        _check_combination(self)
        _check_policies(self.policies, self.cache.structure)
        return self

    def write_resolved(self, folder: str | Path) -> Path:
        """Save the resolved config beside the results (``config.resolved.json``)."""
        path = Path(folder) / "config.resolved.json"
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path


def parse_config(data: object, name: str = "experiment") -> ExperimentConfig:
    """Validate a config dict (as TOML or YAML parse it); errors name the key."""
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": name}
    return validate(ExperimentConfig, data)


def _check_combination(cfg: ExperimentConfig) -> None:
    """Rules that join the cache, runner and model tables."""
    cache, runner, model = cfg.cache, cfg.runner, cfg.model
    capacities = cache.capacities
    if cache.structure == "hybrid":
        _check_hybrid(capacities, model)
        if not runner.prefix_caching:
            raise ConfigError(
                "runner.prefix_caching = false: for the hybrid cache use the 'vanilla' policy"
            )
    elif any(isinstance(x, str) and parse_bytes(x) for x in capacities) and not model.name:
        raise ConfigError("a capacity in bytes needs model.name (for the KV bytes per block)")
    if runner.kind == "engine" and cache.cache_partial:
        raise ConfigError(
            "cache.cache_partial applies to runner.kind = 'replay' (vLLM and "
            "SGLang cache full blocks only)"
        )
    engine_only = runner.closed_loop or runner.gated or not runner.chunked_prefill
    if runner.kind == "replay" and engine_only:
        raise ConfigError(
            "runner.closed_loop, runner.gated and runner.chunked_prefill apply to kind = 'engine'"
        )
    if runner.closed_loop and runner.gated:
        raise ConfigError("runner.closed_loop and runner.gated are two arrival modes: choose one")
    if cfg.fleet is not None:
        if runner.kind != "engine":
            raise ConfigError("a fleet table needs runner.kind = 'engine' (replicas serve in time)")
        clash = [k for k in FLEET_KEYS if k in cfg.workload.vary]
        if clash:
            raise ConfigError(f"workload.vary.{clash[0]}: the name of a fleet dimension")
        _check_tiers(cfg)
    if runner.kind == "engine" and not model.timing and not (model.name and model.gpu):
        raise ConfigError("runner.kind = 'engine' needs model.timing, or model.name and model.gpu")
    if any(isinstance(x, str) and x.endswith("A") for x in capacities) and not (
        model.name and model.gpu
    ):
        raise ConfigError(
            "a capacity in 'A' (GPU memory after weights) needs model.name and model.gpu"
        )


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
    if m.name is not None and m.tp > 1:
        from prefixlab.model.spec import check_tp

        try:
            check_tp(get_model(m.name), m.tp)
        except ConfigError as exc:
            raise ConfigError(f"model.tp: {exc}") from None
    if m.timing:
        try:
            make_timing(m.timing, m.name, m.gpu, m.tp)
        except ConfigError as exc:
            raise ConfigError(f"model.timing: {exc}") from None


def _check_workload(w: WorkloadConfig) -> None:
    """A generator's parameters are checked now (names, types), a file's when it loads."""
    if not w.source.startswith("gen:"):
        return
    from prefixlab.registry import parse_spec
    from prefixlab.workload.generators import GENERATORS

    name, inline = parse_spec(w.source[4:], "workload.source")
    if name not in GENERATORS:
        raise ConfigError(
            f"workload.source: unknown generator '{name}'; known: {', '.join(sorted(GENERATORS))}"
        )
    # every trace can be retimed (prefixlab.workload.sources.retimed)
    known = {f.name for f in fields(GENERATORS[name].params)} | {"time_scale", "request_rate"}
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


# ------------------------------------------------------------------ capacities
def available_kv_bytes(
    model: str,
    gpu: str,
    memory_utilization: float = 1.0,
    reserve_gib: float = 0.0,
    tp: int = 1,
) -> int:
    """UniCache's ``A`` (Sec. 6.2: "the available GPU memory A after loading model weights"):
    ``memory_utilization x memory - weights - reserve``. Table 4 (Llama-3.2-3B: A6000 35 GB,
    A100 63, H200 117) fits vLLM's ``gpu_memory_utilization = 0.9`` with 2.2-3.0 GiB
    reserved for activations; the paper names neither. With tensor parallelism: what ``tp``
    GPUs hold, in the model's KV bytes (prefixlab.model.deploy)."""
    from prefixlab.model.deploy import free_kv_bytes_per_gpu
    from prefixlab.model.spec import get_model
    from prefixlab.model.timing import get_gpu

    spec, g = get_model(model), get_gpu(gpu)
    per_gpu = free_kv_bytes_per_gpu(spec, g, tp, memory_utilization, reserve_gib)
    if tp == 1:
        return int(per_gpu)
    return int(per_gpu) // spec.kv_bytes_per_token_per_rank(tp) * spec.kv_bytes_per_token


def resolve_capacity_bytes(
    capacity: int | str,
    model: str,
    gpu: str | None = None,
    memory_utilization: float = 1.0,
    reserve_gib: float = 0.0,
    tp: int = 1,
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
    free = available_kv_bytes(model, gpu, memory_utilization, reserve_gib, tp)
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
    tp: int = 1,
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
    free = available_kv_bytes(model, gpu, memory_utilization, reserve_gib, tp)
    per_block = spec.kv_bytes_per_block(block_tokens)
    if free <= 0 or per_block <= 0:
        raise ConfigError(
            f"capacity {capacity!r}: {spec.name}'s weights (and the reserve) do "
            f"not leave KV room on {g.name}"
        )
    return max(1, int(f * free // per_block))
