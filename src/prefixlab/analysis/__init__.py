"""Trace analysis: statistics and reuse."""

from prefixlab.analysis.stats import trace_stats

__all__ = ["trace_stats"]
