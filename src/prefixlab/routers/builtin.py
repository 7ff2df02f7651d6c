"""Importing this module registers every built-in router."""

from prefixlab.routers import (  # noqa: F401
    cache_aware,
    kv_aware,
    least_loaded,
    power_of_two,
    random_choice,
    round_robin,
    session,
)
