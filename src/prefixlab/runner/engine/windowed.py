"""vLLM's hybrid KV-cache manager for sliding-window models, behind the engine's scheduler.

A model mixing sliding-window and full attention layers (Gemma 3, gpt-oss) is cached by
vLLM (v1, ``HybridKVCacheCoordinator``) as several KV-cache groups over one pool of equal
pages:

- the attention layers are split into groups of ``group_size`` layers, the fewest layers
  of either kind (the last group of a kind padded); every group has its own block table,
  and a page holds one block of tokens of one group's layers. Groups are ordered by the
  kind of the model's first layer, sliding-window for Gemma 3 and gpt-oss: a request takes
  and frees its pages group by group in that order (sliding groups first here);
- a full-attention group keeps a page for every block of a request; a sliding-window
  group frees the pages that fall out of the window as the request runs
  (``remove_skipped_blocks``: blocks before ``(computed - window + 1) // block_size``),
  and a request that hits needs none before its window. vLLM allocates chunk by chunk,
  so a sliding group holds at most the window and one step's tokens
  (``max_admission_blocks_per_request``); here, as the engine takes a request's full
  pages at admission, its sliding pages are taken up to that cap past the window's
  start and moved forward as it slides;
- a prefix hit needs the full groups' pages of the whole prefix and the sliding groups'
  pages of the last ``ceil((window - 1) / block_size)`` blocks before the hit point (the
  rightmost such run within the full hit; a run from the first block also counts);
- every page is cached under (block hash, group): a page freed early stays cached until
  the pool's policy evicts it.

This adapter keeps one :class:`~prefixlab.cache.block.BlockCache` of pages, the full
groups' and the sliding groups' under separate key ranges (group g's key = key + g x keys),
and speaks the scheduler's verbs (``match / acquire / grow / commit / release``) plus
``slide``, which the scheduler calls before each step. KV events carry the full groups'
keys only, as a block's identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Event, MatchResult, Observer, Removed, Stored
from prefixlab.errors import ConfigError
from prefixlab.model.spec import ModelSpec
from prefixlab.policies.base import EvictionPolicy
from prefixlab.types import I64


@dataclass(frozen=True, slots=True)
class WindowGroups:
    """How vLLM groups a sliding-window model's attention layers into KV-cache groups."""

    group_size: int  # layers per group (a page holds one block of them)
    full_groups: int
    sliding_groups: int
    window_blocks: int  # blocks a hit needs before its end: ceil((window - 1) / block)

    @property
    def groups(self) -> int:
        return self.full_groups + self.sliding_groups


