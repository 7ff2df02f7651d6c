"""Importing this module registers every built-in reproduction."""

from prefixlab.reproduce import (
    hashtable,  # noqa: F401
    lpc,  # noqa: F401
    marconi,  # noqa: F401
    moe,  # noqa: F401
    unicache,  # noqa: F401
)
