"""Expert-cache policy protocol, the per-layer partition rule and the registry.

The simulator (:mod:`prefixlab.experts.simulate`) owns residency: which pages are cached,
how many, and whether a request faults. A policy only *ranks*: it hears about hits and
insertions and, when the cache (or, for a partitioned policy, the requested page's layer)
is full, names the victim::

    t = 0, 1, 2 ...   page p = layer * n + expert, layer = t mod l
    resident(p)?  yes -> on_hit(p, t)
                  no  -> fault; if full: v = victim(p, t) (a resident page, forgotten)
                         then on_insert(p, t)

Time ``t`` is the request index. A policy may instead offer ``run_fast``: its decisions
over the whole trace from a kernel (:mod:`prefixlab.experts._kernels`), compiled with numba
or interpreted. Every built-in policy is a kernel only, its one implementation; the hooks
are the way to write a new policy in plain Python (the slower path).

Policies are registered by decorator under a stable name and built from spec strings such
as ``"marking:seed=3"``; parameters are the constructor arguments (river style), so
``params()``, ``clone()`` and ``spec()`` are generic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.experts._kernels import KernelRun
from prefixlab.policies.base import describe as _describe
from prefixlab.registry import Registry
from prefixlab.registry import parameters as _parameters
from prefixlab.registry import parse_spec as _parse_spec
from prefixlab.types import I64

ParamValue = int | float | bool | str | None

__all__ = [
    "ExpertPolicy",
    "KernelRun",
    "PolicyContext",
    "describe",
    "layer_shares",
    "make_policy",
    "parameters",
    "parse_spec",
    "register",
    "registered",
]


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy knows about a run.

    Attributes:
        capacity: cache size in pages (for a partitioned policy's inner policies: the
            layer's share).
        num_layers: l; request ``t`` belongs to layer ``t mod l``.
        num_experts: n, experts per layer (page = layer * n + expert).
        pages: the whole request sequence; only offline policies (``needs_future``) read
            past the current request.
    """

    capacity: int
    num_layers: int
    num_experts: int
    pages: I64


def layer_shares(capacity: int, num_layers: int) -> I64:
    """The fixed per-layer shares of a ``-dist`` policy.

    Each layer gets ``capacity // num_layers`` pages and the first ``capacity % num_layers``
    layers one more, so the shares sum to the capacity::

        capacity 10, 4 layers -> [3, 3, 2, 2]

    Raises:
        ConfigError: if ``capacity < num_layers``: some layer would get no page at all and
            could never hold the page it requests (demand paging needs it resident).
    """
    if capacity < num_layers:
        raise ConfigError(
            f"capacity={capacity} is below num_layers={num_layers}: a per-layer partition "
            f"('-dist' policy) gives each layer capacity // num_layers pages, so some layer "
            f"would get none and could not hold the page it requests"
        )
    shares = np.full(num_layers, capacity // num_layers, dtype=np.int64)
    shares[: capacity % num_layers] += 1
    return shares


class ExpertPolicy:
    """Base class: hooks for the simulator's Python loop plus the generic parameter protocol.

    A plain-Python policy keeps its own order of the resident pages and implements
    ``reset``, ``on_hit``, ``on_insert``, ``victim`` and ``tracked``; a built-in implements
    ``run_fast`` only. Subclass this class, not a built-in, to write a policy with hooks.
    """

    name: ClassVar[str] = "base"
    _HOOKS: ClassVar[tuple[str, ...]] = ("reset", "on_hit", "on_insert", "victim")
    #: reads future requests (offline policies such as OPT)
    needs_future: ClassVar[bool] = False
    #: splits the cache into fixed per-layer shares (:func:`layer_shares`)
    partitioned: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass that changes a hook but not run_fast must not inherit its parent's
        # kernel, which would silently replay the parent's decisions instead.
        if "run_fast" not in cls.__dict__ and any(h in cls.__dict__ for h in cls._HOOKS):
            cls.run_fast = ExpertPolicy.run_fast  # type: ignore[method-assign]

    def reset(self, ctx: PolicyContext) -> None:
        """Start a run: forget every page (the cache starts empty)."""
        raise NotImplementedError

    def on_hit(self, page: int, t: int) -> None:
        """``page`` (resident) was requested at time ``t``."""

    def on_insert(self, page: int, t: int) -> None:
        """``page`` faulted at time ``t`` and is now resident."""
        raise NotImplementedError

    def victim(self, page: int, t: int) -> int:
        """Choose and forget a resident page to make room for ``page`` (requested at ``t``,
        not resident). A partitioned policy must choose in ``page``'s layer."""
        raise NotImplementedError

    def tracked(self) -> list[int]:
        """The pages the policy believes resident (invariant checks compare it with the
        simulator's view)."""
        raise NotImplementedError

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun | None:
        """The whole run through the policy's kernel, or None when it has none (then the
        simulator drives the hooks). ``compiled=False`` runs the same kernel interpreted."""
        return None

    def shares(self, capacity: int, num_layers: int) -> I64 | None:
        """Per-layer capacities, or None for one cache shared by all layers."""
        return layer_shares(capacity, num_layers) if self.partitioned else None

    def resolve(self, seed: int) -> ExpertPolicy:
        """This policy with every parameter fixed (randomised policies take ``seed`` when
        their own is unset); deterministic policies return themselves."""
        return self

    # --------------------------------------------------------------- parameters
    def params(self) -> dict[str, ParamValue]:
        """Constructor arguments, each stored under its own name."""
        return {name: getattr(self, name) for name in parameters(type(self))}

    def clone(self) -> ExpertPolicy:
        """A fresh policy with the same parameters."""
        return type(self)(**self.params())

    def spec(self) -> str:
        """The spec string that rebuilds this policy (``name:k=v,...``); unset parameters
        are left out."""
        p = {k: v for k, v in self.params().items() if v is not None}
        if not p:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in p.items())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


# ------------------------------------------------------------------------ registry
P = TypeVar("P", bound=type[ExpertPolicy])
ENTRY_POINT_GROUP = "prefixlab.expert_policies"
_REGISTRY: Registry[type[ExpertPolicy]] = Registry(
    "expert policy", "prefixlab.experts.policies", ENTRY_POINT_GROUP
)
POLICIES = _REGISTRY.classes


def register(name: str) -> Callable[[P], P]:
    """Class decorator: register an expert-cache policy under a stable name."""
    return _REGISTRY.register(name)


def registered() -> dict[str, type[ExpertPolicy]]:
    """Every registered expert policy, built-ins and third-party entry points, by name."""
    return _REGISTRY.all()


def describe(cls: type[ExpertPolicy]) -> str:
    """One-line description: the first line of the class docstring."""
    return _describe(cls)


def parameters(cls: type[ExpertPolicy]) -> dict[str, ParamValue]:
    """Constructor parameters and their defaults."""
    return _parameters(cls)


def parse_spec(spec: str) -> tuple[str, dict[str, ParamValue]]:
    """``"marking:seed=3"`` -> ``("marking", {"seed": 3})`` (the block policies' syntax)."""
    name, kwargs = _parse_spec(spec, "expert policy spec")
    return name.strip(), kwargs


def make_policy(spec: str) -> ExpertPolicy:
    """Build a policy from its spec string, with errors that name the bad part.

    Raises:
        ConfigError: unknown policy name, unknown parameter, or a bad parameter value.
    """
    name, kwargs = parse_spec(spec)
    pol = _REGISTRY.construct(_REGISTRY.lookup(name), spec, kwargs)
    assert isinstance(pol, ExpertPolicy)
    return pol
