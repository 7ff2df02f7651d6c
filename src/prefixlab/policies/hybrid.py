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

**One rule, two trees.** Every victim is chosen by a rescan of every candidate, as in the
simulator. The score is :func:`marconi_scores` over the candidates' last accesses and
:func:`node_efficiency` values, compiled: the object tree keeps its candidates' columns in
arrays (``_CandidateIndex``, updated by the cache's ``changed`` / ``gone`` calls) and the
compiled replay (:mod:`prefixlab.runner._fast_hybrid`) gathers them from its node arrays;
both call the same two functions, and LRU's baselines order leaves by the same
:func:`lru_leaf_key`.

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
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from prefixlab._jit import jit
from prefixlab.policies.admission import BRANCHES, Admission, AllBlocks, Judicious, NoAdmission
from prefixlab.policies.base import Policy, register
from prefixlab.types import B1, F64, I64, Scalar

if TYPE_CHECKING:
    from prefixlab.cache.hybrid import HybridCache, HybridMatch, Node

OBJECTIVES = ("hit_ratio", "flops_saved")
#: integer parameters stay below this (the compiled tree keeps them in int64)
MAX_INT = 2**62


RECENCIES = ("inverse-age", "last-access")  # codes 0, 1 in the compiled functions
EFFICIENCIES = ("prefix", "node")  # codes 0, 1
SIZINGS = ("exact", "estimate")


class HybridPolicy(Policy):
    """Admission (which checkpoints exist) and eviction for :class:`HybridCache`."""

    structures: ClassVar[frozenset[str]] = frozenset({"hybrid"})
    #: which checkpoints a new sequence leaves (:mod:`prefixlab.policies.admission`)
    admission: Admission = Judicious()
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


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


@register("vanilla")
class Vanilla(HybridPolicy):
    """No prefix caching: every prompt is prefilled in full (the baseline of baselines)."""

    admission: Admission = NoAdmission()

    def free(self, need: int) -> int:
        return 0


def lru_leaf_key(nd: Node) -> tuple[float, int, int]:
    """LRU's order of leaves: least recently used first, ties to the deeper leaf, then the
    smaller id (the compiled replay's heap orders its rows by the same three columns)."""
    return nd.last_access, -nd.end, nd.id


def _lru_leaves(cache: HybridCache, need: int) -> int:
    """Evict least recently used unlocked leaves until ``need`` bytes are freed (the order
    of :func:`lru_leaf_key`, each key taken when the leaf is pushed: a lazy heap)."""
    heap = [(*lru_leaf_key(nd), nd) for nd in cache.iter_nodes() if not nd.children and not nd.lock]
    heapq.heapify(heap)
    freed = 0
    while freed < need and heap:
        _, _, nid, nd = heapq.heappop(heap)
        if cache.nodes.get(nid) is not nd or nd.children or nd.lock:
            continue
        freed += cache.freed_by(nd)
        for ch in cache.remove(nd):
            if not ch.children and not ch.lock and ch is not cache.root:
                heapq.heappush(heap, (*lru_leaf_key(ch), ch))
    return freed


class _LRULeaves(HybridPolicy):
    """LRU over leaves, whole-path refresh (SGLang's radix cache)."""

    def free(self, need: int) -> int:
        return _lru_leaves(self.cache, need)


@register("vllm+")
class VllmPlus(_LRULeaves):
    """vLLM+ (Marconi's baseline, Sec. 5.1): a state checkpoint every block, LRU eviction."""

    admission: Admission = AllBlocks()

    def __init__(
        self, block_tokens: int = 32, partial_blocks: bool = True, sizing: str = "exact"
    ) -> None:
        if (
            isinstance(block_tokens, bool)
            or not isinstance(block_tokens, int)
            or not 1 <= block_tokens <= MAX_INT
        ):
            raise ValueError(
                f"block_tokens must be an integer from 1 to 2**62, got {block_tokens!r}"
            )
        if not isinstance(partial_blocks, bool):
            raise ValueError(f"partial_blocks must be true or false, got {partial_blocks!r}")
        self.block_tokens = block_tokens
        self.partial_blocks = partial_blocks
        self.sizing = _choice("sizing", sizing, SIZINGS)
        self.admission = AllBlocks(block_tokens, partial_blocks)

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
        self.admission = Judicious(self.chunk_tokens, self.branch)


def _chunk(chunk_tokens: object) -> int:
    if (
        isinstance(chunk_tokens, bool)
        or not isinstance(chunk_tokens, int)
        or not 0 <= chunk_tokens <= MAX_INT
    ):
        raise ValueError(f"chunk_tokens must be an integer from 0 to 2**62, got {chunk_tokens!r}")
    return int(chunk_tokens)


def _check_marconi_numbers(
    alpha: object, positive: dict[str, object], counts: dict[str, object]
) -> None:
    """Raise ValueError unless ``alpha`` is None or a finite number >= 0, each of
    ``positive`` a positive finite number, and each of ``counts`` an integer from 0 to
    2**62 (checked in that order)."""
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha < math.inf
    ):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    for name, v in positive.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    for name, iv in counts.items():
        if isinstance(iv, bool) or not isinstance(iv, int) or not 0 <= iv <= MAX_INT:
            raise ValueError(f"{name} must be an integer from 0 to 2**62, got {iv!r}")


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
        _check_marconi_numbers(
            alpha,
            {
                "bootstrap_multiplier": bootstrap_multiplier,
                "alpha_max": alpha_max,
                "alpha_step": alpha_step,
            },
            {"retune_every": retune_every, "tune_jobs": tune_jobs, "score_window": score_window},
        )
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
        self.admission = Judicious(self.chunk_tokens, self.branch)
        self.tune_jobs = max(1, tune_jobs)
        self._init_state()

    def _init_state(self) -> None:
        """The derived state of a new instance: whether it tunes, the alpha in use, the
        FLOPs table, the counters and the candidate index."""
        self.tunes = self.alpha is None
        #: the alpha in use (tuned: 0 until the first tuning)
        self.current_alpha = 0.0 if self.alpha is None else self.alpha
        #: prefill FLOPs by token count (ModelSpec.prefill_flops_table), grown on demand
        self._tot = np.zeros(1, dtype=np.float64)
        #: victims, and candidate scores computed in all (every candidate per victim)
        self.num_victims = 0
        self.num_scored = 0
        self._index = _CandidateIndex()

    def bind_cache(self, cache: HybridCache) -> None:
        """A new cache: a fresh candidate index, and alpha as constructed (a tuned instance
        starts again from 0)."""
        super().bind_cache(cache)
        self._index = _CandidateIndex()
        self.current_alpha = 0.0 if self.alpha is None else self.alpha

    def params(self) -> dict[str, Scalar]:
        return {
            "alpha": self.alpha,
            "bootstrap_multiplier": self.bootstrap_multiplier,
            "alpha_max": self.alpha_max,
            "alpha_step": self.alpha_step,
            "objective": self.objective,
            "score_window": self.score_window,
            "recency": self.recency,
            "efficiency": self.efficiency_of,
            "branch": self.branch,
            "retune_every": self.retune_every,
            "chunk_tokens": self.chunk_tokens,
            "tune_jobs": self.tune_jobs,
        }

    def with_alpha(self, alpha: float) -> Marconi:
        """The same policy with ``alpha`` fixed (what the tuner replays)."""
        # every other parameter as params() gives it (a parameter added later follows)
        kwargs: dict[str, Any] = {**self.params(), "alpha": alpha}  # Any: mixed types
        return Marconi(**kwargs)

    def alpha_grid(self) -> list[float]:
        """0, step, 2 step, ..., alpha_max (rounded to the step's decimals)."""
        n = round(self.alpha_max / self.alpha_step)
        return [round(i * self.alpha_step, 10) for i in range(n + 1)]

    # ------------------------------------------------------------------ scoring
    def efficiency(self, nd: Node) -> float:
        """FLOPs the node saves over its parent per byte (:func:`node_efficiency`, the
        function the compiled replay calls)."""
        cache = self.cache
        if nd.end >= self._tot.shape[0]:
            self._tot = cache.model.prefill_flops_table(max(nd.end, 2 * self._tot.shape[0]))
        mode = EFFICIENCIES.index(self.efficiency_of)
        eff = node_efficiency(self._tot, nd.start, nd.end, nd.ckpt, cache.kv, cache.state, mode)
        return float(eff)

    def scores(self, cands: list[Node]) -> tuple[F64, int]:
        """(score array, index of the least score among the unlocked ones or -1) of the
        candidates, now (:func:`marconi_scores`)."""
        r = np.array([nd.last_access for nd in cands], dtype=np.float64)
        f = np.array([self.efficiency(nd) for nd in cands], dtype=np.float64)
        ok = np.array([nd.lock == 0 for nd in cands], dtype=np.bool_)
        score = np.empty(len(cands), dtype=np.float64)
        least = marconi_scores(
            r,
            f,
            ok,
            float(self.cache.clock),
            self.current_alpha,
            RECENCIES.index(self.recency),
            score,
        )
        return score, int(least)

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

    def free(self, need: int) -> int:
        cache = self.cache
        if not cache.has_state:
            # A Transformer has no recurrent states: admission stores the same KV either
            # way and no node trades a state's bytes against its FLOPs, so Marconi is
            # SGLang+ there (the paper's gains are those of hybrid models).
            return _lru_leaves(cache, need)
        ix = self._index
        rec = RECENCIES.index(self.recency)
        freed = 0
        while freed < need:
            live = ix.live()
            score = np.empty(live.shape[0], dtype=np.float64)
            ok = ix.evictable[live]
            least = int(
                marconi_scores(
                    ix.r[live], ix.f[live], ok, float(cache.clock), self.current_alpha, rec, score
                )
            )
            self.num_scored += int(live.shape[0])
            if least < 0:
                break
            tied = live[ok & (score == score[least])].tolist()
            v = min((ix.node[k] for k in tied), key=_preorder_key)
            assert v is not None
            self.num_victims += 1
            freed += cache.freed_by(v)
            cache.remove(v)
        return freed


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

    def live(self) -> I64:
        return np.flatnonzero(self.alive[: self.used])

    def upsert(self, nd: Node, r: float, f: float, evictable: bool = True) -> None:
        k = self.slot.get(nd.id)
        if k is None:
            k = self.free_slots.pop() if self.free_slots else self._grow()
            self.slot[nd.id] = k
            self.node[k] = nd
            self.ids[k] = nd.id
            self.alive[k] = True
        self.r[k] = r
        self.f[k] = f
        self.evictable[k] = evictable

    def drop(self, node_id: int) -> None:
        k = self.slot.pop(node_id, None)
        if k is None:
            return
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


