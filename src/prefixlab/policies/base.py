"""Eviction-policy protocol, adapters and the registry.

A cache structure owns every byte of bookkeeping; a policy only *ranks*. Entries are small
integers (a physical block id, a radix node id). The structure tells the policy what happens
to entries, in batches (numpy int arrays, in the order the events happened)::

    on_insert(e)     new entries (pinned: a request is using them)
    on_access(e)     entries hit by a request (they get pinned next)
    on_pinned(e)     ref count left 0: no longer evictable
    on_evictable(e)  ref count reached 0: evictable, in release order
    on_remove(e)     the structure dropped entries itself (not through evict)
    on_update(e)     metadata (key, size) changed without an access (a radix edge split)
    on_split(u, l)   a radix split made entry u the upper part of l: u takes l's age
    on_miss(keys)    a request is about to insert these keys it missed (before any eviction
                     for it), so ghost-driven policies (ARC, LeCaR) adapt first, as in
                     their papers
    evict(n)         choose n evictable entries, forget them, return them in eviction order

Three ways to write a policy, from fastest to simplest:

* subclass :class:`EvictionPolicy` and implement the batch hooks with numpy (``lru``, ``vllm``);
* subclass :class:`PerEntryPolicy` and implement per-entry hooks plus ``pop_victim``;
* subclass :class:`PriorityPolicy` and implement ``priority(e)`` only (SGLang style): the
  lowest priority among evictable entries is evicted first.

Policies read entry metadata through the read-only :class:`EntryView` the structure binds.
"""

from __future__ import annotations

import heapq
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, TypedDict, TypeVar

import numpy as np

from prefixlab.cache.view import EntryView
from prefixlab.errors import ConfigError
from prefixlab.registry import Registry, parameters, parse_spec
from prefixlab.types import F64, I64, Scalar
from prefixlab.workload.trace import BlockLayout, Trace

EMPTY = np.zeros(0, dtype=np.int64)


PolicyT = TypeVar("PolicyT", bound="Policy")
#: a :class:`PriorityPolicy` rank: the lowest is evicted first (tuples compare in order)
Priority = float | tuple[float, ...]


class Policy:
    """Base of every registered policy: a stable name, the structures it applies to, the
    flags runners read, and the parameter protocol (``params``, ``clone``, ``spec``).

    The hooks are the structure's: :class:`EvictionPolicy` for the block and radix caches,
    :class:`prefixlab.policies.hybrid.HybridPolicy` for the hybrid cache; a policy is
    registered for the structures whose protocol it implements, all of it."""

    name: ClassVar[str] = "base"
    #: structures this policy is meaningful on ("block", "radix", "hybrid")
    structures: ClassVar[frozenset[str]] = frozenset({"block", "radix"})
    #: needs the whole trace in advance (offline policies such as OPT)
    needs_future: ClassVar[bool] = False
    #: reads ``last_access`` / ``hits`` of entries; policies that keep their own order set
    #: this to False and the structure skips maintaining them on hits
    reads_access_metadata: ClassVar[bool] = True
    #: wants to see the engine's waiting queue each step (``on_waiting``)
    uses_lookahead: ClassVar[bool] = False
    #: only meaningful under the engine runner (the replay runner refuses it)
    requires_engine: ClassVar[bool] = False
    #: reads the trace itself (``prepare_trace``): LPC's prompts and arrival times
    needs_trace: ClassVar[bool] = False
    #: GPU memory the policy itself takes from the KV cache (LPC's predictor); the runners
    #: deduct it from the capacity, in blocks of the configured model
    reserved_bytes: int = 0

    # --------------------------------------------------------------- parameters
    def params(self) -> dict[str, Scalar]:
        """Constructor arguments, each stored under its own name (river style)."""
        return {name: getattr(self, name) for name in parameters(type(self))}

    def clone(self: PolicyT) -> PolicyT:
        """A fresh, unbound policy with the same parameters."""
        return type(self)(**self.params())

    def spec(self) -> str:
        """The spec string that rebuilds this policy: ``name:k=v,...`` with the parameters
        that differ from their defaults (two policies that differ have different specs)."""
        defaults = parameters(type(self))
        p = {k: v for k, v in self.params().items() if k not in defaults or defaults[k] != v}
        if not p:
            return self.name
        return (
            self.name
            + ":"
            + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items())
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


