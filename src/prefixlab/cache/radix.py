"""Radix prefix cache with SGLang semantics.

The tree is built over *pages*: one page is one block of ``block_tokens`` tokens, named by
its chained block key (``block_tokens=1`` gives SGLang's token-level tree). Two sequences
share a k-page prefix exactly when their first k chained keys are equal, so edges split at
the same places as a token tree, while matching costs one dict lookup per node plus one
vectorised comparison per edge::

    root ─[a b c]─ n1 ─[d e]─ n2          match [a b x]: walk n1, differ at page 2
                      └─[f]─ n3           -> split n1 into [a b] + [c]; hit = 2 pages

Nodes are the policy's entries. Only unlocked leaves are evictable; when a leaf goes, its
parent is offered if it is now an unlocked leaf. Running requests lock their matched path
and reserve pages for their new tokens; tree pages + reserved pages <= capacity.

**Access times** follow SGLang's RadixCache (0.5.23, ``radix_cache.py``) on a logical clock
(the cache's own counter, one tick per stamp, so a request's stamps are strictly ordered):
a match stamps its whole matched path once; where it ends inside an edge, the edge is split
and *both* parts carry that stamp, the new upper part then a fresh, later one (SGLang makes
it a new node); an insertion stamps every node it walks the same way and its new leaf
later still::

    match:  path, split remainder  = t      split head = t + 1
    insert: path, split remainder  = t + 2  split head = t + 3   new leaf = t + 4
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prefixlab.cache.events import MatchResult, Observer, Removed, Stored
from prefixlab.cache.view import AdmitContext, BlockAdmission, CachePolicy, EntryView, ask_admission
from prefixlab.errors import ConfigError
from prefixlab.types import I64

ROOT = 0


@dataclass(slots=True)
class RadixHandle:
    """What a running request holds: its locked path end and its reserved pages."""

    last_node: int
    reserved_blocks: int


class RadixCache:
    """SGLang-style radix tree over block keys with lock counts and leaf-only eviction."""

    structure = "radix"

    def __init__(
        self,
        capacity_blocks: int,
        policy: CachePolicy,
        num_keys: int = 0,
        *,
        block_tokens: int = 16,
        observers: Sequence[Observer] = (),
        admission: BlockAdmission | None = None,
    ) -> None:
        if capacity_blocks <= 0:
            raise ConfigError(f"capacity_blocks must be positive, got {capacity_blocks}")
        if "radix" not in policy.structures:
            raise ConfigError(f"policy '{policy.name}' does not apply to the radix cache")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.policy = policy
        #: asked before new pages join the tree (None: every page, as SGLang does)
        self.admission = admission
        size = capacity_blocks + 2  # every node holds >= 1 page, plus the root
        self.view = EntryView(size)
        policy.bind(self.view)
        self.edges: list[I64 | None] = [None] * size
        self.children: list[dict[int, int] | None] = [None] * size
        self.edges[ROOT] = np.zeros(0, dtype=np.int64)
        self.children[ROOT] = {}
        self._free_ids = list(range(size - 1, 0, -1))
        self._evictable = np.zeros(size, dtype=bool)
        self.tree_blocks = 0
        self.reserved_blocks = 0
        self.protected_blocks = 0  # pages in locked nodes
        self.observers = list(observers)
        #: the logical clock of access and creation times (see the module docstring)
        self.clock = 0.0
        #: pages a reservation also frees (evicts) beyond what it takes: SGLang's paged
        #: allocator evicts one spare page per request at prefill (engine runner option)
        self.spare_blocks = 0

    # ------------------------------------------------------------------ lookup
    def match(self, keys: I64, block_tokens_end: int | None = None) -> MatchResult:
        """Walk the tree along ``keys``; split the edge where the match ends inside it; stamp
        what the match touched (as SGLang's ``match_prefix`` does)."""
        i, path = self._walk(keys, stamp=True)
        n = int(keys.shape[0])
        tokens = (
            block_tokens_end
            if (i == n and block_tokens_end is not None)
            else (i * self.block_tokens)
        )
        return MatchResult(i, tokens, np.array(path, dtype=np.int64))

    def _tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def _walk(self, keys: I64, stamp: bool) -> tuple[int, list[int]]:
        """Longest matched prefix (pages) and the node path, splitting a partial edge; with
        ``stamp``, the path and a split's remainder get one new time, a split's new upper
        node a later one."""
        node, i, n = ROOT, 0, int(keys.shape[0])
        path: list[int] = []
        splits: list[tuple[int, int]] = []
        while i < n:
            children = self.children[node]
            assert children is not None
            child = children.get(int(keys[i]))
            if child is None:
                break
            edge = self.edges[child]
            assert edge is not None
            span = min(int(edge.shape[0]), n - i)
            diff = np.flatnonzero(edge[:span] != keys[i : i + span])
            m = int(diff[0]) if diff.size else span
            if m < edge.shape[0]:
                lower = child
                child = self._split(child, m)
                splits.append((child, lower))
            path.append(child)
            node, i = child, i + m
        if stamp:
            v = self.view
            t = self._tick()
            v.last_access[path] = t
            for _, lower in splits:
                v.last_access[lower] = t
            if splits:
                t = self._tick()
                for upper, _ in splits:
                    v.last_access[upper] = t
                    v.created[upper] = t
                # the remainders' recency changed without an access: policies re-rank them
                self.policy.on_update(np.array([lower for _, lower in splits], dtype=np.int64))
        return i, path

    def num_available(self) -> int:
        return self.capacity_blocks - self.reserved_blocks - self.protected_blocks

    # ------------------------------------------------------------------ lifecycle
    def acquire(
        self, match: MatchResult, num_blocks: int, miss_keys: I64 | None = None
    ) -> RadixHandle | None:
        """Lock the matched path, then reserve pages for the rest (evicting leaves).

        ``miss_keys`` are announced to the policy (``on_miss``) before any eviction.
        """
        v = self.view
        path = match.entries
        need = num_blocks - match.num_hit_blocks
        newly_locked = int(v.size[path][v.ref[path] == 0].sum()) // self.block_tokens
        free_now = self.capacity_blocks - self.tree_blocks - self.reserved_blocks
        evictable = self.tree_blocks - self.protected_blocks - newly_locked
        if need > free_now + evictable:
            return None
        if path.shape[0]:
            self.policy.on_access(path)
            v.hits[path] += 1
        last = int(path[-1]) if path.shape[0] else ROOT
        self._lock(last)
        if miss_keys is not None and miss_keys.shape[0]:
            self.policy.on_miss(miss_keys)
        self._reserve(need)
        return RadixHandle(last, need)

    def grow(self, handle: RadixHandle, num_blocks: int) -> RadixHandle | None:
        """Reserve ``num_blocks`` more pages for a running request (evicting leaves).

        Returns the handle, or ``None`` when even evicting every unlocked page would not
        free enough (nothing changes then).
        """
        free_now = self.capacity_blocks - self.tree_blocks - self.reserved_blocks
        if num_blocks > free_now + self.tree_blocks - self.protected_blocks:
            return None
        self._reserve(num_blocks)
        handle.reserved_blocks += num_blocks
        return handle

    def _reserve(self, need: int) -> None:
        while self.capacity_blocks - self.tree_blocks - self.reserved_blocks < need:
            victims = self.policy.evict(1)
            if not victims.shape[0]:
                raise AssertionError(f"policy '{self.policy.name}' found no victim")
            self._remove_leaf(int(victims[0]))
        self.reserved_blocks += need
        if self.spare_blocks:
            self.keep_free(self.spare_blocks)

    def keep_free(self, num_blocks: int) -> None:
        """Evict unlocked leaves until ``num_blocks`` pages are free, or none is left to
        evict (SGLang's allocator keeps a free page per running request at each decode step
        and one spare page per request at prefill)."""
        while (
            self.capacity_blocks - self.tree_blocks - self.reserved_blocks < num_blocks
            and self.tree_blocks > self.protected_blocks
        ):
            victims = self.policy.evict(1)
            if not victims.shape[0]:
                break
            self._remove_leaf(int(victims[0]))

    def commit(self, handle: RadixHandle, keys: I64, num_hit: int) -> int:
        """Insert the request's keyed pages that the admission takes; its reserved pages
        become tree pages. Returns how many of ``keys``, from the first, are in the tree
        (``len(keys)`` unless the admission refused some)."""
        i, path = self._walk(keys, stamp=True)
        n = int(keys.shape[0])
        node = path[-1] if path else ROOT
        if path:
            self.policy.on_access(np.array(path, dtype=np.int64))
        # Pages num_hit.. are new to this request; those before it that are not in the tree
        # were offered and refused (an engine commits as prefill goes): none is cached then.
        start = i if self.admission is None else max(i, num_hit)
        stored = i
        if start < n:
            v = self.view
            context = AdmitContext(v.request_index, v.now, start, start == i)
            k = ask_admission(
                self.admission, keys[start:n], context, self.block_tokens, self.observers
            )
            grow = min(k, handle.reserved_blocks)
            stored = i + max(grow, 0)
            if grow > 0:
                node = self._add_leaf(node, keys[i : i + grow])
                handle.reserved_blocks -= grow
                self.reserved_blocks -= grow
        if node != handle.last_node:
            # SGLang's cache_unfinished_req: the request keeps its newly cached pages
            # locked until it finishes, so a running request's KV is never evicted.
            self._lock(node)
            self._unlock(handle.last_node)
            handle.last_node = node
        return stored

    def release(self, handle: RadixHandle) -> None:
        """Free unused reserved pages and unlock the path."""
        self.reserved_blocks -= handle.reserved_blocks
        handle.reserved_blocks = 0
        self._unlock(handle.last_node)

    # ------------------------------------------------------------------ internals
    def _new_node(self, parent: int, edge: I64) -> int:
        v = self.view
        node = self._free_ids.pop()
        self.edges[node] = edge
        self.children[node] = {}
        v.parent[node] = parent
        v.key[node] = int(edge[0])
        v.size[node] = int(edge.shape[0]) * self.block_tokens
        v.depth[node] = (
            int(v.depth[parent]) + int(edge.shape[0]) if parent != ROOT else int(edge.shape[0])
        )
        t = self._tick()
        v.created[node] = t
        v.last_access[node] = t
        v.hits[node] = 0
        v.ref[node] = 0
        children = self.children[parent]
        assert children is not None
        children[int(edge[0])] = node
        return node

    def _split(self, child: int, m: int) -> int:
        """Split ``child``'s edge after m pages; return the new upper node."""
        v = self.view
        edge = self.edges[child]
        assert edge is not None and 0 < m < edge.shape[0]
        parent = int(v.parent[child])
        upper = self._new_node(parent, edge[:m])
        v.ref[upper] = v.ref[child]
        v.last_access[upper] = v.last_access[child]
        v.created[upper] = v.created[child]
        v.hits[upper] = v.hits[child]
        self.edges[child] = edge[m:]
        v.key[child] = int(edge[m])
        v.size[child] = int(edge.shape[0] - m) * self.block_tokens
        v.parent[child] = upper
        upper_children = self.children[upper]
        assert upper_children is not None
        upper_children[int(edge[m])] = child
        self.policy.on_split(upper, child)
        # The lower part now starts at another page: policies that rank by key re-rank it.
        self.policy.on_update(np.array([child], dtype=np.int64))
        return upper

    def _add_leaf(self, parent: int, edge: I64) -> int:
        leaf = self._new_node(parent, edge.copy())
        self.tree_blocks += int(edge.shape[0])
        self._refresh(parent)
        arr = np.array([leaf], dtype=np.int64)
        self.policy.on_insert(arr)
        self._refresh(leaf)
        if self.observers:
            self._emit(Stored(edge.copy()))
        return leaf

    def _remove_leaf(self, leaf: int) -> None:
        v = self.view
        edge = self.edges[leaf]
        assert edge is not None and not self.children[leaf] and v.ref[leaf] == 0
        parent = int(v.parent[leaf])
        parent_children = self.children[parent]
        assert parent_children is not None
        del parent_children[int(edge[0])]
        self.tree_blocks -= int(edge.shape[0])
        self._evictable[leaf] = False
        self.edges[leaf] = None
        self.children[leaf] = None
        v.key[leaf] = -1
        v.parent[leaf] = -1
        self._free_ids.append(leaf)
        if self.observers:
            self._emit(Removed(edge.copy(), True))
        self._refresh(parent)

    def _refresh(self, node: int) -> None:
        """Tell the policy when a node starts or stops being an unlocked leaf."""
        if node == ROOT:
            return
        now = bool(self.view.ref[node] == 0 and not self.children[node])
        if now != self._evictable[node]:
            self._evictable[node] = now
            arr = np.array([node], dtype=np.int64)
            if now:
                self.policy.on_evictable(arr)
            else:
                self.policy.on_pinned(arr)

    def _lock(self, node: int) -> None:
        v = self.view
        while node != ROOT:
            if v.ref[node] == 0:
                self.protected_blocks += int(v.size[node]) // self.block_tokens
            v.ref[node] += 1
            self._refresh(node)
            node = int(v.parent[node])

    def _unlock(self, node: int) -> None:
        v = self.view
        while node != ROOT:
            v.ref[node] -= 1
            if v.ref[node] == 0:
                self.protected_blocks -= int(v.size[node]) // self.block_tokens
            self._refresh(node)
            node = int(v.parent[node])

    def _emit(self, event: Stored | Removed) -> None:
        for obs in self.observers:
            obs.on_event(event)

    # ------------------------------------------------------------------ checks
    def cached_keys(self) -> set[int]:
        out: set[int] = set()
        for edge in self.edges[1:]:
            if edge is not None:
                out.update(edge.tolist())
        return out

    def check(self) -> None:
        """Verify every structural invariant; raises AssertionError on the first broken one."""
        v = self.view
        total = protected = 0
        for node, edge in enumerate(self.edges):
            if node == ROOT or edge is None:
                continue
            parent = int(v.parent[node])
            pc = self.children[parent]
            assert pc is not None and pc.get(int(edge[0])) == node, f"node {node} unlinked"
            assert edge.shape[0] > 0, f"empty edge at {node}"
            assert v.size[node] == edge.shape[0] * self.block_tokens, f"size of {node}"
            base = 0 if parent == ROOT else int(v.depth[parent])
            assert v.depth[node] == base + edge.shape[0], f"depth of {node}"
            assert v.ref[node] >= 0, f"negative lock on {node}"
            if parent != ROOT:
                assert v.ref[parent] >= v.ref[node], f"child {node} locked more than parent"
            leaf_free = v.ref[node] == 0 and not self.children[node]
            assert self._evictable[node] == leaf_free, f"evictable flag of {node}"
            total += int(edge.shape[0])
            if v.ref[node] > 0:
                protected += int(edge.shape[0])
        assert total == self.tree_blocks, "tree page count drifted"
        assert protected == self.protected_blocks, "protected page count drifted"
        assert self.reserved_blocks >= 0
        assert self.tree_blocks + self.reserved_blocks <= self.capacity_blocks, "over capacity"
