"""SGLang's radix cache for models mixing sliding-window and full attention layers.

SGLang 0.5.23 serves such a model (gpt-oss, Llama 4, Gemma 4; not Gemma 2 or 3, which it
runs with one full-size pool) with ``UnifiedRadixCache`` and two components, FULL and SWA,
over two pools of token slots: every token a request computes takes a full slot (the full
layers' KV) and an SWA slot (the sliding layers'). A tree node holds its tokens' full
slots, and their SWA slots unless it is a *tombstone* (SWA freed, full kept). This module
follows ``unified_cache/unified_tree_core.py`` and ``components/{full,swa}.py`` (the Python
core; the default Rust core gave the same results on every trace compared), over pages of
``page`` tokens named by their chained keys:

- **match**: walk the key, splitting the node where it ends inside one. A node end is a
  valid hit when the path to it has no tombstone, or at least ``window`` live tokens after
  its last one; the hit is the deepest valid end. The full-KV match past it is the
  *branching point* a later insert stops at.
- **recency**: full eviction takes unlocked leaves by ``last_access_time`` (a min-heap,
  a parent left a leaf pushed back); SWA eviction walks its own LRU list from the tail,
  evicting an unlocked leaf whole and tombstoning anything else. A match stamps the hit
  node and its ancestors and moves the live nodes of the last ``window + page`` tokens
  above it to the SWA list's head.
- **a running request** locks the path to its node (full) and the nodes of its last
  ``window`` tokens (SWA), frees the SWA slots of its tokens that fall out of the window
  (after its prefill, and in decode once 128 tokens have), and inserts its tokens at the
  end of its prefill and when it finishes: those out of the window as tombstones. An
  insert over a tombstone at or past the request's freed point revives it with the
  request's slots.

The engine-facing adapter is :class:`prefixlab.runner.engine.swa_radix.SwaEngineCache`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.types import I64

#: SGLANG_SWA_EVICTION_INTERVAL: decode frees out-of-window SWA slots in runs of this many
DECODE_INTERVAL = 128


class SwaNode:
    """A node: a run of pages, its full slots always, its SWA slots unless a tombstone."""

    __slots__ = (
        "children",
        "created",
        "keys",
        "last_access",
        "live",
        "lock_full",
        "lock_swa",
        "lru_next",
        "lru_prev",
        "nid",
        "parent",
        "uuid",
    )

    def __init__(self, nid: int, keys: I64, parent: SwaNode | None, stamp: float) -> None:
        self.nid = nid
        self.keys = keys
        self.parent = parent
        self.children: dict[int, SwaNode] = {}
        self.live = False
        self.lock_full = 0
        self.lock_swa = 0
        self.last_access = stamp
        self.created = stamp + 1.0
        self.lru_prev: SwaNode | None = None
        self.lru_next: SwaNode | None = None
        #: the stamp of a window lock's top node (its release walks up to it)
        self.uuid = -1

    @property
    def pages(self) -> int:
        return int(self.keys.shape[0])


@dataclass(slots=True)
class SwaMatch:
    """A match: the hit (pages), its node and the branching point (pages, or -1)."""

    num_hit_blocks: int
    num_hit_tokens: int
    node: SwaNode
    branch: int


@dataclass(slots=True)
class SwaRequest:
    """What a running request holds, in pages: ``allocated`` of its row, the first
    ``protected`` of them the tree's; SWA slots freed below ``freed``."""

    node: SwaNode
    swa_locked: int  # the uuid its SWA lock's release walks up to (-1: to the root)
    protected: int
    branch: int
    allocated: int = 0
    freed: int = 0

    @property
    def held_full(self) -> int:
        return self.allocated - self.protected

    @property
    def held_swa(self) -> int:
        return self.allocated - max(self.freed, self.protected)


