"""Trace loaders: each reads one file format into a :class:`~prefixlab.workload.Trace`.

Importing this package registers every built-in loader (``--format`` choices).
"""

from prefixlab.workload.loaders import azure, bailian, marconi, mooncake, native  # noqa: F401
from prefixlab.workload.loaders.base import LOADERS, load_trace, register_loader

__all__ = ["LOADERS", "load_trace", "register_loader"]