@jit(nrt=False)
def node_efficiency(
    tot: F64, start: int, end: int, ckpt: bool, kv: int, state: int, mode: int
) -> float:
    """FLOPs a node saves over its parent per byte. ``tot[n]``: the prefill FLOPs of n
    tokens (:meth:`ModelSpec.prefill_flops_table`). ``mode`` 0 (``prefix``, Marconi's
    simulator) divides by one checkpoint plus the KV of the node's *whole prefix*; 1
    (``node``) by the bytes the node itself holds (its edge's KV and its checkpoint), as
    ``ModelSpec.flop_efficiency`` does. A node that holds nothing (a state-less model's
    empty leaf) scores 0."""
    saved = tot[end] - tot[start]
    held = (end if mode == 0 else end - start) * kv + (state if ckpt else 0)
    return saved / held if held else 0.0


@jit(nrt=False)
def marconi_scores(
    r: F64, f: F64, ok: B1, clock: float, alpha: float, recency: int, score: F64
) -> int:
    """Marconi's score of each candidate into ``score``: ``norm(recency) + alpha x
    norm(efficiency)``, each min-max normalised over all the candidates (a constant column
    adds 0); the index of the least score among those with ``ok`` (the first of equal
    ones), or -1 when none is.

    ``r``: last access times; ``recency`` 0 (``inverse-age``, the simulator's) takes
    ``1 / (clock - r)`` (an eviction call ticks first, so the age is at least 1), 1
    (``last-access``) the raw time. ``f``: efficiencies (:func:`node_efficiency`)."""
    n = r.shape[0]
    if n == 0:
        return -1
    rlo, rhi = math.inf, -math.inf
    flo, fhi = math.inf, -math.inf
    for i in range(n):
        x = r[i]
        if recency == 0:
            age = clock - x
            x = 1.0 / age if age > 0 else math.inf
        score[i] = x
        rlo, rhi = min(rlo, x), max(rhi, x)
        flo, fhi = min(flo, f[i]), max(fhi, f[i])
    least = -1
    for i in range(n):
        s = 0.0
        if rhi > rlo:
            s = s + 1.0 * ((score[i] - rlo) / (rhi - rlo))
        if fhi > flo and alpha:
            s = s + alpha * ((f[i] - flo) / (fhi - flo))
        score[i] = s
        if ok[i] and (least < 0 or s < score[least]):
            least = i
    return least
