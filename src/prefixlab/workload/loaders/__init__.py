"""Trace loaders: each streams one file format into :class:`~prefixlab.workload.Trace` rows.

Importing this package registers every built-in loader (``--format`` choices).
"""

from prefixlab.workload.loaders import azure, bailian, marconi, mooncake, native  # noqa: F401
from prefixlab.workload.loaders.base import (
    LOADERS,
    Header,
    LoadOptions,
    iter_requests,
    load_trace,
    register_loader,
)

__all__ = ["LOADERS", "Header", "LoadOptions", "iter_requests", "load_trace", "register_loader"]
