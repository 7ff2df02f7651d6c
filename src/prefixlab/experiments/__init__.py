"""Experiments: typed configs, cells, the results store and sweeps (local or Ray)."""

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
from prefixlab.experiments.run import COLUMNS, Cell, CellResult, plan, run_cell
from prefixlab.experiments.store import ResultsStore, find_results, read_table
from prefixlab.experiments.sweep import SweepSummary, run_sweep

__all__ = [
    "COLUMNS",
    "CacheConfig",
    "Cell",
    "CellResult",
    "ExperimentConfig",
    "ModelConfig",
    "ResultsStore",
    "RunnerConfig",
    "SweepSummary",
    "WorkloadConfig",
    "find_results",
    "load_config",
    "parse_config",
    "plan",
    "read_table",
    "resolve_capacity",
    "run_cell",
    "run_sweep",
]
