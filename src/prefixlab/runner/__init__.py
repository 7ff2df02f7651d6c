"""Runners drive a cache structure with a trace."""

from prefixlab.runner.replay import ReplayConfig, ReplayResult, build_cache, replay

__all__ = ["ReplayConfig", "ReplayResult", "build_cache", "replay"]
