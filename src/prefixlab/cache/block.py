"""Block cache with vLLM v1 semantics (chained block keys, ref counts, a free pool).

The pool has ``capacity_blocks`` physical blocks. Each is in exactly one state::

    empty        no key, ref 0        reused first (vLLM prepends hashless blocks)
    cached-free  key,    ref 0        evictable; the policy orders them
    pinned       ref > 0              held by running requests; never evicted

A request's life: ``match`` (longest run of cached keys from block 0) -> ``acquire`` (pin
the hits, take new blocks: empty ones first, then policy victims) -> ``commit`` (its full
blocks get their keys) -> ``release`` (tail first: the deepest block becomes evictable
first). A key may be held by several blocks (vLLM does not de-duplicate: a block recomputed
because of the recompute cap, or because an ancestor was evicted, is cached again); a lookup
takes the earliest-registered holder still present.

All per-request work is a few numpy calls on the request's block arrays; only duplicate
keys (rare) take a Python path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prefixlab.cache.events import MatchResult, Observer, Removed, Stored
from prefixlab.cache.view import (
    AdmitContext,
    BlockAdmission,
    CachePolicy,
    EntryView,
    ask_admission,
)
from prefixlab.errors import ConfigError
from prefixlab.types import I64


class BlockCache:
    """vLLM-style prefix cache over a fixed pool of physical blocks."""

    structure = "block"

    def __init__(
        self,
        capacity_blocks: int,
        policy: CachePolicy,
        num_keys: int,
        *,
        block_tokens: int = 16,
        max_free_blocks: int | None = None,
        observers: Sequence[Observer] = (),
        admission: BlockAdmission | None = None,
    ) -> None:
        if capacity_blocks <= 0:
            raise ConfigError(f"capacity_blocks must be positive, got {capacity_blocks}")
        if max_free_blocks is not None and max_free_blocks < 0:
            raise ConfigError(f"max_free_blocks must be >= 0, got {max_free_blocks}")
        if "block" not in policy.structures:
            raise ConfigError(f"policy '{policy.name}' does not apply to the block cache")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.max_free_blocks = max_free_blocks
        self.policy = policy
        #: asked before new blocks are cached (None: every full block, as vLLM does)
        self.admission = admission
        # Per-hit metadata costs two passes per block: keep it only for policies that read it.
        self._track_access = policy.reads_access_metadata
        self.view = EntryView(capacity_blocks)
        self.view.size[:] = block_tokens
        policy.bind(self.view)
        self.key_block = np.full(max(num_keys, 1), -1, dtype=np.int64)
        self._has_dup = np.zeros(max(num_keys, 1), dtype=bool)
        self._dups: dict[int, list[int]] = {}
        # Empty blocks as a stack whose top (the end) is the front of vLLM's free queue.
        self._empty = np.arange(capacity_blocks - 1, -1, -1, dtype=np.int64)
        self._num_empty = capacity_blocks
        self.num_cached_free = 0
        self.observers = list(observers)

    # ------------------------------------------------------------------ lookup
    def match(self, keys: I64, block_tokens_end: int | None = None) -> MatchResult:
        """Longest run of cached keys from the first one (``keys`` = lookup keys)."""
        holders = self.key_block[keys]
        misses = np.flatnonzero(holders < 0)
        n = int(misses[0]) if misses.size else int(keys.shape[0])
        if n == keys.shape[0] and block_tokens_end is not None:
            tokens = block_tokens_end
        else:
            tokens = n * self.block_tokens
        return MatchResult(n, tokens, holders[:n])

    def num_available(self) -> int:
        """Blocks a new request could take now (empty + evictable)."""
        return self._num_empty + self.num_cached_free

    # ------------------------------------------------------------------ lifecycle
    def acquire(
        self, match: MatchResult, num_blocks: int, miss_keys: I64 | None = None
    ) -> I64 | None:
        """Pin the hit blocks and take ``num_blocks - hits`` new ones.

        ``miss_keys`` (the keys the request will cache that it missed) are announced to the
        policy before any eviction. Returns every block the request holds, in position
        order, or ``None`` when it cannot fit even after evicting every unpinned block
        (nothing is changed then).
        """
        v = self.view
        hits = match.entries
        need = num_blocks - int(hits.shape[0])
        refs = v.ref[hits]
        free_mask = refs == 0
        hit_free = hits if free_mask.all() else hits[free_mask]
        if need > self._num_empty + self.num_cached_free - int(hit_free.shape[0]):
            return None
        if hits.shape[0]:
            self.policy.on_access(hits)
            if hit_free.shape[0]:
                self.policy.on_pinned(hit_free)
                self.num_cached_free -= int(hit_free.shape[0])
            v.ref[hits] = refs + 1
            if self._track_access:
                v.last_access[hits] = v.now
                v.hits[hits] += 1
        if miss_keys is not None and miss_keys.shape[0]:
            self.policy.on_miss(miss_keys)
        fresh = self._take(need)
        return np.concatenate([hits, fresh]) if hits.shape[0] else fresh

    def grow(self, held: I64, num_blocks: int) -> I64 | None:
        """Take ``num_blocks`` more blocks for a running request (its decode grows).

        Returns the request's blocks with the new ones appended, or ``None`` when even
        evicting every unpinned block would not free enough (nothing changes then).
        """
        if num_blocks > self._num_empty + self.num_cached_free:
            return None
        grown: I64 = np.concatenate([held, self._take(num_blocks)])
        return grown

    def _take(self, need: int) -> I64:
        """Pin ``need`` new blocks: empty ones first, then policy victims."""
        take = min(need, self._num_empty)
        # A copy: the stack's storage is reused by later releases.
        fresh: I64 = self._empty[self._num_empty - take : self._num_empty][::-1].copy()
        self._num_empty -= take
        if need > take:
            victims = self.policy.evict(need - take)
            if victims.shape[0] != need - take:
                raise AssertionError(
                    f"policy '{self.policy.name}' returned {victims.shape[0]} victims, "
                    f"{need - take} needed"
                )
            self.num_cached_free -= int(victims.shape[0])
            self._drop_keys(victims, evicted=True)
            fresh = np.concatenate([fresh, victims])
        self.view.ref[fresh] = 1
        return fresh

    def commit(self, held: I64, keys: I64, num_hit: int) -> int:
        """Register keys for the request's new full blocks (positions num_hit..len(keys))
        that the admission takes; returns how many of ``keys``, from the first, are now
        cached by this request (``len(keys)`` unless the admission refused some).
        ``num_hit``: the request's blocks already hit or offered (an engine commits as
        prefill goes); after a refused one, nothing more of the request is cached."""
        n = int(keys.shape[0])
        if n <= num_hit:
            return n
        v = self.view
        # Open unless the block before the candidates was offered and refused (keyless).
        is_open = self.admission is None or num_hit == 0 or bool(v.key[held[num_hit - 1]] >= 0)
        context = AdmitContext(v.request_index, v.now, num_hit, is_open)
        n = num_hit + ask_admission(
            self.admission, keys[num_hit:n], context, self.block_tokens, self.observers
        )
        if n == num_hit:
            return n
        blocks = held[num_hit:n]
        new_keys = keys[num_hit:n]
        v.key[blocks] = new_keys
        v.depth[blocks] = np.arange(num_hit, n, dtype=np.int64)
        v.parent[blocks] = (
            held[num_hit - 1 : n - 1] if num_hit else np.concatenate([[-1], held[: n - 1]])
        )
        v.created[blocks] = v.now
        v.last_access[blocks] = v.now
        v.hits[blocks] = 0
        current = self.key_block[new_keys]
        fresh = current < 0
        v.is_primary[blocks] = fresh
        self.key_block[new_keys[fresh]] = blocks[fresh]
        if not fresh.all():
            for k, b in zip(new_keys[~fresh].tolist(), blocks[~fresh].tolist(), strict=True):
                holders = self._dups.setdefault(k, [int(self.key_block[k])])
                holders.append(b)
                self._has_dup[k] = True
        self.policy.on_insert(blocks)
        if self.observers:
            self._emit(Stored(new_keys))
        return n

    def release(self, held: I64) -> None:
        """Unpin a request's blocks, tail first; keyless ones return to the empty pool."""
        v = self.view
        order = held[::-1]
        refs = v.ref[order] - 1
        v.ref[order] = refs
        zero_mask = refs == 0
        zero = order if zero_mask.all() else order[zero_mask]
        if not zero.shape[0]:
            return
        keyed_mask = v.key[zero] >= 0
        if keyed_mask.all():
            keyed, keyless = zero, zero[:0]
        else:
            keyed, keyless = zero[keyed_mask], zero[~keyed_mask]
        if keyless.shape[0]:
            self._push_empty(keyless)
        if keyed.shape[0]:
            self.num_cached_free += int(keyed.shape[0])
            self.policy.on_evictable(keyed)
        if self.max_free_blocks is not None and self.num_cached_free > self.max_free_blocks:
            extra = self.policy.evict(self.num_cached_free - self.max_free_blocks)
            self.num_cached_free -= int(extra.shape[0])
            self._drop_keys(extra, evicted=True)
            self._push_empty(extra)

    # ------------------------------------------------------------------ internals
    def _push_empty(self, blocks: I64) -> None:
        # prepend_n(blocks): blocks[0] becomes the front, i.e. the top of our stack.
        n = int(blocks.shape[0])
        self._empty[self._num_empty : self._num_empty + n] = blocks[::-1]
        self._num_empty += n

    def _drop_keys(self, blocks: I64, evicted: bool) -> None:
        v = self.view
        keys = v.key[blocks]
        if self.observers:
            self._emit(Removed(keys.copy(), evicted))
        v.key[blocks] = -1
        primary = v.is_primary[blocks]
        self.key_block[keys[primary]] = -1
        dup = self._has_dup[keys]
        if dup.any():
            for k, b in zip(keys[dup].tolist(), blocks[dup].tolist(), strict=True):
                self._drop_duplicate(k, b)
        v.is_primary[blocks] = True

    def _drop_duplicate(self, key: int, block: int) -> None:
        """Drop one holder of a key that had several (possibly several in one batch)."""
        holders = self._dups.get(key)
        if holders is None:
            # The other holders went earlier in this batch: this was the last one.
            if self.key_block[key] == block:
                self.key_block[key] = -1
            return
        holders.remove(block)
        first = holders[0]
        self.key_block[key] = first
        if not self.view.is_primary[first]:
            self.view.is_primary[first] = True
            # It now serves lookups: policies that rank by key (OPT) re-rank it.
            self.policy.on_update(np.array([first], dtype=np.int64))
        if len(holders) == 1:
            del self._dups[key]
            self._has_dup[key] = False

    def _emit(self, event: Stored | Removed) -> None:
        for obs in self.observers:
            obs.on_event(event)

    # ------------------------------------------------------------------ checks
    def cached_keys(self) -> set[int]:
        """Keys with at least one holder (for tests and reference comparisons)."""
        return set(np.flatnonzero(self.key_block >= 0).tolist())

    def check(self) -> None:
        """Verify every structural invariant; raises AssertionError on the first broken one."""
        v = self.view
        cap = self.capacity_blocks
        assert (v.ref >= 0).all(), "negative ref count"
        empty = self._empty[: self._num_empty]
        assert np.unique(empty).shape[0] == empty.shape[0], "block twice in the empty pool"
        assert (v.key[empty] < 0).all() and (v.ref[empty] == 0).all(), "bad empty block"
        cached_free = int(np.count_nonzero((v.key >= 0) & (v.ref == 0)))
        assert cached_free == self.num_cached_free, "cached-free count drifted"
        unkeyed_free = int(np.count_nonzero((v.key < 0) & (v.ref == 0)))
        assert unkeyed_free == self._num_empty, "a keyless free block is not in the empty pool"
        pinned = int(np.count_nonzero(v.ref > 0))
        assert pinned + cached_free + self._num_empty == cap, "blocks leaked"
        if self.max_free_blocks is not None:
            assert self.num_cached_free <= self.max_free_blocks, "free-pool bound exceeded"
        held_keys = np.flatnonzero(self.key_block >= 0)
        holders = self.key_block[held_keys]
        assert (v.key[holders] == held_keys).all(), "key map points at a block without the key"
        assert v.is_primary[holders].all(), "primary holder not marked"
        keyed = np.flatnonzero(v.key >= 0)
        orphans = keyed[self.key_block[v.key[keyed]] != keyed]
        for b in orphans.tolist():
            k = int(v.key[b])
            assert b in self._dups.get(k, ()), f"block {b} holds key {k} but is not registered"
            assert not v.is_primary[b], f"secondary holder {b} marked primary"
        for k, hs in self._dups.items():
            assert len(hs) >= 2 and hs[0] == self.key_block[k], f"bad duplicate list for {k}"