class EvictionPolicy(Policy):
    """Base of the block and radix caches' policies: batch hooks, all no-ops, and
    :meth:`evict`, which each policy implements."""

    view: EntryView
    _arrival: F64 = np.zeros(0)  # set by prepare_trace (read-only here)
    _clock: str = "view"

    def bind(self, view: EntryView) -> None:
        """Attach to a structure; called once before any hook."""
        self.view = view

    def prepare(self, future: BlockLayout) -> None:
        """Receive the trace's block layout (only policies with ``needs_future`` use it)."""

    def prepare_trace(self, trace: Trace, clock: str) -> None:
        """Receive the trace (only policies with ``needs_trace``). ``clock``: ``"arrival"``
        (replay: the current request's arrival time is the time) or ``"view"`` (engine:
        ``view.now`` is the simulated time). The base keeps what :meth:`now` needs;
        overrides call it."""
        self._arrival = np.asarray(trace.arrival_s, dtype=np.float64)
        self._clock = clock

    def now(self) -> float:
        """The time of the current hook in seconds, for policies with ``needs_trace``: the
        engine's simulated clock, or under replay the current request's arrival time."""
        if self._clock == "arrival" and self._arrival.shape[0]:
            return float(self._arrival[self.view.request_index])
        return float(self.view.now)

    def on_insert(self, entries: I64) -> None: ...
    def on_access(self, entries: I64) -> None: ...
    def on_pinned(self, entries: I64) -> None: ...
    def on_evictable(self, entries: I64) -> None: ...
    def on_remove(self, entries: I64) -> None: ...
    def on_update(self, entries: I64) -> None: ...
    def on_miss(self, keys: I64) -> None: ...

    def on_waiting(self, waiting_keys: Sequence[I64]) -> None:
        """Engine runner only, for policies with ``uses_lookahead``: the lookup block keys
        of every request in the waiting queue, in queue order, before each step's
        admissions (an empty list when nothing waits)."""

    def on_split(self, upper: int, lower: int) -> None:
        """A new entry ``upper`` now holds the first pages of ``lower`` (same age, same
        recency). Default: announce it as an insertion; ordered policies override."""
        self.on_insert(np.array([upper], dtype=np.int64))

    def evict(self, n: int) -> I64:
        """Choose and forget ``n`` evictable entries (fewer only if fewer are evictable)."""
        raise NotImplementedError


class PerEntryPolicy(EvictionPolicy):
    """Adapter: implement per-entry hooks; the batch hooks loop over them."""

    def insert(self, e: int) -> None: ...
    def access(self, e: int) -> None: ...
    def pinned(self, e: int) -> None: ...
    def evictable(self, e: int) -> None: ...
    def remove(self, e: int) -> None: ...

    def pop_victim(self) -> int:
        """Remove and return the next victim (an evictable entry), or -1 if none."""
        raise NotImplementedError

    def on_insert(self, entries: I64) -> None:
        for e in entries.tolist():
            self.insert(e)

    def on_access(self, entries: I64) -> None:
        for e in entries.tolist():
            self.access(e)

    def on_pinned(self, entries: I64) -> None:
        for e in entries.tolist():
            self.pinned(e)

    def on_evictable(self, entries: I64) -> None:
        for e in entries.tolist():
            self.evictable(e)

    def on_remove(self, entries: I64) -> None:
        for e in entries.tolist():
            self.remove(e)

    def evict(self, n: int) -> I64:
        out: list[int] = []
        for _ in range(n):
            e = self.pop_victim()
            if e < 0:
                break
            out.append(e)
        return np.array(out, dtype=np.int64)


