"""Trace loaders: each reads one file format into a :class:`~prefixlab.workload.Trace`."""

from prefixlab.workload.loaders.base import LOADERS, load_trace, register_loader

__all__ = ["LOADERS", "load_trace", "register_loader"]
