"""Workloads: requests, traces, block hashing, loaders and generators."""

from prefixlab.workload.loaders import load_trace
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.trace import BlockLayout, Request, Trace

__all__ = ["BlockLayout", "Request", "Trace", "load_trace", "write_native"]
