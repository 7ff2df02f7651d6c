"""Policies of the hybrid (KV + SSM state) cache: Marconi and its baselines as named systems.

========== ============= ===================================== ==========================
name       admission     eviction                              recency on a hit
========== ============= ===================================== ==========================
vanilla    none          -                                     -
vllm+      all-blocks    LRU over leaves                       whole matched path
sglang+    judicious     LRU over leaves                       whole matched path
marconi    judicious     recency + alpha x FLOP efficiency     only the node reused
========== ============= ===================================== ==========================

Marconi's score of a candidate is ``norm(last_access) + alpha * norm(flop_efficiency)``,
both min-max normalised over the current candidates; the lowest is evicted, one at a time,
until the new request fits. FLOP efficiency = FLOPs the node saves over its parent / bytes
it holds (:meth:`ModelSpec.flop_efficiency`'s definition, with the node's actual bytes).

**Exact with less work.** The official simulator rescans every candidate for every victim
(O(n) per victim, in Python). Here the candidates are scored once, vectorised, and evicted
in score order; the order is recomputed only when it can change: when a candidate appears
(a parent becomes a leaf) or changes (a merge lengthens a child's edge), or when the victim
was the last candidate holding a min or max of recency or efficiency (the normalisation
moves). Otherwise removing a candidate leaves every other score unchanged, so the next in
order is exactly what a rescan would pick. Ties: lowest score, then oldest, then smallest
node id, in both (tested against a rescanning reference).

On a model without SSM layers (a Transformer) there is no state to weigh against its KV,
and admission stores the same tokens either way: ``marconi`` then behaves exactly as
``sglang+`` (LRU over leaves, path refresh), so the comparison isolates what hybrid models
gain.

``marconi`` without ``alpha`` tunes it (see :mod:`prefixlab.runner.hybrid`): alpha = 0
until the first eviction, then after a bootstrap window of ``bootstrap_multiplier`` x the
requests seen so far, the window is replayed for each alpha of the grid and the best by
``objective`` (``hit_ratio``, the paper; ``flops_saved``, the official code) is kept; ties go
to the smallest alpha.
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


class HybridPolicy(EvictionPolicy):
    """Admission (which checkpoints exist) and eviction for :class:`HybridCache`."""

    structures: ClassVar[frozenset[str]] = frozenset({"hybrid"})
    admission: ClassVar[str] = "judicious"
    #: on a hit, refresh the whole matched path (SGLang) or only the node reused (Marconi)
    touch_path: ClassVar[bool] = True
    block_tokens: int = 32
    chunk_tokens: int = 0
    #: the runner tunes alpha (marconi without a fixed alpha)
    tunes: bool = False

    cache: HybridCache

    def bind_cache(self, cache: HybridCache) -> None:
        self.cache = cache

    def hit(self, m: HybridMatch) -> None:
        if self.touch_path:
            _touch_path(self.cache.now, m)
        elif m.reuse_node is not None:
            m.reuse_node.last_access = self.cache.now

    def inserted(self, path: list[Node]) -> None:
        """After an insertion: ``path`` is every node of the stored sequence."""
        now = self.cache.now
        if self.touch_path:
            for nd in path:
                nd.last_access = now
        elif path:
            path[-1].last_access = now  # the node holding the sequence's final state

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


def _touch_path(now: float, m: HybridMatch) -> None:
    for nd in m.path:
        nd.last_access = now
    if m.partial is not None and m.reuse_node is m.partial:
        m.partial.last_access = now


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
    """vLLM+ (Marconi's baseline): a state checkpoint every block, LRU eviction."""

    admission: ClassVar[str] = "all-blocks"

    def __init__(self, block_tokens: int = 32) -> None:
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
        self.block_tokens = block_tokens


@register("sglang+")
class SglangPlus(_LRULeaves):
    """SGLang+ (Marconi's baseline): judicious admission, LRU over leaves."""

    def __init__(self, chunk_tokens: int = 0) -> None:
        self.chunk_tokens = _chunk(chunk_tokens)


def _chunk(chunk_tokens: Any) -> int:
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be an integer >= 0, got {chunk_tokens!r}")
    return int(chunk_tokens)


@register("marconi")
class Marconi(HybridPolicy):
    """Marconi: judicious admission, FLOP-aware eviction (recency + alpha x efficiency)."""

    touch_path: ClassVar[bool] = False

    def __init__(
        self,
        alpha: float | None = None,
        bootstrap_multiplier: float = 5.0,
        alpha_max: float = 2.0,
        alpha_step: float = 0.1,
        objective: str = "hit_ratio",
        retune_every: int = 0,
        chunk_tokens: int = 0,
        tune_jobs: int = 1,
    ) -> None:
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)
                                  or alpha < 0):  # fmt: skip
            raise ValueError(f"alpha must be a number >= 0, got {alpha!r}")
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        for name, v in (("bootstrap_multiplier", bootstrap_multiplier), ("alpha_max", alpha_max),
                        ("alpha_step", alpha_step)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name, iv in (("retune_every", retune_every), ("tune_jobs", tune_jobs)):
            if isinstance(iv, bool) or not isinstance(iv, int) or iv < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {iv!r}")
        self.alpha = None if alpha is None else float(alpha)
        self.bootstrap_multiplier = float(bootstrap_multiplier)
        self.alpha_max = float(alpha_max)
        self.alpha_step = float(alpha_step)
        self.objective = objective
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
                "objective": self.objective, "retune_every": self.retune_every,
                "chunk_tokens": self.chunk_tokens, "tune_jobs": self.tune_jobs}  # fmt: skip

    def spec(self) -> str:
        if self.alpha is not None:
            return f"marconi:alpha={self.alpha:g}"
        return "marconi"

    def alpha_grid(self) -> list[float]:
        """0, step, 2 step, ..., alpha_max (rounded to the step's decimals)."""
        n = round(self.alpha_max / self.alpha_step)
        return [round(i * self.alpha_step, 10) for i in range(n + 1)]

    # ------------------------------------------------------------------ scoring
    def efficiency(self, nd: Node) -> float:
        """FLOPs the node saves over its parent per byte it holds (memoised per shape)."""
        key = (nd.start, nd.end, nd.ckpt)
        hit = self._eff.get(nd.id)
        if hit is not None and hit[:3] == key:
            return hit[3]
        model = self.cache.model
        saved = model.total_prefill_flops(nd.end) - model.total_prefill_flops(nd.start)
        held = self.cache.node_bytes(nd)
        eff = saved / held if held else 0.0  # holds nothing (a state-less model's empty leaf)
        self._eff[nd.id] = (*key, eff)
        return eff

    def scores(self, cands: list[Node]) -> tuple[Any, Any, Any]:
        """(score, recency, efficiency) arrays of the candidates."""
        r = np.array([nd.last_access for nd in cands], dtype=np.float64)
        f = np.array([self.efficiency(nd) for nd in cands], dtype=np.float64)
        return normalised_score(r, f, self.current_alpha), r, f

    def hit(self, m: HybridMatch) -> None:
        if self.cache.has_state:
            super().hit(m)
            if m.reuse_node is not None:
                self.changed(m.reuse_node)
        else:  # no states to weigh: SGLang+'s recency (see free)
            _touch_path(self.cache.now, m)

    def inserted(self, path: list[Node]) -> None:
        if self.cache.has_state:
            super().inserted(path)
            if path:
                self.changed(path[-1])
        else:
            for nd in path:
                nd.last_access = self.cache.now

    def changed(self, nd: Node) -> None:
        if self.cache.has_state and self.cache.is_candidate(nd):
            self._index.upsert(nd, nd.last_access, self.efficiency(nd))
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
            if live.shape[0] == 0:
                break
            r, f, ids = ix.r[live], ix.f[live], ix.ids[live]
            score = normalised_score(r, f, self.current_alpha)
            self.num_passes += 1
            self.num_scored += int(live.shape[0])
            order = np.lexsort((ids, r, score))
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


