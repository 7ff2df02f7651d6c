"""Trace loaders: each streams one file format into :class:`~prefixlab.workload.Trace` rows.

Importing this package registers every built-in loader (``--format`` choices).
"""

from prefixlab.workload.loaders import (  # noqa: F401
    agents,
    azure,
    bailian,
    conversations,
    marconi,
    mooncake,
    native,
    parquet,
)
from prefixlab.workload.loaders.base import (
    LOADERS,
    Header,
    LoadOptions,
    iter_requests,
    load_trace,
    register_loader,
)
from prefixlab.workload.loaders.parquet import write_parquet

__all__ = [
    "LOADERS",
    "Header",
    "LoadOptions",
    "iter_requests",
    "load_trace",
    "register_loader",
    "write_parquet",
]