def window_groups(model: ModelSpec, block_tokens: int) -> WindowGroups:
    """vLLM's uniform-page grouping (0.33, ``kv_cache_planning``): groups of the smaller
    kind's layer count; when the larger kind has fewer than 1.5 times as many, of its
    count (the last group of a kind padded)."""
    full = model.num_attention_layers - model.num_sliding_layers
    sliding = model.num_sliding_layers
    window = -(-(model.sliding_window - 1) // block_tokens)
    if not sliding:
        raise ConfigError(f"model {model.name} has no sliding-window layers")
    if not full:  # one kind: one group of every layer
        return WindowGroups(sliding, 0, 1, window)
    size = min(full, sliding)
    if max(full, sliding) < 1.5 * size:
        size = max(full, sliding)
    return WindowGroups(size, -(-full // size), -(-sliding // size), window)


def pages_for(capacity_blocks: int, model: ModelSpec, groups: WindowGroups) -> int:
    """Pages of the pool a capacity of ``capacity_blocks`` whole blocks (every layer) buys."""
    return capacity_blocks * model.num_attention_layers // groups.group_size


@dataclass(slots=True)
class WindowedHandle:
    """A running request's pages: ``full[g]`` for each of its ``blocks``; ``sliding[g]``
    for blocks ``start .. hi``, of which those before ``lo`` are released."""

    full: list[I64]
    sliding: list[I64]
    start: int
    lo: int
    hi: int
    blocks: int
    committed: int  # the sliding groups' blocks cached (they are cached up to here)


@dataclass(slots=True)
class WindowedMatch:
    num_hit_blocks: int
    num_hit_tokens: int
    start: int  # the first sliding block the hit holds
    keys: I64  # the lookup keys


class _FullKeys:
    """Forwards the pool's KV events for the first full group's keys only."""

    def __init__(self, observers: list[Observer], num_keys: int) -> None:
        self.observers, self.num_keys = observers, num_keys

    def on_event(self, event: Event) -> None:
        if isinstance(event, Stored | Removed):
            keys = event.keys[event.keys < self.num_keys]
            if not keys.shape[0]:
                return
            event = Stored(keys) if isinstance(event, Stored) else Removed(keys, event.evicted)
        for obs in self.observers:
            obs.on_event(event)


class WindowedBlockCache:
    """One pool of pages, full and sliding-window groups (see the module docstring)."""

    structure = "block"

    def __init__(
        self,
        capacity_blocks: int,
        policy: EvictionPolicy,
        num_keys: int,
        model: ModelSpec,
        block_tokens: int,
        observers: Sequence[Observer] = (),
        max_num_batched_tokens: int = 8192,
    ) -> None:
        self.g = window_groups(model, block_tokens)
        self.pages = pages_for(capacity_blocks, model, self.g)
        self.num_keys = max(num_keys, 1)
        self.observers: list[Observer] = list(observers)
        self.pool = BlockCache(
            self.pages,
            policy,
            self.num_keys * self.g.groups,
            block_tokens=block_tokens,
            observers=[_FullKeys(self.observers, self.num_keys)],
        )
        self.view = self.pool.view
        self.bt = block_tokens
        self.window = model.sliding_window
        #: sliding pages a request holds at most: vLLM's per-request admission cap, the
        #: window's tokens and one step's, in blocks, and one for a window that starts
        #: inside a block (SlidingWindowSpec.max_admission_blocks_per_request)
        self.cap = -(-(model.sliding_window - 1 + max_num_batched_tokens) // block_tokens) + 1
        #: the most blocks one request can hold
        self.capacity_blocks = self._most_blocks()

    def _most_blocks(self) -> int:
        """The largest b with full groups x b + sliding groups x min(b, cap) <= pages."""
        f, s, cap = self.g.full_groups, self.g.sliding_groups, self.cap
        if not f:
            return 1 << 62 if s * cap <= self.pages else self.pages // s
        within = self.pages // (f + s)
        return within if within < cap else (self.pages - s * cap) // f

    def _sliding_end(self, lo: int, blocks: int) -> int:
        return min(blocks, lo + self.cap)

    def _key(self, keys: I64, group: int) -> I64:
        return keys + group * self.num_keys if group else keys

    # ------------------------------------------------------------------ lookup
    def match(self, keys: I64, lookup_end: int | None = None) -> WindowedMatch:
        """vLLM's hybrid hit: the full groups' prefix, cut to the rightmost end with the
        window's blocks cached in every sliding group."""
        n = int(keys.shape[0])
        full = n
        for g in range(self.g.full_groups):
            full = min(full, self.pool.match(self._key(keys[:full], g)).num_hit_blocks)
        cached = np.ones(full, dtype=bool)
        for g in range(self.g.full_groups, self.g.groups):
            cached &= self.pool.key_block[self._key(keys[:full], g)] >= 0
        hit = _window_hit(cached, self.g.window_blocks)
        tokens = lookup_end if hit == n and lookup_end is not None else hit * self.bt
        return WindowedMatch(hit, tokens, max(0, hit - self.g.window_blocks), keys)

    # ------------------------------------------------------------------ lifecycle
    def acquire(self, m: WindowedMatch, num_blocks: int, keys: I64) -> WindowedHandle | None:
        """Pin the hit's pages, then take new ones: the full groups' for blocks ``hit ..
        num_blocks``, the sliding groups' up to the cap past the window's start (``keys``:
        the request's keys past the hit; the hit's own are read back from the pool)."""
        hit, start = m.num_hit_blocks, m.start
        hi = self._sliding_end(start, num_blocks)
        held = self._hit_pages(m)
        free_hits = sum(int(np.count_nonzero(self.view.ref[p] == 0)) for p in held)
        need = self.g.full_groups * (num_blocks - hit) + self.g.sliding_groups * (hi - hit)
        if need > self.pool.num_available() - free_hits:
            return None
        # vLLM touches every group's hit before it takes a new page for any group
        out: list[I64] = [held[0]] * self.g.groups
        for g in self._order():
            lo = 0 if g < self.g.full_groups else start
            match = MatchResult(hit - lo, (hit - lo) * self.bt, held[g])
            got = self.pool.acquire(match, hit - lo, keys if g == 0 else None)
            assert got is not None  # no new page yet
            out[g] = got
        for g in self._order():
            more = num_blocks - hit if g < self.g.full_groups else hi - hit
            got = self.pool.grow(out[g], more)
            assert got is not None  # room checked above for every group at once
            out[g] = got
        f = self.g.full_groups
        return WindowedHandle(out[:f], out[f:], start, start, hi, num_blocks, hit)

    def _order(self) -> list[int]:
        """Groups in vLLM's order: the sliding-window ones, then the full ones."""
        f = self.g.full_groups
        return list(range(f, self.g.groups)) + list(range(f))

    def _hit_pages(self, m: WindowedMatch) -> list[I64]:
        """Every group's pages of the hit (full: all of it, sliding: from ``start``)."""
        keys = m.keys
        out = []
        for g in range(self.g.groups):
            lo = 0 if g < self.g.full_groups else m.start
            out.append(self.pool.key_block[self._key(keys[lo : m.num_hit_blocks], g)])
        return out

    def grow(self, handle: WindowedHandle, num_blocks: int) -> WindowedHandle | None:
        """``num_blocks`` more blocks: a page each in the full groups, and in the sliding
        groups as far as the cap allows."""
        hi = self._sliding_end(handle.lo, handle.blocks + num_blocks)
        need = self.g.full_groups * num_blocks + self.g.sliding_groups * (hi - handle.hi)
        if need > self.pool.num_available():
            return None
        self._extend(handle.sliding, hi - handle.hi)
        self._extend(handle.full, num_blocks)
        handle.blocks += num_blocks
        handle.hi = hi
        return handle

    def _extend(self, group: list[I64], more: int) -> None:
        if more <= 0:
            return
        for i, pages in enumerate(group):
            grown = self.pool.grow(pages, more)
            assert grown is not None  # room checked by the caller
            group[i] = grown

    def commit(self, handle: WindowedHandle, keys: I64, start: int) -> int:
        """Cache the request's blocks up to ``len(keys)``: the full groups' from ``start``,
        the sliding groups' from where they stand (those released before are gone)."""
        n = int(keys.shape[0])
        for g, pages in enumerate(handle.full):
            self.pool.commit(pages, self._key(keys, g), start)
        self._commit_sliding(handle, keys, n)
        return n

    def _commit_sliding(self, handle: WindowedHandle, keys: I64, upto: int) -> None:
        begin, upto = max(handle.committed, handle.lo), min(upto, handle.hi)
        if upto <= begin:
            return
        lo, at = handle.lo, handle.lo - handle.start
        for i, pages in enumerate(handle.sliding):
            g = self.g.full_groups + i
            self.pool.commit(pages[at:], self._key(keys[lo:upto], g), begin - lo)
            # the pool counts depth from the first page it was given
            self.view.depth[pages[begin - handle.start : upto - handle.start]] += lo
        handle.committed = upto

    def slide(self, handle: WindowedHandle, computed_tokens: int, keys: I64) -> None:
        """vLLM's ``remove_skipped_blocks``: cache, then release, the sliding groups' pages
        of blocks before ``(computed - window + 1) // block_size``; then take pages for
        the blocks the cap now reaches."""
        new_lo = min(max((computed_tokens - self.window + 1) // self.bt, 0), handle.hi)
        if new_lo <= handle.lo:
            return
        self._commit_sliding(handle, keys, min(new_lo, int(keys.shape[0])))
        a, b = handle.lo - handle.start, new_lo - handle.start
        for pages in handle.sliding:
            self.pool.release(pages[a:b])
        handle.lo = new_lo
        want = self._sliding_end(new_lo, handle.blocks) - handle.hi
        # the pages released make room, unless another running request shares them: then
        # the rest is taken when there is room (a grow, or a later step)
        more = min(want, self.pool.num_available() // max(1, self.g.sliding_groups))
        if more > 0:
            self._extend(handle.sliding, more)
            handle.hi += more

    def release(self, handle: WindowedHandle | None) -> None:
        """Unpin every page still held, group by group, each tail first (vLLM's free)."""
        if handle is None:
            return
        at = handle.lo - handle.start
        for pages in handle.sliding:  # vLLM's group order
            self.pool.release(pages[at:])
        for pages in handle.full:
            self.pool.release(pages)
        handle.lo = handle.hi

    # ------------------------------------------------------------------ checks
    def check(self, handles: Sequence[object] = ()) -> None:
        """The pool's invariants, and every page pinned exactly by the requests holding it."""
        self.pool.check()
        held: list[I64] = []
        for h in handles:
            if isinstance(h, WindowedHandle):
                held.extend(h.full)
                held.extend(p[h.lo - h.start :] for p in h.sliding)
        flat = np.concatenate(held) if held else np.zeros(0, dtype=np.int64)
        refs = np.bincount(flat, minlength=self.pages)
        if not np.array_equal(refs, self.view.ref[: self.pages]):
            raise AssertionError("page ref counts differ from the running requests' holdings")


def _window_hit(cached: np.ndarray, window_blocks: int) -> int:
    """vLLM's ``SlidingWindowManager.find_longest_cache_hit`` over ``cached`` (blocks the
    sliding groups hold, within the full hit): from the right, the end of the first run of
    ``window_blocks`` cached blocks; else the run from the first block."""
    n = int(cached.shape[0])
    if window_blocks <= 0:
        return n
    run = 0
    for i in range(n - 1, -1, -1):
        if cached[i]:
            run += 1
            if run >= window_blocks:
                return i + run
        else:
            run = 0
    return run