class _CandidateIndex:
    """Marconi's candidates in slots of parallel arrays (recency, efficiency, id), kept
    up to date by the cache's ``changed`` / ``gone`` calls, so a scoring pass is a few
    vectorised operations instead of a walk over the tree."""

    def __init__(self) -> None:
        self.r = np.zeros(64, dtype=np.float64)
        self.f = np.zeros(64, dtype=np.float64)
        self.ids = np.full(64, -1, dtype=np.int64)
        self.alive = np.zeros(64, dtype=bool)
        self.node: list[Node | None] = [None] * 64
        self.slot: dict[int, int] = {}
        self.free_slots: list[int] = []
        self.used = 0
        #: set when a candidate other than the current victim appears or changes
        self.dirty = False
        self.victim = -1

    def live(self) -> Any:
        return np.flatnonzero(self.alive[: self.used])

    def upsert(self, nd: Node, r: float, f: float) -> None:
        k = self.slot.get(nd.id)
        if k is None:
            k = self.free_slots.pop() if self.free_slots else self._grow()
            self.slot[nd.id] = k
            self.node[k] = nd
            self.ids[k] = nd.id
            self.alive[k] = True
            self.dirty = True
        elif self.r[k] != r or self.f[k] != f:
            self.dirty = True
        self.r[k] = r
        self.f[k] = f

    def drop(self, node_id: int) -> None:
        k = self.slot.pop(node_id, None)
        if k is None:
            return
        if node_id != self.victim:
            self.dirty = True
        self.alive[k] = False
        self.node[k] = None
        self.free_slots.append(k)

    def _grow(self) -> int:
        if self.used == self.r.shape[0]:
            n = 2 * self.used
            for name in ("r", "f", "ids", "alive"):
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