class SwaRadixCache:
    """SGLang's FULL + SWA radix cache over pages (see the module docstring)."""

    def __init__(self, full_pages: int, swa_pages: int, page: int, window: int) -> None:
        if full_pages <= 0 or swa_pages <= 0:
            raise ConfigError(
                f"the SWA radix cache needs both pools, got {full_pages} full and "
                f"{swa_pages} SWA pages"
            )
        if window <= 0:
            raise ConfigError(f"the sliding window must be positive, got {window}")
        if window + page >= swa_pages * page:
            raise ConfigError(
                f"SGLang needs the SWA pool ({swa_pages * page} tokens) larger than the "
                f"window plus a page ({window} + {page})"
            )
        self.full_pages, self.swa_pages = full_pages, swa_pages
        self.page, self.window = page, window
        self.window_pages = -(-window // page)  # ceil_P(window) in pages
        self._clock = 0.0
        self._ids = 0
        self.root = self._node(np.zeros(0, dtype=np.int64), None)
        self.root.live = True
        self.root.lock_full = self.root.lock_swa = 1
        # the SWA LRU: head (most recent) ... tail (least), live nodes only
        self.head = self._node(np.zeros(0, dtype=np.int64), None)
        self.tail = self._node(np.zeros(0, dtype=np.int64), None)
        self.head.lru_next, self.tail.lru_prev = self.tail, self.head
        self.tree_pages = 0  # full slots the tree holds
        self.tree_live = 0  # SWA slots the tree holds
        self.held_full = 0  # full slots running requests hold beyond the tree's
        self.held_swa = 0
        self.full_evicted = 0  # counters, for the figures and the comparison with SGLang
        self.swa_evicted = 0
        #: told the pages of each new leaf and of each deleted one (the full KV's events)
        self.on_store: Callable[[I64], None] | None = None
        self.on_remove: Callable[[I64], None] | None = None

    # ------------------------------------------------------------------ clock, nodes
    def _tick(self) -> float:
        t = self._clock
        self._clock += 1.0
        return t

    def _node(self, keys: I64, parent: SwaNode | None) -> SwaNode:
        node = SwaNode(self._ids, keys, parent, self._tick())
        self._tick()  # the creation stamp
        self._ids += 1
        return node

    def full_free(self) -> int:
        return self.full_pages - self.tree_pages - self.held_full

    def swa_free(self) -> int:
        return self.swa_pages - self.tree_live - self.held_swa

    # ------------------------------------------------------------------ the SWA LRU
    def _lru_add_after(self, prev: SwaNode, node: SwaNode) -> None:
        nxt = prev.lru_next
        assert nxt is not None
        node.lru_prev, node.lru_next = prev, nxt
        nxt.lru_prev = node
        prev.lru_next = node

    def _lru_remove(self, node: SwaNode) -> None:
        prev, nxt = node.lru_prev, node.lru_next
        assert prev is not None and nxt is not None
        prev.lru_next, nxt.lru_prev = nxt, prev
        node.lru_prev = node.lru_next = None

    def _in_lru(self, node: SwaNode) -> bool:
        return node.lru_prev is not None

    def _refresh_window(self, node: SwaNode) -> None:
        """``reset_node_and_window_ancestors_mru``: the live nodes of the last
        ``window + page`` tokens up from ``node`` to the head, deeper more recent."""
        prev, acc, limit = self.head, 0, self.window + self.page
        while node is not self.root and acc < limit:
            if node.live:
                self._lru_remove(node)
                self._lru_add_after(prev, node)
                prev = node
            acc += node.pages * self.page
            assert node.parent is not None
            node = node.parent

    def _set_live(self, node: SwaNode) -> None:
        """A node's SWA slots published: it joins the SWA list at its head."""
        assert not node.live
        node.live = True
        self.tree_live += node.pages
        self._lru_add_after(self.head, node)

    # ------------------------------------------------------------------ structure
    def _split(self, child: SwaNode, m: int) -> SwaNode:
        """Split ``child`` after ``m`` pages; return the new upper node (SGLang's
        ``_split_node``: the upper part sits just behind the child in the SWA list, and
        the child is stamped afresh)."""
        parent = child.parent
        assert parent is not None and 0 < m < child.pages
        upper = self._node(child.keys[:m], parent)
        upper.created = child.created
        upper.lock_full, upper.lock_swa = child.lock_full, child.lock_swa
        upper.uuid, child.uuid = child.uuid, -1  # a lock's top edge is the upper part
        parent.children[int(child.keys[0])] = upper
        child.keys = child.keys[m:]
        child.parent = upper
        upper.children[int(child.keys[0])] = child
        if child.live:
            upper.live = True
            self._lru_add_after(child, upper)
        child.last_access = self._tick()
        return upper

    def _leaf(self, node: SwaNode) -> bool:
        return node is not self.root and not node.children

    def _evictable_leaf(self, node: SwaNode) -> bool:
        return self._leaf(node) and node.lock_full == 0 and node.lock_swa == 0

    def _delete_leaf(self, node: SwaNode) -> None:
        parent = node.parent
        assert parent is not None and self._evictable_leaf(node)
        del parent.children[int(node.keys[0])]
        if self.on_remove is not None:
            self.on_remove(node.keys)
        self.tree_pages -= node.pages
        self.full_evicted += node.pages
        if node.live:
            self.tree_live -= node.pages
            self.swa_evicted += node.pages
            self._lru_remove(node)
            node.live = False
        node.parent = None

    def _tombstone(self, node: SwaNode) -> None:
        assert node.live
        node.live = False
        self.tree_live -= node.pages
        self.swa_evicted += node.pages
        self._lru_remove(node)

    # ------------------------------------------------------------------ match
    def match(self, keys: I64) -> SwaMatch:
        """``match_prefix`` over ``keys`` (already cut to the lookup limit)."""
        node, i, n = self.root, 0, int(keys.shape[0])
        acc = float("inf")
        best, best_i = self.root, 0
        while i < n:
            child = node.children.get(int(keys[i]))
            if child is None:
                break
            span = min(child.pages, n - i)
            diff = np.flatnonzero(child.keys[:span] != keys[i : i + span])
            m = int(diff[0]) if diff.size else span
            if m < child.pages:
                child = self._split(child, m)
            if child.live:
                acc += m * self.page
            else:
                acc = 0.0
            node, i = child, i + m
            if acc >= self.window:
                best, best_i = node, i
            if m < span:
                break
        branch = i if i > best_i else -1
        if best is not self.root:
            self._refresh_window(best)
        t, up = self._tick(), best
        up_: SwaNode | None = up
        while up_ is not None:
            up_.last_access = t
            t -= 0.00001
            up_ = up_.parent
        return SwaMatch(best_i, best_i * self.page, best, branch)

    # ------------------------------------------------------------------ locks
    def lock(self, node: SwaNode) -> int:
        """``inc_lock_ref``: full on the whole path, SWA on the nodes of the last
        ``window`` tokens (tombstones included); returns the stamp of the SWA segment's
        top node (-1: it reached the root), where its release stops."""
        up: SwaNode | None = node
        while up is not None and up is not self.root:
            up.lock_full += 1
            up = up.parent
        covered, up = 0, node
        while up is not None and up is not self.root and covered < self.window:
            up.lock_swa += 1
            covered += up.pages * self.page
            if covered >= self.window:
                if up.uuid < 0:
                    self._ids += 1
                    up.uuid = self._ids
                return up.uuid
            up = up.parent
        return -1

    def unlock(self, node: SwaNode, uuid: int) -> None:
        """``dec_lock_ref``: the full lock off the whole path, the SWA lock up to the
        node stamped ``uuid`` (a split moves the stamp to the upper part)."""
        up: SwaNode | None = node
        while up is not None and up is not self.root:
            assert up.lock_full > 0
            up.lock_full -= 1
            up = up.parent
        up = node
        while up is not None and up is not self.root:
            assert up.lock_swa > 0, f"SWA lock release below zero at node {up.nid}"
            up.lock_swa -= 1
            if uuid >= 0 and up.uuid == uuid:
                break
            up = up.parent

    # ------------------------------------------------------------------ eviction
    def evict_for(self, tokens: int) -> None:
        """``evict_from_tree_cache``: make room for ``tokens`` tokens in both pools."""
        need = -(-tokens // self.page)  # pages (available sizes are whole pages)
        full_short = max(0, tokens - self.full_free() * self.page)
        swa_short = max(0, tokens - self.swa_free() * self.page)
        if not full_short and not swa_short:
            return
        swa_before = self.swa_evicted
        if full_short:
            self._evict_full(need)
        if self.swa_free() >= need or self.swa_evicted - swa_before >= swa_short:
            return
        self._evict_swa(need, swa_short, swa_before)

    def _evict_full(self, need: int) -> None:
        heap = [(n.last_access, n.nid, n) for n in self._leaves() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        while self.full_free() < need and heap:
            _, _, x = heapq.heappop(heap)
            if x.parent is None or not self._evictable_leaf(x):
                continue
            parent = x.parent
            self._delete_leaf(x)
            if self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.nid, parent))

    def _evict_swa(self, need: int, short: int, before: int) -> None:
        x = self._prev_unlocked(self.tail)
        while x is not None:
            nxt = self._prev_unlocked(x)
            if self._evictable_leaf(x):
                self._delete_leaf(x)
            else:
                self._tombstone(x)
            if self.swa_free() >= need or self.swa_evicted - before >= short:
                return
            x = nxt if nxt is not None and self._in_lru(nxt) else self._prev_unlocked(self.tail)

    def _prev_unlocked(self, node: SwaNode) -> SwaNode | None:
        x = node.lru_prev
        while x is not None and x is not self.head and x.lock_swa > 0:
            x = x.lru_prev
        return None if x is None or x is self.head else x

    def _leaves(self) -> list[SwaNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    # ------------------------------------------------------------------ a request
    def admit(self, m: SwaMatch) -> SwaRequest:
        """Lock a match's node for a request (the scheduler's admission)."""
        locked = self.lock(m.node)
        return SwaRequest(m.node, locked, m.num_hit_blocks, m.branch, m.num_hit_blocks)

    def release(self, req: SwaRequest) -> None:
        """Undo an admission that took nothing: unlock."""
        assert req.allocated == req.protected
        self.unlock(req.node, req.swa_locked)

    def reclaimable(self, full: int, swa: int) -> bool:
        """Whether evicting all that no running request holds would free ``full`` full
        and ``swa`` SWA pages."""
        free_full, free_swa = self.full_free(), self.swa_free()
        if free_full >= full and free_swa >= swa:
            return True
        stack = list(self.root.children.values())
        while stack and (free_full < full or free_swa < swa):
            node = stack.pop()
            stack.extend(node.children.values())
            if node.lock_full == 0:
                free_full += node.pages
            if node.live and node.lock_swa == 0:
                free_swa += node.pages
        return free_full >= full and free_swa >= swa

    def allocate(self, req: SwaRequest, pages: int) -> bool:
        """Take ``pages`` more pages in both pools for ``req`` (after evicting for them);
        False when they are not there."""
        if pages > self.full_free() or pages > self.swa_free():
            return False
        req.allocated += pages
        self.held_full += pages
        self.held_swa += pages
        return True

    def free_out_of_window(self, req: SwaRequest, pre_len: int) -> None:
        """``free_swa_out_of_window_slots``: free the SWA slots of the request's own
        tokens that left the window behind its first ``pre_len`` tokens."""
        freed = req.freed * self.page
        if pre_len - self.window < freed + 1:
            return
        req_before = req.held_swa
        req.freed = max(req.freed, req.protected)
        keep = -(-max(self.window, self.page) // self.page) * self.page
        new = max(req.freed * self.page, pre_len - keep) // self.page
        if new > req.freed:
            req.freed = new
        self.held_swa += req.held_swa - req_before

    def checkpoint(self, req: SwaRequest, keys: I64, tokens: int, finished: bool) -> None:
        """``checkpoint_into_tree``: insert the request's first ``tokens`` tokens (their
        pages named by ``keys``); an unfinished request first frees its out-of-window
        SWA slots."""
        end = tokens
        branch_cut = req.protected < req.branch and req.branch * self.page <= tokens
        if branch_cut:
            end = req.branch * self.page
        if not finished:
            self.free_out_of_window(req, end - 1)
        pages = end // self.page
        if pages > req.protected:
            before_full, before_swa = req.held_full, req.held_swa
            node = self._insert(req, keys[:pages])
            req.protected = pages  # the tree's now: adopted or freed as duplicates
            self.held_full -= before_full - req.held_full
            self.held_swa -= before_swa - req.held_swa
            if node is not req.node:
                new_locked = self.lock(node)
                self.unlock(req.node, req.swa_locked)
                req.node, req.swa_locked = node, new_locked
        if branch_cut:
            req.branch = -1
            if not finished:
                self.free_out_of_window(req, tokens - 1)

    def _insert(self, req: SwaRequest, keys: I64) -> SwaNode:
        """The tree walk of an insert: existing nodes stamped (and split), tombstones
        the request recomputed revived, the rest a new leaf."""
        node, i, n = self.root, 0, int(keys.shape[0])
        while i < n:
            child = node.children.get(int(keys[i]))
            if child is None:
                break
            child.last_access = self._tick()
            span = min(child.pages, n - i)
            diff = np.flatnonzero(child.keys[:span] != keys[i : i + span])
            m = int(diff[0]) if diff.size else span
            if m < child.pages:
                child = self._split(child, m)
            self._overlap(req, child, i)
            node, i = child, i + m
        if i < n:
            node = self._new_leaf(req, node, keys[i:], i)
        self._refresh_window(node)
        return node

    def _overlap(self, req: SwaRequest, node: SwaNode, start: int) -> None:
        """A walked node the request also computed: a tombstone at or past the request's
        freed point takes the request's slots and is live again (SGLang's
        ``update_component_on_insert_overlap``); the request's other copies are freed."""
        end = start + node.pages
        if req.protected >= end or node.live:
            return
        live_start = max(start, req.freed)
        if live_start >= end:
            return
        assert start >= req.protected, "an insert overlaps the request's tree prefix"
        if live_start > start:
            self._split(node, live_start - start)  # node keeps [live_start, end)
        self._set_live(node)

    def _new_leaf(self, req: SwaRequest, parent: SwaNode, keys: I64, start: int) -> SwaNode:
        """The request's pages past the tree as a leaf: a tombstone below its freed
        point, live from it, the live part's last window its own node."""
        leaf = self._node(keys.copy(), parent)
        parent.children[int(keys[0])] = leaf
        if self.on_store is not None:
            self.on_store(keys)
        k = int(keys.shape[0])
        self.tree_pages += k
        live_start = max(start, req.freed)
        if live_start >= start + k:
            return leaf
        if live_start > start:
            self._split(leaf, live_start - start)
        if leaf.pages > self.window_pages:  # older parts publish first: the leaf is newest
            self._set_live(self._split(leaf, leaf.pages - self.window_pages))
        self._set_live(leaf)
        return leaf

    def finish(self, req: SwaRequest) -> None:
        """``release_kv_cache``: free the request's slots past the tree's, unlock."""
        self.held_full -= req.held_full
        self.held_swa -= req.held_swa
        req.allocated = req.protected
        self.unlock(req.node, req.swa_locked)

    # ------------------------------------------------------------------ checks
    def check(self, running: Sequence[SwaRequest] = ()) -> None:
        """Every count and link consistent; raises AssertionError on the first broken."""
        pages = live = 0
        stack = [self.root]
        in_lru: set[int] = set()
        x = self.head.lru_next
        while x is not None and x is not self.tail:
            assert x.live, f"node {x.nid} in the SWA list is a tombstone"
            in_lru.add(x.nid)
            x = x.lru_next
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                assert child.parent is node and int(child.keys[0]) == key
                assert child.pages > 0
                assert child.lock_full <= node.lock_full or node is self.root
                stack.append(child)
            if node is self.root:
                continue
            if not running:
                assert node.lock_full == node.lock_swa == 0, f"node {node.nid} still locked"
            pages += node.pages
            if node.live:
                live += node.pages
                assert node.nid in in_lru, f"live node {node.nid} not in the SWA list"
        assert pages == self.tree_pages, "tree page count drifted"
        assert live == self.tree_live, "live page count drifted"
        assert self.full_free() >= 0 and self.swa_free() >= 0, "over capacity"
        assert sum(r.held_full for r in running) == self.held_full, "held full slots drifted"
        assert sum(r.held_swa for r in running) == self.held_swa, "held SWA slots drifted"
