"""A registry of named classes: built-ins register by decorator, plugins by entry point.

Block-cache policies and expert-cache policies each keep one. A class registers in its own
module (``@registry.register("lru")``, which also sets ``cls.name``); :meth:`Registry.all`
imports the module that loads every built-in, then, once, the entry points of the family's
group, so third-party packages add classes without touching prefixlab.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from prefixlab.errors import ConfigError
from prefixlab.types import Scalar

C = TypeVar("C", bound=type)
T = TypeVar("T", bound=type)


class Registry(Generic[C]):
    """Classes of one family by name.

    Args:
        what: the family, for messages ("policy", "expert policy").
        builtins: the module whose import registers every built-in class.
        group: the entry-point group third-party classes are loaded from.
    """

    def __init__(self, what: str, builtins: str, group: str) -> None:
        self.what = what
        self.builtins = builtins
        self.group = group
        self.classes: dict[str, C] = {}
        self._plugins_loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register ``cls`` under a stable ``name`` (set as ``cls.name``)."""

        def deco(cls: T) -> T:
            if name in self.classes and self.classes[name] is not cls:
                raise ConfigError(f"{self.what} name '{name}' is registered twice")
            setattr(cls, "name", name)  # noqa: B010  (every family declares a name ClassVar)
            self.classes[name] = cls  # type: ignore[assignment]
            return cls

        return deco

    def lookup(self, name: str) -> C:
        """The class registered as ``name``; an unknown name lists the known ones."""
        known = self.all()
        if name not in known:
            raise ConfigError(f"unknown {self.what} '{name}'; known: {', '.join(known)}")
        return known[name]

    def construct(self, cls: C, spec: str, kwargs: dict[str, Scalar]) -> object:
        """``cls(**kwargs)`` for the spec ``spec``: a parameter the class does not take,
        or a value it refuses, is a ConfigError naming it."""
        name = getattr(cls, "name", spec)
        allowed = parameters(cls)
        for key in kwargs:
            if key not in allowed:
                raise ConfigError(
                    f"{self.what} '{name}' has no parameter '{key}'; it takes: "
                    f"{', '.join(allowed) or 'no parameters'}"
                )
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{self.what} '{spec}': {exc}") from None

    def make(self, spec: str) -> object:
        """An instance from its spec string (``name:key=value,...``)."""
        name, kwargs = parse_spec(spec, f"{self.what} spec")
        return self.construct(self.lookup(name), spec, kwargs)

    def all(self) -> dict[str, C]:
        """Every registered class, built-ins and plugins, sorted by name."""
        importlib.import_module(self.builtins)
        if not self._plugins_loaded:
            self._plugins_loaded = True
            for ep in entry_points(group=self.group):
                ep.load()
        return dict(sorted(self.classes.items()))


def parameters(cls: type[object]) -> dict[str, Scalar]:
    """A class's constructor parameters and their defaults."""
    if cls.__init__ is object.__init__:
        return {}
    sig = inspect.signature(cls.__init__)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n: p.default for n, p in sig.parameters.items() if n != "self" and p.kind in kinds}


def _parse_value(text: str) -> str | int | float | bool:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str, what: str = "policy spec") -> tuple[str, dict[str, Scalar]]:
    """``"s3fifo:small_ratio=0.1,x=2"`` -> ``("s3fifo", {"small_ratio": 0.1, "x": 2})``: the
    ``name:key=value,...`` form of every spec (policies, generators, timing models,
    embedders); values read as booleans, integers, numbers, else text."""
    name, _, rest = spec.strip().partition(":")
    kwargs: dict[str, Scalar] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{what} '{spec}': expected key=value, got '{item}'")
        kwargs[key.strip()] = _parse_value(value.strip())
    return name, kwargs
