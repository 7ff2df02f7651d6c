"""Experiments: typed configs (this module), and later compare / sweep / results / report."""

from prefixlab.experiments.config import (
    CacheConfig,
    ExperimentConfig,
    ModelConfig,
    RunnerConfig,
    WorkloadConfig,
    load_config,
    parse_config,
    resolve_capacity,
)

__all__ = [
    "CacheConfig",
    "ExperimentConfig",
    "ModelConfig",
    "RunnerConfig",
    "WorkloadConfig",
    "load_config",
    "parse_config",
    "resolve_capacity",
]
