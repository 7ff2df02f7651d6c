"""What a block or radix cache shows its policy (:class:`EntryView`) and asks of it
(:class:`CachePolicy`, whose built-in base is :class:`prefixlab.policies.base.
EvictionPolicy`; :class:`BlockAdmission`, whose built-in base is
:class:`prefixlab.policies.block_admission.Admission`). The cache layer names these here so
that it imports no policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from prefixlab.cache.events import Admitted, Observer, Rejected
from prefixlab.types import I64


class EntryView:
    """Entry metadata a structure exposes to its policy (read-only for policies).

    Attributes are arrays indexed by entry id. ``key`` is the dense key id (-1 when the
    entry holds none); ``depth`` the block index of the entry in its sequence (block cache)
    or the number of pages from the root to the node's end (radix); ``size`` its tokens;
    ``parent`` its prefix parent entry or -1; ``is_primary`` whether a lookup of its key
    takes this entry (False for a duplicate holder); ``now`` the structure's current time.
    """

    def __init__(self, num_entries: int) -> None:
        self.num_entries = num_entries
        self.key = np.full(num_entries, -1, dtype=np.int64)
        self.depth = np.zeros(num_entries, dtype=np.int64)
        self.size = np.zeros(num_entries, dtype=np.int64)
        self.parent = np.full(num_entries, -1, dtype=np.int64)
        self.created = np.zeros(num_entries, dtype=np.float64)
        self.last_access = np.zeros(num_entries, dtype=np.float64)
        self.hits = np.zeros(num_entries, dtype=np.int64)
        self.ref = np.zeros(num_entries, dtype=np.int64)
        self.is_primary = np.ones(num_entries, dtype=bool)
        self.now = 0.0
        self.request_index = 0

    def grow(self, num_entries: int) -> None:
        """Enlarge every array (radix trees allocate node ids as they grow)."""
        for name, fill in (
            ("key", -1),
            ("depth", 0),
            ("size", 0),
            ("parent", -1),
            ("created", 0),
            ("last_access", 0),
            ("hits", 0),
            ("ref", 0),
            ("is_primary", True),
        ):
            old = getattr(self, name)
            new = np.full(num_entries, fill, dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)
        self.num_entries = num_entries


class CachePolicy(Protocol):
    """The hooks a block or radix cache calls (DESIGN §3): told of every insertion, access,
    pin, release, update, split, removal and missed key, it picks ``n`` victims."""

    @property
    def name(self) -> str: ...
    @property
    def structures(self) -> frozenset[str]: ...
    @property
    def reads_access_metadata(self) -> bool: ...

    def bind(self, view: EntryView) -> None: ...
    def on_insert(self, entries: I64) -> None: ...
    def on_access(self, entries: I64) -> None: ...
    def on_pinned(self, entries: I64) -> None: ...
    def on_evictable(self, entries: I64) -> None: ...
    def on_remove(self, entries: I64) -> None: ...
    def on_update(self, entries: I64) -> None: ...
    def on_miss(self, keys: I64) -> None: ...
    def on_split(self, upper: int, lower: int) -> None: ...
    def evict(self, n: int) -> I64: ...


@dataclass(slots=True, frozen=True)
class AdmitContext:
    """What an admission sees besides the candidate blocks: the request, the cache's
    clock, and where the candidates start in the request's sequence (in blocks)."""

    request: int
    now: float
    first_depth: int
    #: False: the candidates follow a block of the request that was refused (an engine
    #: caching blocks as prefill computes them asks again for the next ones): none can be
    #: cached whatever the answer; they are shown so that an admission counting
    #: computations sees every block
    open: bool = True


class BlockAdmission(Protocol):
    """DESIGN §3's ``admit(candidate, context) -> bool``, asked once per insertion for a
    request's new blocks in prefix order: how many of them, from the first, to store.

    A block's key names its whole prefix, so storing block *i* without block *i - 1* gives
    a key no lookup reaches: an admission keeps a prefix of the candidates. The cache emits
    ``Admitted`` with the stored keys and ``Rejected`` with the rest; a rejected block stays
    with its request, keyless, and returns to the free pool when the request ends."""

    @property
    def name(self) -> str: ...

    def admit(self, keys: I64, context: AdmitContext) -> int: ...


def ask_admission(
    admission: BlockAdmission | None,
    candidates: I64,
    context: AdmitContext,
    block_tokens: int,
    observers: Sequence[Observer],
) -> int:
    """How many of a request's new blocks ``candidates`` (in prefix order) ``admission``
    takes (all of them when it is None); tells ``observers`` ``Admitted`` and, when it
    refuses some, ``Rejected``."""
    n = int(candidates.shape[0])
    k = n if admission is None or not n else int(admission.admit(candidates, context))
    if not 0 <= k <= n:
        name = admission.name if admission is not None else "all"
        raise AssertionError(f"admission '{name}' admitted {k} of {n} candidate blocks")
    if not context.open:
        k = 0
    if observers and n:
        events: list[Admitted | Rejected] = []
        if k:
            events.append(Admitted(candidates[:k].copy(), k * block_tokens))
        if k < n:
            events.append(Rejected(candidates[k:].copy(), (n - k) * block_tokens))
        for event in events:
            for obs in observers:
                obs.on_event(event)
    return k
