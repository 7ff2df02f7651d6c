"""Resolve a trace source: a file path, or ``gen:NAME[:k=v,...]`` for a generated workload."""

from __future__ import annotations

from typing import Any

from prefixlab.errors import ConfigError
from prefixlab.registry import parse_spec
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.trace import Trace


def open_trace(
    source: str,
    fmt: str = "native",
    **loader_kwargs: Any,  # Any: forwarded unchanged to load_trace (its typed options)
) -> Trace:
    """Load a file (``fmt`` picks the loader) or run a generator (``gen:sessions:seed=3``)."""
    if source.startswith("gen:"):
        if loader_kwargs:
            raise ConfigError(f"{', '.join(loader_kwargs)} applies to trace files, not to {source}")
        name, kwargs = parse_spec(source[4:], "generator spec")
        if name not in GENERATORS:
            raise ConfigError(f"unknown generator '{name}'; known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[name].fn(**kwargs)
    if fmt == "native" and source.endswith(".parquet"):
        fmt = "parquet"
    return load_trace(source, fmt, **loader_kwargs)
