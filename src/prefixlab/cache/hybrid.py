"""The hybrid cache of Marconi (DESIGN §2): a token radix tree whose nodes hold the KV of
their edge and, optionally, a recurrent-state (SSM) checkpoint at the edge's end.

- **Bytes.** A node holds ``len(edge) x kv_bytes_per_token`` (attention layers) plus, with a
  checkpoint, ``state_bytes_per_checkpoint`` (every SSM layer's state and conv state). One
  byte budget covers both.
- **Reuse.** A recurrent state cannot be rolled back, so a prefix is reusable only up to the
  deepest node on the matched path that holds a checkpoint *and* whose edge is fully
  matched. A model without SSM layers reuses every matched token (KV can be sliced).
- **Admission** (which checkpoints exist) is an object the policy holds
  (:mod:`prefixlab.policies.admission`): ``all-blocks`` (one every ``block_tokens``:
  vLLM+), ``judicious`` (Marconi: the branch point where the sequence leaves an existing
  edge, found by speculative insertion before prefill, plus the state after the last
  decoded token), or ``none`` (nothing cached: the vanilla baseline). The cache asks it
  before every insertion and tells its observers ``Admitted`` (the checkpoint positions
  stored) or ``Rejected`` (the sequence refused, by the admission or for room).
- **Eviction** candidates are unlocked leaves, and (with SSM layers) unlocked nodes with
  exactly one child that hold a checkpoint: evicting one drops its checkpoint and merges its
  edge into the child. A node left with one child and no checkpoint is merged at once: it
  could never be reused and frees nothing. The policy picks victims
  (:class:`prefixlab.policies.hybrid.HybridPolicy`).

The replay contract (Marconi's simulator): match the input; evict until the new KV and
checkpoints of input + output fit; insert them; the matched path is locked meanwhile.

**The clock** is logical, as in Marconi's simulator (``use_logical_ts``): it ticks once at a
lookup, once when an insertion starts, once at the speculative match of the sequence that
sizes it, and once per eviction call (not per victim)::

    request r:  lookup ─► insert ─► match(input + output) ─► [evict] ─► new nodes
    clock:      +1        +1        +1                        +1        (stamped now)

so the stamps of one request are strictly ordered (a lookup before the nodes it creates),
and recency never divides by zero: an eviction call always runs after its own tick.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from prefixlab.cache.events import Admitted, Observer, Rejected
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.model.spec import ModelSpec
from prefixlab.types import I64

EMPTY = np.zeros(0, dtype=np.int64)


class AdmissionPolicy(Protocol):
    """What the cache asks before an insertion (:class:`prefixlab.policies.admission.
    Admission` is the built-in base): whether to store the sequence, how much of it, which
    checkpoints to leave, and how much of a match the engine reuses."""

    def branch_match(self) -> str: ...
    def admit(self, seq_tokens: int) -> bool: ...
    def stored_tokens(self, seq_tokens: int) -> int: ...
    def checkpoints(self, seq_tokens: int, branch_at: int | None) -> list[int]: ...
    def reusable(self, tokens: int, has_state: bool) -> int: ...
    @property
    def fills_partial_blocks(self) -> bool: ...


class HybridCachePolicy(Protocol):
    """What the cache asks of its policy (:class:`prefixlab.policies.hybrid.HybridPolicy`
    is the built-in base): its admission, how an insertion is sized and, told of every
    hit, insertion, change and removal, which nodes to evict."""

    @property
    def admission(self) -> AdmissionPolicy: ...

    #: block size of vLLM+'s estimate (``sizing = "estimate"``)
    block_tokens: int
    sizing: str

    def bind_cache(self, cache: HybridCache) -> None: ...
    def touched(self, m: HybridMatch) -> None: ...
    def inserted(self, m: HybridMatch) -> None: ...
    def changed(self, nd: Node) -> None: ...
    def gone(self, nd: Node) -> None: ...
    def free(self, need: int) -> int:
        """Evict until ``need`` bytes are free if it can; returns the bytes freed."""
        ...


LOCKS = ("path", "none")


@dataclass(eq=False, slots=True)
class Node:
    """A tree node: the edge ``tokens`` covering positions ``[start, start + len)``."""

    id: int
    parent: Node | None
    start: int
    tokens: I64
    ckpt: bool = False
    last_access: float = 0.0
    lock: int = 0
    children: dict[int, Node] = field(default_factory=dict)
    #: start + len(tokens), kept as a field (hot): splits and merges move ``start`` only
    end: int = field(init=False)

    def __post_init__(self) -> None:
        self.end = self.start + int(self.tokens.shape[0])

    def __repr__(self) -> str:
        return f"Node({self.id}, [{self.start},{self.end}), ckpt={self.ckpt})"


@dataclass(slots=True)
class HybridMatch:
    """Where a token sequence leaves the tree.

    ``path``: nodes whose edges it matches fully, root excluded; ``partial``: the child it
    then matches only ``partial_len`` tokens of (None if it stops at a node boundary);
    ``matched``: tokens matched in all; ``reusable``: tokens whose KV and state can be reused;
    ``reuse_node``: the node that ends at ``reusable`` (None when 0).
    """

    path: list[Node]
    partial: Node | None
    partial_len: int
    matched: int
    reusable: int
    reuse_node: Node | None


def _common(a: I64, b: I64) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    differ = a[:n] != b[:n]
    i = int(differ.argmax())  # the first difference, or 0 when there is none
    return i if differ[i] else n


class HybridCache:
    """KV + SSM-checkpoint radix tree under one byte budget."""

    def __init__(
        self,
        capacity_bytes: int,
        model: ModelSpec,
        policy: HybridCachePolicy,
        locks: str = "path",
        observers: Sequence[Observer] = (),
    ) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
            raise ConfigError(f"capacity_bytes must be an integer, got {capacity_bytes!r}")
        if capacity_bytes <= 0:
            raise ConfigError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if locks not in LOCKS:
            raise ConfigError(f"locks must be one of {', '.join(LOCKS)}, got {locks!r}")
        self.capacity = capacity_bytes
        #: ``path``: an insertion keeps the nodes its sequence matches (but one-child nodes
        #: with a state, whose eviction only drops the state); ``none``: nothing is kept, as
        #: in Marconi's simulator, and an insertion may then exceed the budget until the
        #: next eviction (see :meth:`admit`)
        self.locks = locks
        self.model = model
        self.policy = policy
        #: told ``Admitted`` / ``Rejected`` at every insertion
        self.observers = list(observers)
        self.kv = model.kv_bytes_per_token
        self.state = model.state_bytes_per_checkpoint if model.num_ssm_layers else 0
        self.has_state = model.num_ssm_layers > 0
        self.root = Node(0, None, 0, np.zeros(0, dtype=np.int64))
        self.nodes: dict[int, Node] = {0: self.root}
        self._next_id = 1
        self.used = 0
        #: the logical clock (see the module docstring)
        self.clock = 0
        # counters
        self.bytes_written = 0
        self.bytes_evicted = 0
        self.num_evicted_nodes = 0
        self.num_merges = 0
        self.num_checkpoints_written = 0
        self.num_rejected = 0
        #: eviction calls (each ticks the clock once); Marconi's tuner starts at the first
        self.num_evict_calls = 0
        policy.bind_cache(self)

    def tick(self) -> int:
        """Advance the logical clock; the new time."""
        self.clock += 1
        return self.clock

    # ------------------------------------------------------------------ sizes
    def node_bytes(self, node: Node) -> int:
        return int(node.tokens.shape[0]) * self.kv + (self.state if node.ckpt else 0)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes) - 1

    @property
    def num_checkpoints(self) -> int:
        return sum(1 for n in self.nodes.values() if n.ckpt)

    def iter_nodes(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n is not self.root)

    # ------------------------------------------------------------------ lookup
    def match(self, tokens: I64) -> HybridMatch:
        """Walk ``tokens`` down the tree (no change to it)."""
        node = self.root
        pos = 0
        path: list[Node] = []
        reusable, reuse_node = 0, None
        n = int(tokens.shape[0])
        partial, partial_len = None, 0
        while pos < n:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            m = _common(child.tokens, tokens[pos:])
            if m < child.tokens.shape[0]:
                partial, partial_len = child, m
                break
            pos += m
            node = child
            path.append(child)
            if child.ckpt or not self.has_state:
                reusable, reuse_node = pos, child
        matched = pos + partial_len
        if not self.has_state and partial_len:
            reusable, reuse_node = matched, partial  # KV slices: a partial edge is reusable
        return HybridMatch(path, partial, partial_len, matched, reusable, reuse_node)

    def reuse(self, input_tokens: I64) -> HybridMatch:
        """What a request's input can reuse, without touching anything."""
        m = self.match(input_tokens)
        reusable = self.policy.admission.reusable(m.reusable, self.has_state)
        if reusable != m.reusable:
            # vLLM+ on a Transformer: KV is reused in whole blocks, as vLLM does
            m.reusable = reusable
            if m.partial is not None and m.reusable <= m.matched - m.partial_len:
                m.reuse_node = m.path[-1] if m.path and m.reusable else None
        return m

    def lookup(self, input_tokens: I64) -> HybridMatch:
        """Match a request's input (one tick) and refresh what the policy says it touched."""
        m = self.reuse(input_tokens)
        self.touch(m)
        return m

    def touch(self, m: HybridMatch) -> None:
        """A lookup: tick, then the policy stamps what the match accessed."""
        self.tick()
        self.policy.touched(m)

    # ------------------------------------------------------------------ insert
    def checkpoint_positions(
        self, seq: I64, m_input: HybridMatch, m_seq: HybridMatch | None = None
    ) -> list[int]:
        """Token positions that get a checkpoint when ``seq`` is inserted: the admission's
        answer. ``m_input`` / ``m_seq``: the matches of the input and of the whole sequence;
        the admission says which one's divergence is the branch point (speculative
        insertion: where the tokens leave an edge strictly inside it, a new intermediate
        node appears)."""
        adm = self.policy.admission
        branch_at = None
        which = adm.branch_match()
        if which and self.has_state:
            m = m_input
            if which == "sequence":
                m = self.match(seq) if m_seq is None else m_seq
            if m.partial is not None:
                branch_at = m.matched
        return adm.checkpoints(int(seq.shape[0]), branch_at)

    def insert_extent(self, seq: I64) -> int:
        """Tokens of ``seq`` the admission stores (all-blocks: whole blocks only, unless the
        policy keeps partial blocks)."""
        return self.policy.admission.stored_tokens(int(seq.shape[0]))

    def plan_bytes(
        self, seq: I64, ckpts: list[int], m: HybridMatch | None = None
    ) -> tuple[int, int]:
        """(new bytes, new checkpoints) inserting ``seq`` with checkpoints at ``ckpts``
        (``m``: ``seq``'s match, when the caller has it)."""
        m = self.match(seq) if m is None else m
        new_tokens = int(seq.shape[0]) - m.matched
        ends = {nd.end: nd for nd in m.path}
        new_ckpts = 0
        for q in ckpts:
            nd = ends.get(q)
            if nd is None or not nd.ckpt:
                new_ckpts += 1
        net = new_ckpts
        if self.policy.admission.fills_partial_blocks:
            b, n = self.policy.block_tokens, int(seq.shape[0])
            net -= sum(1 for nd in m.path if nd.ckpt and nd.end % b and nd.end < n)  # filled
        return new_tokens * self.kv + net * self.state, new_ckpts

    def admit(self, seq: I64, input_len: int, m_input: HybridMatch) -> bool:
        """Store ``seq`` (input + output) with the admission's checkpoints, evicting first.
        Returns False if it cannot fit even in an empty cache (then nothing is stored).

        Ticks as Marconi's simulator does: once as the insertion starts, once at the
        speculative match of ``seq`` (which refreshes what it touches, as a lookup does),
        once per eviction call; new nodes are stamped with the clock after all of them.
        """
        if not self.policy.admission.admit(int(seq.shape[0])):
            self._emit(Rejected(EMPTY, int(seq.shape[0])))
            return False
        seq = seq[: self.insert_extent(seq)]
        if seq.shape[0] == 0:
            return False
        self.tick()
        m = self.match(seq)
        self.touch(m)
        ckpts = [q for q in self.checkpoint_positions(seq, m_input, m) if q <= seq.shape[0]]
        need, _ = self.plan_bytes(seq, ckpts, m)
        overflow = self.policy.sizing == "estimate" or self.locks == "none"
        if self.policy.sizing == "estimate":
            need = self._estimate_bytes(seq, m)
        elif need > self.capacity:
            return self._reject(seq, ckpts)
        # The sequence's matched nodes stay while it is inserted (unless locks="none")
        matched = [nd for nd in [*m.path, m.partial] if nd is not None]
        locked = matched if self.locks == "path" else []
        for nd in locked:
            nd.lock += 1
            self.policy.changed(nd)
        try:
            if self.used + need > self.capacity:
                ckpts = self._make_room(seq, m_input, need, ckpts)
            if self.used + need > self.capacity and not overflow:
                return self._reject(seq, ckpts)
            self._insert(seq, ckpts)
        finally:
            self._unlock(locked, matched)
        if self.policy.admission.fills_partial_blocks:
            self._fill_partial_blocks(seq)
        if self.observers:
            self._emit(Admitted(np.array(ckpts, dtype=np.int64), int(seq.shape[0])))
        return True

    def _make_room(self, seq: I64, m_input: HybridMatch, need: int, ckpts: list[int]) -> list[int]:
        """Evict so that ``need`` more bytes fit; the checkpoints ``seq`` gets now
        (``ckpts`` unless the eviction may have moved its branch point)."""
        self.evict(self.used + need - self.capacity)
        if self.locks == "none" and self.policy.admission.branch_match() == "sequence":
            # Nothing was kept: where the sequence leaves the tree may have moved (its
            # matched nodes evicted or merged). The branch state goes where it leaves it
            # now, as the simulator's insertion splits (with a state) where it must; the
            # insertion may exceed the budget, as there.
            return [
                q
                for q in self.checkpoint_positions(seq, m_input, self.match(seq))
                if q <= seq.shape[0]
            ]
        return ckpts

    def _unlock(self, locked: list[Node], matched: list[Node]) -> None:
        """After an insertion: unlock the nodes it kept and normalize those still in the
        tree that it matched (deepest first)."""
        for nd in locked:
            nd.lock -= 1
            if nd.id in self.nodes:
                self.policy.changed(nd)
        for nd in reversed(matched):
            if nd.id in self.nodes:
                self._normalize(nd)

    def _reject(self, seq: I64, ckpts: list[int]) -> bool:
        """The sequence cannot fit: nothing of it is stored."""
        self.num_rejected += 1
        if self.observers:
            self._emit(Rejected(np.array(ckpts, dtype=np.int64), int(seq.shape[0])))
        return False

    def _emit(self, event: Admitted | Rejected) -> None:
        for obs in self.observers:
            obs.on_event(event)

    def _insert(self, seq: I64, ckpts: list[int]) -> None:
        node = self.root
        pos = 0
        n = int(seq.shape[0])
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                leaf = self._new_node(node, pos, seq[pos:].copy())
                self._charge(leaf)
                break
            m = _common(child.tokens, seq[pos:])
            if m < child.tokens.shape[0]:
                child = self._split(child, m)
            pos += m
            node = child
        self._place_checkpoints(seq, ckpts)
        self.policy.inserted(self.match(seq))

    def _place_checkpoints(self, seq: I64, ckpts: list[int]) -> None:
        """Give the nodes ending at each position of ``ckpts`` (ascending) a checkpoint,
        splitting edges where needed, in one walk down the stored sequence."""
        node = self.root
        for q in ckpts:
            while node.end < q:
                child = node.children[int(seq[node.end])]
                if child.end > q:
                    child = self._split(child, q - child.start)
                node = child
            if not node.ckpt:
                node.ckpt = True
                node.last_access = self.clock  # a new checkpoint is a new entry
                self.policy.changed(node)
                self.used += self.state
                self.bytes_written += self.state
                self.num_checkpoints_written += 1

    def _estimate_bytes(self, seq: I64, m: HybridMatch) -> int:
        """vLLM+'s size estimate in Marconi's simulator (``sizing=estimate``): the tokens
        beyond one block per matched block *and one for the root*, a fractional state per
        block of them; it can be negative (no eviction), and the insertion goes ahead even
        when the cache would then exceed its budget."""
        b = self.policy.block_tokens
        blocks = 1 + sum(1 for nd in m.path if nd.ckpt)
        extra = int(seq.shape[0]) - b * blocks
        return int(extra / b * self.state + extra * self.kv)

    def _fill_partial_blocks(self, seq: I64) -> None:
        """vLLM+ with partial blocks: a stored partial block that ``seq`` extends is filled
        in place (the simulator's rule), so the state at its old end goes and its KV joins
        the rest of the block."""
        b = self.policy.block_tokens
        n = int(seq.shape[0])
        for nd in self.match(seq).path:
            if nd.ckpt and nd.end % b and nd.end < n:
                nd.ckpt = False
                self.used -= self.state
                self.bytes_evicted += self.state
                self.policy.changed(nd)
                if len(nd.children) == 1 and not nd.lock:
                    self._merge(nd)  # one block now (a Transformer's too)

    def _new_node(self, parent: Node, start: int, tokens: I64) -> Node:
        nd = Node(self._next_id, parent, start, tokens, last_access=self.clock)
        self._next_id += 1
        parent.children[int(tokens[0])] = nd
        self.nodes[nd.id] = nd
        self.policy.changed(nd)
        self.policy.changed(parent)
        return nd

    def _charge(self, nd: Node) -> None:
        b = int(nd.tokens.shape[0]) * self.kv
        self.used += b
        self.bytes_written += b

    def _split(self, child: Node, m: int) -> Node:
        """Cut ``child``'s edge after ``m`` tokens; the new upper node is returned. It has no
        checkpoint and is new (stamped now, as the simulator's split node); the lower part
        keeps its recency."""
        assert 0 < m < child.tokens.shape[0]
        parent = child.parent
        assert parent is not None
        # no eviction runs while a request inserts, so the new node needs no lock
        # both parts view the edge's own array (never written in place)
        upper = Node(self._next_id, parent, child.start, child.tokens[:m], last_access=self.clock)
        self._next_id += 1
        parent.children[int(upper.tokens[0])] = upper
        self.nodes[upper.id] = upper
        child.tokens = child.tokens[m:]
        child.start += m  # its end stays
        child.parent = upper
        upper.children[int(child.tokens[0])] = child
        self.policy.changed(upper)
        self.policy.changed(child)
        return upper

    # ------------------------------------------------------------------ eviction
    def evict(self, need: int) -> int:
        """One eviction call (one tick): the policy frees ``need`` bytes if it can."""
        self.tick()
        self.num_evict_calls += 1
        return self.policy.free(need)

    def is_candidate(self, nd: Node) -> bool:
        """Evictable now: an unlocked leaf, or an unlocked one-child node with a state."""
        return not nd.lock and self.has_candidate_shape(nd)

    def has_candidate_shape(self, nd: Node) -> bool:
        """A leaf, or a one-child node with a state (evictable unless locked)."""
        if nd is self.root:
            return False
        if not nd.children:
            return True
        return self.has_state and nd.ckpt and len(nd.children) == 1

    def candidates(self) -> list[Node]:
        return [nd for nd in self.iter_nodes() if self.is_candidate(nd)]

    def freed_by(self, nd: Node) -> int:
        """Bytes evicting ``nd`` frees: all of a leaf; a one-child node's checkpoint."""
        return self.node_bytes(nd) if not nd.children else (self.state if nd.ckpt else 0)

    def remove(self, nd: Node) -> list[Node]:
        """Evict a candidate; returns nodes whose candidacy may have changed (its parent, or
        the child it merged into)."""
        assert self.is_candidate(nd), nd
        parent = nd.parent
        assert parent is not None
        freed = self.freed_by(nd)
        self.used -= freed
        self.bytes_evicted += freed
        self.num_evicted_nodes += 1
        if not nd.children:
            del parent.children[int(nd.tokens[0])]
            del self.nodes[nd.id]
            self.policy.gone(nd)
            if parent is not self.root:
                self.policy.changed(parent)
            changed = [parent] if parent is not self.root else []
            if parent is not self.root:
                changed = self._normalize(parent) or changed
            return changed
        child = self._merge(nd)
        return [child]

    def _merge(self, nd: Node) -> Node:
        """Fold a one-child node into its child (the checkpoint is gone; KV stays). The
        merged node keeps the newer of the two access times (the simulator's rule)."""
        (child,) = nd.children.values()
        parent = nd.parent
        assert parent is not None
        child.tokens = np.concatenate([nd.tokens, child.tokens])
        child.start = nd.start
        child.last_access = max(child.last_access, nd.last_access)
        child.parent = parent
        parent.children[int(child.tokens[0])] = child
        del self.nodes[nd.id]
        self.policy.gone(nd)
        self.policy.changed(child)
        self.num_merges += 1
        return child

    def _normalize(self, nd: Node) -> list[Node]:
        """Merge ``nd`` if it has one child and no checkpoint (it could never be reused)."""
        if nd is self.root or nd.lock or nd.ckpt or len(nd.children) != 1:
            return []
        if not self.has_state:
            return []  # a Transformer's intermediate KV is reusable as is
        return [self._merge(nd)]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Invariants: byte accounting exact, tree shape, no locks between requests."""
        total = 0
        seen = 0
        stack = [self.root]
        while stack:
            nd = stack.pop()
            seen += 1
            if nd is not self.root:
                total += self.node_bytes(nd)
                assert nd.tokens.shape[0] > 0, f"{nd}: empty edge"
                assert nd.end == nd.start + nd.tokens.shape[0], f"{nd}: stale end"
                assert nd.parent is not None and nd.start == nd.parent.end, f"{nd}: bad start"
                assert nd.parent.children.get(int(nd.tokens[0])) is nd, f"{nd}: not indexed"
                if self.has_state and len(nd.children) == 1 and not nd.ckpt and not nd.lock:
                    raise AssertionError(f"{nd}: one child and no checkpoint (not merged)")
            assert nd.lock == 0, f"{nd}: still locked"
            assert self.nodes.get(nd.id) is nd, f"{nd}: not registered"
            for key, ch in nd.children.items():
                assert int(ch.tokens[0]) == key and ch.parent is nd, f"{ch}: bad child link"
                stack.append(ch)
        assert seen == len(self.nodes), "unreachable nodes registered"
        assert total == self.used, f"bytes: counted {total}, accounted {self.used}"
        if self.policy.sizing != "estimate" and self.locks == "path":
            assert self.used <= self.capacity, f"over capacity: {self.used} > {self.capacity}"

    def fits_or_raise(self, need: int, request: int) -> None:
        if need > self.capacity:
            raise CapacityError(
                f"request {request} needs {need:,} bytes, more than the capacity {self.capacity:,}"
            )
