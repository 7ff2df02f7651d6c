"""Importing this module registers every built-in reproduction."""

from prefixlab.reproduce import (
    lpc,  # noqa: F401
    moe,  # noqa: F401
)
