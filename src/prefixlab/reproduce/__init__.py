"""Reproductions of the papers' tables and figures (``prefixlab reproduce``).

Each reproduction follows its paper's setup, read from ``../shared/papers/``, writes our
numbers, a figure drawn like the paper's, and the paper's claims beside ours
(:mod:`prefixlab.reproduce.base`); ``docs/reproductions.md`` keeps the side-by-side.
"""

from prefixlab.reproduce.base import (
    SCALES,
    Claim,
    Outcome,
    Reproduction,
    Row,
    Scale,
    check_scale,
    get_reproduction,
    register,
    reproductions,
    write_outcome,
)

__all__ = [
    "SCALES",
    "Claim",
    "Outcome",
    "Reproduction",
    "Row",
    "Scale",
    "check_scale",
    "get_reproduction",
    "register",
    "reproductions",
    "write_outcome",
]
