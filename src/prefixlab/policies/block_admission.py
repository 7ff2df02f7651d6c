"""Admission policies of the block and radix caches: which of a request's new blocks to
cache (DESIGN §3, ``admit(candidate, context)``).

Before a block or radix cache stores a request's new full blocks it asks its admission how
many of them, from the first, to keep (:class:`prefixlab.cache.view.BlockAdmission`); it
emits ``Admitted`` for those and ``Rejected`` for the rest, which stay with the request,
keyless, and are freed when it ends.

=========== ======================================================================
admission   blocks a request caches
=========== ======================================================================
``all``     every new full block (vLLM, SGLang: the default)
``seen``    those computed at least ``n`` times so far, counting this time (a
            one-hit-wonder filter: with ``n=2`` libCacheSim's ``bloomfilter``
            admission, with an exact count in place of the Bloom filter)
=========== ======================================================================

The hybrid cache's admissions (``all-blocks``, ``judicious``) place recurrent-state
checkpoints and live in :mod:`prefixlab.policies.admission`.

Admissions register by name like eviction policies; a third-party package adds one through
the ``prefixlab.admissions`` entry-point group. The compiled kernels store every block, so
a replay or simulation with another admission runs on the cache objects (same results).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

import numpy as np

from prefixlab.cache.view import AdmitContext
from prefixlab.errors import ConfigError
from prefixlab.registry import Registry, parse_spec
from prefixlab.types import I64, Scalar

#: the default: every block, as every engine does
DEFAULT = "all"


class Admission:
    """Base: admit every candidate (subclass and override :meth:`admit`)."""

    name: ClassVar[str] = "base"

    def admit(self, keys: I64, context: AdmitContext) -> int:
        """How many of ``keys`` (a request's new blocks, in prefix order), from the first,
        to cache."""
        return int(keys.shape[0])

    def params(self) -> dict[str, Scalar]:
        """The constructor parameters, for :meth:`spec`."""
        return {}

    def spec(self) -> str:
        """The spec string that builds this admission again."""
        p = self.params()
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in p.items()) if p else "")


A = TypeVar("A", bound=type[Admission])
_REGISTRY: Registry[type[Admission]] = Registry(
    "admission", "prefixlab.policies.block_admission", "prefixlab.admissions"
)


def register(name: str) -> Callable[[A], A]:
    """Class decorator: register an admission under a stable name."""
    return _REGISTRY.register(name)


def registered() -> dict[str, type[Admission]]:
    """Every registered admission, built-ins and third-party entry points."""
    return _REGISTRY.all()


@register("all")
class AdmitAll(Admission):
    """Cache every new full block (vLLM and SGLang)."""


@register("seen")
class Seen(Admission):
    """Cache a block from the ``n``-th time it is computed (one-hit-wonder filter)."""

    def __init__(self, n: int = 2) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        self.n = n
        self._count = np.zeros(0, dtype=np.int64)

    def params(self) -> dict[str, Scalar]:
        return {"n": self.n}

    def admit(self, keys: I64, context: AdmitContext) -> int:
        top = int(keys.max()) + 1
        if top > self._count.shape[0]:
            grown = np.zeros(max(top, 2 * self._count.shape[0]), dtype=np.int64)
            grown[: self._count.shape[0]] = self._count
            self._count = grown
        # Every candidate was computed (each key appears once in a request's blocks).
        self._count[keys] += 1
        short = np.flatnonzero(self._count[keys] < self.n)
        return int(short[0]) if short.shape[0] else int(keys.shape[0])


def is_default(spec: str | None) -> bool:
    """Whether ``spec`` (None: the default) caches every block."""
    return spec is None or parse_spec(spec, "admission spec") == (DEFAULT, {})


def check_structure(spec: str, structure: str) -> None:
    """Refuse an admission other than the default on the hybrid structure, whose
    admission belongs to its policy."""
    if structure == "hybrid" and not is_default(spec):
        raise ConfigError(
            f"admission '{spec}' applies to the block and radix structures; the hybrid "
            "structure's admission is its policy's (vllm+: all-blocks, marconi: judicious)"
        )


def make_admission(spec: str) -> Admission:
    """An admission from its spec string (``"seen:n=3"``), with errors naming the bad part."""
    admission = _REGISTRY.make(spec)
    assert isinstance(admission, Admission)
    return admission
