"""Seeded workload generators, registered by name (``gen:NAME:k=v,...`` trace sources)."""

from __future__ import annotations

from collections.abc import Callable

from prefixlab.workload.generators.sessions import SessionParams, generate_sessions
from prefixlab.workload.trace import Trace

GENERATORS: dict[str, Callable[..., Trace]] = {"sessions": generate_sessions}

__all__ = ["GENERATORS", "SessionParams", "generate_sessions"]
