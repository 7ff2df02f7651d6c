"""Policies of the hybrid (KV + SSM state) cache: Marconi and its baselines as named systems.

========== ============= ===================================== ==========================
name       admission     eviction                              recency on a hit
========== ============= ===================================== ==========================
vanilla    none          -                                     -
vllm+      all-blocks    LRU over leaves                       whole matched path
sglang+    judicious     LRU over leaves                       whole matched path
marconi    judicious     recency + alpha x FLOP efficiency     only the node reused
========== ============= ===================================== ==========================

Marconi's score of a candidate is ``norm(recency) + alpha * norm(flop_efficiency)``, both
min-max normalised; the lowest is evicted, one at a time, until the new request fits. The
defaults are the rules of Marconi's published simulator (github ruipeterpan/marconi), against
which ``tests/test_reference_marconi.py`` checks prefixlab request by request:

- ``recency=inverse-age``: ``1 / (now - last access)`` on the cache's logical clock (see
  :class:`~prefixlab.cache.hybrid.HybridCache`); ``last-access`` is the raw access time.
- ``efficiency=prefix``: the FLOPs the node saves over its parent (its whole prefix's
  prefill minus the parent's) divided by one state plus the KV of the node's *whole
  prefix*; ``node`` divides by the bytes the node itself holds (its edge's KV and state).
- Every node with at most one child is scored, locked ones too (a running request's path
  moves the normalisation, as in the simulator, where nothing is locked); only unlocked ones
  are evicted. Ties go to the first node in depth-first pre-order, as the simulator's rescan.
- A hit refreshes only the deepest fully matched node (SGLang+ and vLLM+: the whole path).

The paper's Sec. 4.2 says both terms are normalised over "all nodes' ... in the radix tree"
and that tuning keeps "the alpha that maximizes the hit rate" (``objective=hit_ratio``); the
simulator normalises over the nodes with at most one child and maximises the FLOPs saved over
the last 500 replayed requests (``objective=flops_saved``, ``score_window=500``, defaults).

**Exact with less work.** The simulator rescans every candidate for every victim (O(n) per
victim, in Python). Here the candidates are scored once, vectorised, and evicted in score
order; the order is recomputed only when it can change: when a candidate appears (a parent
becomes a leaf) or changes (a merge lengthens a child's edge), or when the victim was the last
candidate holding a min or max of recency or efficiency (the normalisation moves). Otherwise
removing a candidate leaves every other score unchanged, so the next in order is exactly what
a rescan would pick (tested against a rescanning reference).

On a model without SSM layers (a Transformer) there is no state to weigh against its KV,
and admission stores the same tokens either way: ``marconi`` then behaves exactly as
``sglang+`` (LRU over leaves, path refresh), so the comparison isolates what hybrid models
gain.

``marconi`` without ``alpha`` tunes it (see :mod:`prefixlab.runner.hybrid`): alpha = 0
until the first eviction call; the requests up to ``bootstrap_multiplier`` times those seen
by then are replayed for each alpha of the grid (0 to 2 by 0.1, the simulator's) and the best
by ``objective`` takes effect at once; ties go to the smallest alpha.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.policies.base import I64, EvictionPolicy, register

if TYPE_CHECKING:
    from prefixlab.cache.hybrid import HybridCache, HybridMatch, Node

OBJECTIVES = ("hit_ratio", "flops_saved")


BRANCHES = ("sequence", "input")
RECENCIES = ("inverse-age", "last-access")
EFFICIENCIES = ("prefix", "node")
SIZINGS = ("exact", "estimate")


class HybridPolicy(EvictionPolicy):
    """Admission (which checkpoints exist) and eviction for :class:`HybridCache`."""

    structures: ClassVar[frozenset[str]] = frozenset({"hybrid"})
    admission: ClassVar[str] = "judicious"
    #: on a hit, refresh the whole matched path (SGLang) or only the node reused (Marconi)
    touch_path: ClassVar[bool] = True
    #: a path refresh also stamps the child matched only in part (SGLang+ in the simulator)
    touch_partial: ClassVar[bool] = False
    block_tokens: int = 32
    #: all-blocks admission also stores a sequence's trailing partial block, with a state
    partial_blocks: bool = False
    #: ``exact``: evict exactly what the insertion needs; ``estimate``: vLLM+'s estimate in
    #: Marconi's simulator (see ``HybridCache._estimate_bytes``; may exceed the budget)
    sizing: str = "exact"
    chunk_tokens: int = 0
    #: the branch checkpoint: where the whole sequence (input + output) leaves an edge, as
    #: Marconi's simulator places it, or where the input does (the paper's Sec. 4.1 words)
    branch: str = "sequence"
    #: the runner tunes alpha (marconi without a fixed alpha)
    tunes: bool = False

    cache: HybridCache

    def bind_cache(self, cache: HybridCache) -> None:
        self.cache = cache

    def touched(self, m: HybridMatch) -> None:
        """A lookup (or the speculative match of an insertion) accessed ``m``: stamp the
        whole matched path (LRU baselines) or only the deepest fully matched node."""
        now = self.cache.clock
        if self.touch_path:
            for nd in m.path:
                nd.last_access = now
            if m.partial is not None and (self.touch_partial or m.reuse_node is m.partial):
                m.partial.last_access = now
        elif m.path:
            m.path[-1].last_access = now

    def inserted(self, m: HybridMatch) -> None:
        """After an insertion: ``m`` matches the stored sequence. New nodes were stamped
        when created; a path refresh stamps every node the insertion walked."""
        if self.touch_path:
            now = self.cache.clock
            for nd in m.path:
                nd.last_access = now

    def changed(self, nd: Node) -> None:
        """The cache changed something eviction may read of ``nd`` (children, checkpoint,
        lock, edge, recency), or created it."""

    def gone(self, nd: Node) -> None:
        """``nd`` left the tree (evicted or merged into its child)."""

    def free(self, need: int) -> int:
        """Evict until ``need`` bytes are freed (or nothing is evictable); bytes freed."""
        raise NotImplementedError

    def evict(self, n: int) -> I64:  # the block/radix protocol does not apply
        raise ConfigError(f"policy '{self.name}' applies to the hybrid structure only")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


@register("vanilla")
class Vanilla(HybridPolicy):
    """No prefix caching: every prompt is prefilled in full (the baseline of baselines)."""

    admission: ClassVar[str] = "none"

    def free(self, need: int) -> int:
        return 0


def _lru_leaves(cache: HybridCache, need: int) -> int:
    """Evict least recently used unlocked leaves until ``need`` bytes are freed; ties go to
    the deeper leaf, then the smaller id."""
    heap = [(nd.last_access, -nd.end, nd.id, nd) for nd in cache.iter_nodes()
            if not nd.children and not nd.lock]  # fmt: skip
    heapq.heapify(heap)
    freed = 0
    while freed < need and heap:
        _, _, nid, nd = heapq.heappop(heap)
        if cache.nodes.get(nid) is not nd or nd.children or nd.lock:
            continue
        freed += cache.freed_by(nd)
        for ch in cache.remove(nd):
            if not ch.children and not ch.lock and ch is not cache.root:
                heapq.heappush(heap, (ch.last_access, -ch.end, ch.id, ch))
    return freed


class _LRULeaves(HybridPolicy):
    """LRU over leaves, whole-path refresh (SGLang's radix cache)."""

    def free(self, need: int) -> int:
        return _lru_leaves(self.cache, need)


@register("vllm+")
class VllmPlus(_LRULeaves):
    """vLLM+ (Marconi's baseline, Sec. 5.1): a state checkpoint every block, LRU eviction."""

    admission: ClassVar[str] = "all-blocks"

    def __init__(self, block_tokens: int = 32, partial_blocks: bool = True,
                 sizing: str = "exact") -> None:  # fmt: skip
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
        if not isinstance(partial_blocks, bool):
            raise ValueError(f"partial_blocks must be true or false, got {partial_blocks!r}")
        self.block_tokens = block_tokens
        self.partial_blocks = partial_blocks
        self.sizing = _choice("sizing", sizing, SIZINGS)

    def touched(self, m: HybridMatch) -> None:
        """The whole matched path, but not a partial block (the simulator stamps only the
        full blocks a match walks through)."""
        now = self.cache.clock
        b = self.block_tokens
        for nd in m.path:
            if nd.end % b == 0:
                nd.last_access = now


@register("sglang+")
class SglangPlus(_LRULeaves):
    """SGLang+ (Marconi's baseline, Sec. 5.1): judicious admission, LRU over leaves."""

    touch_partial: ClassVar[bool] = True

    def __init__(self, chunk_tokens: int = 0, branch: str = "sequence") -> None:
        self.chunk_tokens = _chunk(chunk_tokens)
        self.branch = _choice("branch", branch, BRANCHES)


def _chunk(chunk_tokens: Any) -> int:
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be an integer >= 0, got {chunk_tokens!r}")
    return int(chunk_tokens)


@register("marconi")
class Marconi(HybridPolicy):
    """Marconi (Sec. 4.1-4.2): judicious admission, FLOP-aware eviction (recency + alpha x eff.)."""

    touch_path: ClassVar[bool] = False

    def __init__(
        self,
        alpha: float | None = None,
        bootstrap_multiplier: float = 5.0,
        alpha_max: float = 2.0,
        alpha_step: float = 0.1,
        objective: str = "flops_saved",
        score_window: int = 500,
        recency: str = "inverse-age",
        efficiency: str = "prefix",
        branch: str = "sequence",
        retune_every: int = 0,
        chunk_tokens: int = 0,
        tune_jobs: int = 1,
    ) -> None:
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)
                                  or alpha < 0):  # fmt: skip
            raise ValueError(f"alpha must be a number >= 0, got {alpha!r}")
        for name, v in (("bootstrap_multiplier", bootstrap_multiplier), ("alpha_max", alpha_max),
                        ("alpha_step", alpha_step)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name, iv in (("retune_every", retune_every), ("tune_jobs", tune_jobs),
                         ("score_window", score_window)):  # fmt: skip
            if isinstance(iv, bool) or not isinstance(iv, int) or iv < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {iv!r}")
        self.alpha = None if alpha is None else float(alpha)
        self.bootstrap_multiplier = float(bootstrap_multiplier)
        self.alpha_max = float(alpha_max)
        self.alpha_step = float(alpha_step)
        self.objective = _choice("objective", objective, OBJECTIVES)
        self.score_window = score_window
        self.recency = _choice("recency", recency, RECENCIES)
        self.efficiency_of = _choice("efficiency", efficiency, EFFICIENCIES)
        self.branch = _choice("branch", branch, BRANCHES)
        self.retune_every = retune_every
        self.chunk_tokens = _chunk(chunk_tokens)
        self.tune_jobs = max(1, tune_jobs)
        self.tunes = alpha is None
        #: the alpha in use (tuned: 0 until the first tuning)
        self.current_alpha = 0.0 if alpha is None else float(alpha)
        self._eff: dict[int, tuple[int, int, bool, float]] = {}
        #: scoring passes over the candidates, and victims (a rescan does one pass each)
        self.num_passes = 0
        self.num_victims = 0
        #: candidate scores computed in all (a rescan computes every candidate per victim)
        self.num_scored = 0
        self._index = _CandidateIndex()

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "bootstrap_multiplier": self.bootstrap_multiplier,
                "alpha_max": self.alpha_max, "alpha_step": self.alpha_step,
                "objective": self.objective, "score_window": self.score_window,
                "recency": self.recency, "efficiency": self.efficiency_of,
                "branch": self.branch, "retune_every": self.retune_every,
                "chunk_tokens": self.chunk_tokens, "tune_jobs": self.tune_jobs}  # fmt: skip

    def with_alpha(self, alpha: float) -> Marconi:
        """The same policy with ``alpha`` fixed (what the tuner replays)."""
        return Marconi(**{**self.params(), "alpha": alpha})

    def alpha_grid(self) -> list[float]:
        """0, step, 2 step, ..., alpha_max (rounded to the step's decimals)."""
        n = round(self.alpha_max / self.alpha_step)
        return [round(i * self.alpha_step, 10) for i in range(n + 1)]

    # ------------------------------------------------------------------ scoring
    def efficiency(self, nd: Node) -> float:
        """FLOPs the node saves over its parent per byte (memoised per shape).

        ``efficiency=prefix`` (Marconi's simulator) divides by one checkpoint plus the KV
        of the node's *whole prefix*; ``node`` divides by the bytes the node itself holds
        (its edge's KV and its checkpoint), as ``ModelSpec.flop_efficiency`` does.
        """
        key = (nd.start, nd.end, nd.ckpt)
        hit = self._eff.get(nd.id)
        if hit is not None and hit[:3] == key:
            return hit[3]
        cache = self.cache
        model = cache.model
        saved = model.total_prefill_flops(nd.end) - model.total_prefill_flops(nd.start)
        if self.efficiency_of == "prefix":
            held = nd.end * cache.kv + (cache.state if nd.ckpt else 0)
        else:
            held = cache.node_bytes(nd)
        eff = saved / held if held else 0.0  # holds nothing (a state-less model's empty leaf)
        self._eff[nd.id] = (*key, eff)
        return eff

    def recency_of(self, last_access: Any) -> Any:
        """The recency term from raw access times: ``inverse-age`` is the simulator's
        ``1 / (now - last access)`` on the logical clock (an eviction call ticks first, so
        the age is at least 1); ``last-access`` is the raw time."""
        r = np.asarray(last_access, dtype=np.float64)
        if self.recency == "last-access":
            return r
        age = float(self.cache.clock) - r
        return np.divide(1.0, age, out=np.full_like(r, np.inf), where=age > 0)

    def scores(self, cands: list[Node]) -> tuple[Any, Any, Any]:
        """(score, recency, efficiency) arrays of the candidates."""
        r = self.recency_of([nd.last_access for nd in cands])
        f = np.array([self.efficiency(nd) for nd in cands], dtype=np.float64)
        return normalised_score(r, f, self.current_alpha), r, f

    def touched(self, m: HybridMatch) -> None:
        if not self.cache.has_state:  # no states to weigh: SGLang+'s recency (see free)
            now = self.cache.clock
            for nd in m.path:
                nd.last_access = now
            if m.partial is not None and m.reuse_node is m.partial:
                m.partial.last_access = now
            return
        super().touched(m)
        if m.path:
            self.changed(m.path[-1])

    def inserted(self, m: HybridMatch) -> None:
        if not self.cache.has_state:
            now = self.cache.clock
            for nd in m.path:
                nd.last_access = now

    def changed(self, nd: Node) -> None:
        cache = self.cache
        if cache.has_state and nd.id in cache.nodes and cache.has_candidate_shape(nd):
            # a locked node (a running request's path) stays in the normalisation, as every
            # node with at most one child is scored in the simulator; it is not evicted
            self._index.upsert(nd, nd.last_access, self.efficiency(nd), not nd.lock)
        else:
            self._index.drop(nd.id)

    def gone(self, nd: Node) -> None:
        self._index.drop(nd.id)
        self._eff.pop(nd.id, None)

    def free(self, need: int) -> int:
        cache = self.cache
        if not cache.has_state:
            # A Transformer has no recurrent states: admission stores the same KV either
            # way and no node trades a state's bytes against its FLOPs, so Marconi is
            # SGLang+ there (the paper's gains are those of hybrid models).
            return _lru_leaves(cache, need)
        ix = self._index
        freed = 0
        while freed < need:
            live = ix.live()
            r, f, ids = ix.r[live], ix.f[live], ix.ids[live]
            score = normalised_score(self.recency_of(r), f, self.current_alpha)
            self.num_passes += 1
            self.num_scored += int(live.shape[0])
            order = np.argsort(score, kind="stable")
            order = order[ix.evictable[live][order]]
            if order.shape[0] == 0:
                break
            order = _ties_in_tree_order(order, score, ix.node, live)
            extremes = _extreme_counts(r, f)
            for i in order.tolist():
                v = ix.node[int(live[i])]
                assert v is not None and v.id == int(ids[i])
                self.num_victims += 1
                freed += cache.freed_by(v)
                ix.dirty = False
                ix.victim = v.id
                cache.remove(v)
                if freed >= need:
                    return freed
                if _moves_bounds(extremes, float(r[i]), float(f[i])) or ix.dirty:
                    break  # the order may change: score the candidates again
        return freed


