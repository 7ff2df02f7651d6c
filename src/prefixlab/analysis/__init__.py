"""Trace analysis: statistics and reuse."""

from prefixlab.analysis.stats import session_prefix_share, trace_stats

__all__ = ["session_prefix_share", "trace_stats"]
