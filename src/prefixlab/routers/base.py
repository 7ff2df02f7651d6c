"""Routers: which replica of a fleet serves each arrival.

A router sees what a real one sees and nothing more: the request (its session id and its
prompt, as block keys of its tokens), the clock, and the answers of the requests it routed
(when each one's first token came back and when it finished), from which
:class:`Loads` keeps each replica's outstanding requests and prefill tokens. It never reads
a replica's cache or queue.

A router registers by name (``@register("round-robin")``) and is built from a spec string
(``power-of-two:seed=3``), as policies are; a third-party package adds one through the
``prefixlab.routers`` entry-point group.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import numpy as np

from prefixlab.registry import Registry
from prefixlab.types import F64, I64, Scalar
from prefixlab.workload.trace import BlockLayout, Trace


@dataclass(slots=True)
class Loads:
    """Per replica, what the router knows from its own requests: those outstanding (routed,
    not finished) and the prompt tokens of those still waiting for their first token."""

    outstanding: I64
    prefill_tokens: I64

    @classmethod
    def empty(cls, replicas: int) -> Loads:
        return cls(np.zeros(replicas, np.int64), np.zeros(replicas, np.int64))


@dataclass(slots=True)
class Fleet:
    """What a router is given once: the number of replicas, the requests' columns it may
    read (session ids, prompt lengths, block keys) and the loads it may consult."""

    replicas: int
    trace: Trace
    layout: BlockLayout
    loads: Loads

    def prompt_keys(self, r: int) -> I64:
        """The block keys of request ``r``'s prompt (its full input blocks)."""
        keys = self.layout.request_keys(r)
        return keys[: int(self.trace.input_length[r]) // self.layout.block_tokens]


class Router:
    """Base: override :meth:`route`; :meth:`bind` is called once before the first."""

    name: ClassVar[str] = "base"
    #: True: the fleet tells :meth:`kv_event` of every block a replica stores or drops, as
    #: vLLM's and SGLang's KV events do (``BlockStored``, ``BlockRemoved``)
    reads_kv_events: ClassVar[bool] = False
    #: what the router's choices depend on: "replicas" (loads, answers or KV events: it
    #: routes as the simulation goes), "order" (the requests and the order they arrive in)
    #: or "request" (each request alone). The fleet routes the last two ahead and runs
    #: the replicas apart, compiled (:mod:`prefixlab.runner.fleet_split`). A subclass
    #: inherits it: one that reads the loads must set it back to "replicas".
    depends_on: ClassVar[str] = "replicas"

    def bind(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def route(self, r: int, now: float) -> int:
        """The replica (0-based) that serves request ``r``, arriving at ``now``."""
        raise NotImplementedError

    def routed(self, r: int, replica: int, now: float) -> None:
        """Told after the fleet gave ``r`` to ``replica`` (the loads already count it)."""

    def answered(self, r: int, replica: int, now: float) -> None:
        """Told when ``r``'s first token came back from ``replica``."""

    def finished(self, r: int, replica: int, now: float) -> None:
        """Told when ``r`` finished on ``replica`` (the loads no longer count it)."""

    def kv_event(self, replica: int, keys: I64, stored: bool, now: float) -> None:
        """Told (when :attr:`reads_kv_events`) that ``replica`` stored (or dropped) the
        blocks of these keys at ``now``."""

    def compiled(self) -> tuple[int, F64] | None:
        """The router as the fleet's compiled kernel runs it: its code and parameters
        (:mod:`prefixlab.routers._compiled`), or None (the default) to route on the
        reference loop. A subclass that changes what :meth:`route` does returns None."""
        return None

    def draws(self, count: int) -> I64:
        """What :meth:`route` would draw for its next ``count`` calls, one row per call in
        order (the compiled router's: power-of-two's pairs; round-robin's and random's
        choices); none by default."""
        return np.zeros((0, 2), np.int64)

    def params(self) -> dict[str, Scalar]:
        return {}

    def spec(self) -> str:
        p = self.params()
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in p.items()) if p else "")


class SeededRouter(Router):
    """Base of a router that draws (``random``, ``power-of-two``) or hashes (``session``)
    with a seed: the same seed, the same choices."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_seed(seed)

    def bind(self, fleet: Fleet) -> None:
        super().bind(fleet)
        self.rng = np.random.default_rng(self.seed)

    def params(self) -> dict[str, Scalar]:
        return {"seed": self.seed}


def leading_run(keys: list[int], held: Container[int]) -> int:
    """How many of ``keys``, from the first, are in ``held`` (a prefix match: a block key
    names its whole prefix)."""
    n = 0
    while n < len(keys) and keys[n] in held:
        n += 1
    return n


def least(values: I64, among: I64 | None = None) -> int:
    """The index of the smallest value (of ``among`` when given), ties to the lowest."""
    if among is None:
        return int(np.argmin(values))
    return int(among[int(np.argmin(values[among]))])


def check_seed(seed: object) -> int:
    """A router's seed, refused unless an integer."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return seed


def stable_hash(text: str, seed: int = 0) -> int:
    """A 64-bit hash of a string, the same in every process and run."""
    digest = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


R = TypeVar("R", bound=type[Router])
_REGISTRY: Registry[type[Router]] = Registry(
    "router", "prefixlab.routers.builtin", "prefixlab.routers"
)


def register(name: str) -> Callable[[R], R]:
    """Class decorator: register a router under a stable name."""
    return _REGISTRY.register(name)


def registered() -> dict[str, type[Router]]:
    """Every registered router, built-ins and third-party entry points."""
    return _REGISTRY.all()


def make_router(spec: str) -> Router:
    """A router from its spec string (``"power-of-two:seed=1"``); errors name the bad part."""
    router = _REGISTRY.make(spec)
    assert isinstance(router, Router)
    return router