class PriorityPolicy(EvictionPolicy):
    """Adapter: implement ``priority(e)``; the lowest priority is evicted first.

    Priorities are computed when an entry becomes evictable (or is accessed while
    evictable); ties go to the entry that became evictable first. A heap with lazy
    invalidation holds the candidates. Override ``priorities`` to rank a batch with numpy.
    """

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        # Heap items: (priority, order it became evictable, version, entry). The order is
        # kept across re-ranks, so ties always go to the entry that became evictable first.
        self._heap: list[tuple[Priority, int, int, int]] = []
        self._token = np.full(view.num_entries, -1, dtype=np.int64)
        self._order = np.zeros(view.num_entries, dtype=np.int64)
        self._free = np.zeros(view.num_entries, dtype=bool)
        self._next_token = 0

    def priority(self, e: int) -> Priority:
        raise NotImplementedError

    def priorities(self, entries: I64) -> list[Priority]:
        """Priorities of a batch (default: ``priority`` entry by entry)."""
        return [self.priority(e) for e in entries.tolist()]

    def _push(self, entries: I64) -> None:
        n = int(entries.shape[0])
        if n == 0:
            return
        tokens = np.arange(self._next_token, self._next_token + n, dtype=np.int64)
        self._next_token += n
        self._token[entries] = tokens
        heap = self._heap
        items = zip(
            self.priorities(entries),
            self._order[entries].tolist(),
            tokens.tolist(),
            entries.tolist(),
            strict=True,
        )
        for item in items:
            heapq.heappush(heap, item)

    def on_evictable(self, entries: I64) -> None:
        self._free[entries] = True
        self._order[entries] = np.arange(self._next_token, self._next_token + entries.shape[0])
        self._push(entries)

    def on_access(self, entries: I64) -> None:
        # Priority may depend on access metadata: re-rank entries that stay evictable.
        self._push(entries[self._free[entries]])

    on_update = on_access

    def on_pinned(self, entries: I64) -> None:
        self._free[entries] = False
        self._token[entries] = -1

    on_remove = on_pinned

    def evict(self, n: int) -> I64:
        out: list[int] = []
        heap, token = self._heap, self._token
        while len(out) < n and heap:
            _, _, tok, e = heapq.heappop(heap)
            if token[e] == tok:
                token[e] = -1
                self._free[e] = False
                out.append(e)
        if len(heap) > 4 * self.view.num_entries + 1024:
            self._heap = [item for item in heap if token[item[3]] == item[2]]
            heapq.heapify(self._heap)
        return np.array(out, dtype=np.int64)


# ------------------------------------------------------------------------ registry
P = TypeVar("P", bound=type[Policy])
_REGISTRY: Registry[type[Policy]] = Registry(
    "policy", "prefixlab.policies.builtin", "prefixlab.policies"
)
POLICIES = _REGISTRY.classes


def register(name: str) -> Callable[[P], P]:
    """Class decorator: register a policy under a stable name."""
    return _REGISTRY.register(name)


def registered() -> dict[str, type[Policy]]:
    """Every registered policy, built-ins and third-party entry points."""
    return _REGISTRY.all()


def describe(cls: type[object]) -> str:
    """One-line description: the first line of the class docstring."""
    return (inspect.getdoc(cls) or "").splitlines()[0] if cls.__doc__ else ""


def make_policy_of(kind: type[PolicyT], spec: str, structure: str | None = None) -> PolicyT:
    """A policy of ``kind`` (:class:`EvictionPolicy` for the block and radix caches,
    ``HybridPolicy`` for the hybrid one) from its spec string; errors name the bad part."""
    pol = make_policy(spec, structure)
    if not isinstance(pol, kind):
        where = ", ".join(sorted(pol.structures))
        raise ConfigError(f"policy '{pol.name}' applies to the {where} structure only")
    return pol


def make_eviction_policy(spec: str, structure: str | None = None) -> EvictionPolicy:
    """A block or radix cache's policy from its spec string (errors name the bad part)."""
    return make_policy_of(EvictionPolicy, spec, structure)


def make_policy(spec: str, structure: str | None = None) -> Policy:
    """Build a policy from its spec string, with errors that name the bad part."""
    name, kwargs = parse_spec(spec)
    cls = _REGISTRY.lookup(name)
    if structure is not None and structure not in cls.structures:
        raise ConfigError(f"policy '{name}' does not apply to the {structure} structure")
    pol = _REGISTRY.construct(cls, spec, kwargs)
    assert isinstance(pol, Policy)
    return pol


def iter_policies() -> Iterator[tuple[str, type[Policy]]]:
    yield from registered().items()


class PolicyEntry(TypedDict):
    """One line of :func:`catalog` (``prefixlab policies --json``)."""

    name: str
    structures: list[str]
    parameters: dict[str, object]
    description: str


def catalog() -> list[PolicyEntry]:
    """Every registered policy: name, structures, parameters (with defaults), description."""
    return [
        PolicyEntry(
            name=name,
            structures=sorted(cls.structures),
            parameters=dict(parameters(cls)),
            description=describe(cls),
        )
        for name, cls in registered().items()
    ]


def catalog_markdown() -> str:
    """The docs' policy table, generated from the registry."""
    lines = [
        "| policy | structures | parameters | description |",
        "|---|---|---|---|",
    ]
    for name, cls in registered().items():
        params = ", ".join(f"`{k}={v}`" for k, v in parameters(cls).items()) or "-"
        lines.append(
            f"| `{name}` | {', '.join(sorted(cls.structures))} | {params} | {describe(cls)} |"
        )
    return "\n".join(lines) + "\n"
