"""The engine runner: discrete-event continuous batching over a shared KV pool."""

from prefixlab.runner.engine.events import (
    Arrived,
    EngineEvent,
    Finished,
    FirstToken,
    Preempted,
    Scheduled,
    StepDone,
)
from prefixlab.runner.engine.loop import EventLoop
from prefixlab.runner.engine.simulator import EngineConfig, EngineResult, simulate

__all__ = [
    "Arrived",
    "EngineConfig",
    "EngineEvent",
    "EngineResult",
    "EventLoop",
    "Finished",
    "FirstToken",
    "Preempted",
    "Scheduled",
    "StepDone",
    "simulate",
]