def _ties_in_tree_order(order: Any, score: Any, nodes: list[Node | None], live: Any) -> Any:
    """Reorder runs of equal score by the tree's depth-first pre-order (children in the
    order they were added), which is how the simulator's rescan breaks ties: it takes the
    first minimum of a list built depth first."""
    s = score[order]
    same = np.flatnonzero(s[1:] == s[:-1])
    if same.shape[0] == 0:
        return order
    out = order.copy()
    i = 0
    n = out.shape[0]
    while i < n - 1:
        j = i
        while j + 1 < n and s[j + 1] == s[i]:
            j += 1
        if j > i:
            run = out[i : j + 1].tolist()
            run.sort(key=lambda k: _preorder_key(nodes[int(live[k])]))
            out[i : j + 1] = run
        i = j + 1
    return out


def _preorder_key(nd: Node | None) -> tuple[int, ...]:
    """The node's position in a depth-first pre-order walk: its child indices from the root."""
    key: list[int] = []
    while nd is not None and nd.parent is not None:
        key.append(list(nd.parent.children.values()).index(nd))
        nd = nd.parent
    return tuple(reversed(key))


class _CandidateIndex:
    """Marconi's candidates in slots of parallel arrays (recency, efficiency, id), kept
    up to date by the cache's ``changed`` / ``gone`` calls, so a scoring pass is a few
    vectorised operations instead of a walk over the tree."""

    def __init__(self) -> None:
        self.r = np.zeros(64, dtype=np.float64)
        self.f = np.zeros(64, dtype=np.float64)
        self.ids = np.full(64, -1, dtype=np.int64)
        self.alive = np.zeros(64, dtype=bool)
        #: False for a locked candidate: scored (it moves the normalisation), not evicted
        self.evictable = np.zeros(64, dtype=bool)
        self.node: list[Node | None] = [None] * 64
        self.slot: dict[int, int] = {}
        self.free_slots: list[int] = []
        self.used = 0
        #: set when a candidate other than the current victim appears or changes
        self.dirty = False
        self.victim = -1

    def live(self) -> Any:
        return np.flatnonzero(self.alive[: self.used])

    def upsert(self, nd: Node, r: float, f: float, evictable: bool = True) -> None:
        k = self.slot.get(nd.id)
        if k is None:
            k = self.free_slots.pop() if self.free_slots else self._grow()
            self.slot[nd.id] = k
            self.node[k] = nd
            self.ids[k] = nd.id
            self.alive[k] = True
            self.dirty = True
        elif self.r[k] != r or self.f[k] != f or self.evictable[k] != evictable:
            self.dirty = True
        self.r[k] = r
        self.f[k] = f
        self.evictable[k] = evictable

    def drop(self, node_id: int) -> None:
        k = self.slot.pop(node_id, None)
        if k is None:
            return
        if node_id != self.victim:
            self.dirty = True
        self.alive[k] = False
        self.evictable[k] = False
        self.node[k] = None
        self.free_slots.append(k)

    def _grow(self) -> int:
        if self.used == self.r.shape[0]:
            n = 2 * self.used
            for name in ("r", "f", "ids", "alive", "evictable"):
                old = getattr(self, name)
                new = np.zeros(n, dtype=old.dtype)
                new[: self.used] = old
                setattr(self, name, new)
            self.node.extend([None] * (n - len(self.node)))
        self.used += 1
        return self.used - 1


