"""Resolve a trace source: a file path, or ``gen:NAME[:k=v,...]`` for a generated workload."""

from __future__ import annotations

import math
from typing import Any

from prefixlab.errors import ConfigError
from prefixlab.registry import parse_spec
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.trace import Trace

#: options that retime any trace once it is loaded or generated (:func:`retimed`)
TIME_OPTIONS = ("time_scale", "request_rate")


def open_trace(
    source: str,
    fmt: str = "native",
    **loader_kwargs: Any,  # Any: forwarded unchanged to load_trace (its typed options)
) -> Trace:
    """Load a file (``fmt`` picks the loader) or run a generator (``gen:sessions:seed=3``).
    ``time_scale`` or ``request_rate`` (:data:`TIME_OPTIONS`) retime either."""
    timing = {k: loader_kwargs.pop(k) for k in TIME_OPTIONS if k in loader_kwargs}
    if source.startswith("gen:"):
        if loader_kwargs:
            raise ConfigError(f"{', '.join(loader_kwargs)} applies to trace files, not to {source}")
        name, kwargs = parse_spec(source[4:], "generator spec")
        if name not in GENERATORS:
            raise ConfigError(f"unknown generator '{name}'; known: {', '.join(sorted(GENERATORS))}")
        return retimed(GENERATORS[name].fn(**kwargs), **timing)
    if fmt == "native" and source.endswith(".parquet"):
        fmt = "parquet"
    return retimed(load_trace(source, fmt, **loader_kwargs), **timing)


def retimed(
    trace: Trace, time_scale: float | None = None, request_rate: float | None = None
) -> Trace:
    """``trace`` with its arrivals stretched by ``time_scale`` (2: half the rate), or
    stretched so that it offers ``request_rate`` requests per second over its span; the
    trace itself when neither is given. Works on every form (hash ids included): only
    arrival and think times change."""
    if time_scale is not None and request_rate is not None:
        raise ConfigError("give time_scale or request_rate, not both")
    for name, value in (("time_scale", time_scale), ("request_rate", request_rate)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ConfigError(f"{name} must be a positive number, got {value!r}")
    if request_rate is not None:
        rate = trace.request_rate()
        if math.isnan(rate):
            raise ConfigError(
                f"request_rate: the trace's {len(trace):,} requests span no time, so there is "
                "no rate to rescale"
            )
        time_scale = rate / request_rate
    return trace if time_scale is None else trace.time_scaled(float(time_scale))
