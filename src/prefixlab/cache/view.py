"""What a block or radix cache shows its policy (:class:`EntryView`) and asks of it
(:class:`CachePolicy`, whose built-in base is :class:`prefixlab.policies.base.
EvictionPolicy`). The cache layer names these here so that it imports no policy."""

from __future__ import annotations

from typing import Protocol

import numpy as np

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
