"""Experiments: typed configs, cells, the results store, and the study engine every kind
runs on (local or Ray)."""

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
from prefixlab.experiments.study import Study, SweepSummary, run_study
from prefixlab.experiments.sweep import ExperimentStudy, run_sweep

__all__ = [
    "COLUMNS",
    "CacheConfig",
    "Cell",
    "CellResult",
    "ExperimentConfig",
    "ExperimentStudy",
    "ModelConfig",
    "ResultsStore",
    "RunnerConfig",
    "Study",
    "SweepSummary",
    "WorkloadConfig",
    "find_results",
    "load_config",
    "parse_config",
    "plan",
    "read_table",
    "resolve_capacity",
    "run_cell",
    "run_study",
    "run_sweep",
]
