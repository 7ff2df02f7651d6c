"""Eviction policies: one module each, registered by name."""

from prefixlab.policies.base import (
    EntryView,
    EvictionPolicy,
    PerEntryPolicy,
    PriorityPolicy,
    make_policy,
    parse_spec,
    register,
    registered,
)

__all__ = [
    "EntryView",
    "EvictionPolicy",
    "PerEntryPolicy",
    "PriorityPolicy",
    "make_policy",
    "parse_spec",
    "register",
    "registered",
]