def normalised_score(r: Any, f: Any, alpha: float) -> Any:
    """norm(r) + alpha * norm(f), each min-max normalised (a constant column scores 0)."""
    out = np.zeros(r.shape[0], dtype=np.float64)
    for col, w in ((r, 1.0), (f, alpha)):
        lo, hi = float(col.min()), float(col.max())
        if hi > lo and w:
            out += w * ((col - lo) / (hi - lo))
    return out


def _extreme_counts(r: Any, f: Any) -> dict[str, list[float]]:
    """For each bound, [value, how many candidates hold it]."""
    out = {}
    for name, col in (("r", r), ("f", f)):
        lo, hi = float(col.min()), float(col.max())
        out[name + "lo"] = [lo, float(np.count_nonzero(col == lo))]
        out[name + "hi"] = [hi, float(np.count_nonzero(col == hi))]
    return out


def _moves_bounds(ext: dict[str, list[float]], rv: float, fv: float) -> bool:
    """Remove a victim's values from the counts; True if a min or max has no holder left."""
    moved = False
    for name, v in (("r", rv), ("f", fv)):
        for side in ("lo", "hi"):
            entry = ext[name + side]
            if v == entry[0]:
                entry[1] -= 1
                if entry[1] <= 0:
                    moved = True
    return moved
