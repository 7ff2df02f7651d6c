"""Trace analysis: statistics and reuse (by session, task, phase, position; gaps; headroom)."""

from prefixlab.analysis.gaps import GapFit, fit_lognormal, lognormal_cdf, session_gaps
from prefixlab.analysis.reuse import (
    Attribution,
    Headroom,
    PhaseReuse,
    PositionReuse,
    ReuseAnalysis,
    analyze_reuse,
    headroom,
    reuse_sources,
)
from prefixlab.analysis.stats import session_prefix_share, trace_stats

__all__ = [
    "Attribution",
    "GapFit",
    "Headroom",
    "PhaseReuse",
    "PositionReuse",
    "ReuseAnalysis",
    "analyze_reuse",
    "fit_lognormal",
    "headroom",
    "lognormal_cdf",
    "reuse_sources",
    "session_gaps",
    "session_prefix_share",
    "trace_stats",
]
