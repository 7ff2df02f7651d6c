"""Metrics: observers of cache and runner events, and their summaries."""

from prefixlab.metrics.replay import ReplayMetrics

__all__ = ["ReplayMetrics"]
