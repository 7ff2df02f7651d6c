"""Errors raised for user mistakes: they name what is wrong and where."""

from __future__ import annotations


class PrefixlabError(Exception):
    """Base class of every error prefixlab raises for bad input or configuration."""


class TraceFormatError(PrefixlabError):
    """A trace file has a malformed line.

    The message names the file, the 1-based line number and the field, so a user can fix
    the input without reading the simulator's code.
    """

    def __init__(
        self,
        path: str,
        line: int | None,
        field: str | None,
        message: str,
        row: int | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.row = row
        self.field = field
        #: the rule broken, without the place (the same words for every format)
        self.reason = message
        where = f"{path}:{line}" if line else path
        if row is not None:  # a columnar file (Parquet) has rows, 0-based, not lines
            where = f"{path}: row {row}"
        what = f"field '{field}': {message}" if field else message
        super().__init__(f"{where}: {what}")

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[object, ...]]:
        """Pickled with its parts (a worker process or Ray hands it back whole)."""
        return (type(self), (self.path, self.line, self.field, self.reason, self.row))


class ConfigError(PrefixlabError):
    """An impossible or unknown configuration value (names the value and says why)."""


class CapacityError(PrefixlabError):
    """A request cannot fit in the cache even after evicting every unpinned entry."""
