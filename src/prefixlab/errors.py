"""Errors raised for user mistakes: they name what is wrong and where."""

from __future__ import annotations


class PrefixlabError(Exception):
    """Base class of every error prefixlab raises for bad input or configuration."""


class TraceFormatError(PrefixlabError):
    """A trace file has a malformed line.

    The message names the file, the 1-based line number and the field, so a user can fix
    the input without reading the simulator's code.
    """

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        where = f"{path}:{line}" if line else path
        what = f"field '{field}': {message}" if field else message
        super().__init__(f"{where}: {what}")


class ConfigError(PrefixlabError):
    """An impossible or unknown configuration value (names the value and says why)."""


class CapacityError(PrefixlabError):
    """A request cannot fit in the cache even after evicting every unpinned entry."""
