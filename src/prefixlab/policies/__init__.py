"""Cache policies: one module each, registered by name (eviction for the block and radix
caches, :mod:`~prefixlab.policies.hybrid` for the hybrid cache, admission objects)."""

from prefixlab.cache.view import EntryView
from prefixlab.policies.base import (
    EvictionPolicy,
    PerEntryPolicy,
    Policy,
    PriorityPolicy,
    make_eviction_policy,
    make_policy,
    register,
    registered,
)
from prefixlab.registry import parse_spec

__all__ = [
    "EntryView",
    "EvictionPolicy",
    "PerEntryPolicy",
    "Policy",
    "PriorityPolicy",
    "make_eviction_policy",
    "make_policy",
    "parse_spec",
    "register",
    "registered",
]
