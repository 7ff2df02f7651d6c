"""Workload-aware eviction: ``wa-atc25`` ("KVCache Cache in the Wild", Wang et al., USENIX
ATC'25, arXiv 2506.02634) and ``wa``, the per-category LRU the UniCache paper compares with.

The paper observes that, within one request *category* (request type and turn), the time
to a block's next reuse is predictable and roughly exponential, and that head blocks of a
prompt are worth more than tail blocks. WA therefore:

1. fits, per category, on a profiling window, the probability ``p_c`` that a block touched
   by a request of the category is touched again, and an exponential reuse-time
   distribution (rate ``lambda_c = 1 / mean reuse time``, its maximum-likelihood estimate);
2. keeps one LRU queue per category (a block belongs to the category of the request that
   last stored or reused it) and, at eviction, scores only each queue's head by the
   probability that it is reused within the next ``window_s`` seconds::

       P = p_c * (exp(-lambda_c * age) - exp(-lambda_c * (age + window_s)))

   with ``age = t_now - t_last``. The lowest ``P`` goes; ties go to the later (tail)
   block. Within a queue, blocks released together leave tail first.

Our reading, where the paper's text was not available to check: a category is the task
label and the turn (``turn + 1``, turns from ``max_turn`` on merged); the profiling window
is the first ``profile`` share of the requests (the authors' demo profiles one hour and
serves the next), replayed like the rest; a reuse is the next request that touches the
key (looks it up or stores it) inside the window; categories with fewer than
``min_samples`` touches use the fit over all categories.

``wa`` is the baseline as the UniCache paper defines it: "A workload-aware cache eviction
policy that applies LRU within each workload" (Sec. 6.1; Sec. 1: it "classifies requests by
task category (e.g., multi-turn or single-turn) and applies LRU within each category
separately"). A category is the task label (``max_turn=1``; larger values split by turn as
above). The paper does not say how the categories share the capacity; ours: in proportion
to their reuses in the profiling window, the category most over its share evicting its least
recently used block.

Time: the engine runner's simulated clock; under the replay runner, the arrival time of the
request being processed.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.policies.base import I64, EntryView, EvictionPolicy, register
from prefixlab.workload.trace import BlockLayout

F64 = npt.NDArray[np.float64]


def categories(trace: Any, max_turn: int) -> tuple[list[str], I64]:
    """The category names and each request's category index (task label, and the turn
    unless ``max_turn`` is 1)."""
    names: dict[str, int] = {}
    out = np.zeros(len(trace), dtype=np.int64)
    for i, (task, turn) in enumerate(zip(trace.task, trace.turn.tolist(), strict=True)):
        t = int(turn) + 1
        label = task or "(none)"
        if max_turn > 1:
            label = f"{label}_{t if t < max_turn else f'{max_turn}+'}"
        out[i] = names.setdefault(label, len(names))
    return list(names), out


def fit_categories(
    layout: BlockLayout, arrival: F64, cat: I64, num_cats: int, upto: int, min_samples: int
) -> tuple[F64, F64, F64]:
    """Per category, on requests ``[0, upto)``: reuse probability, exponential rate, and the
    number of reuses. A touch of a key is a request storing or looking it up; its reuse is
    the next touch of the same key inside the window."""
    offs = layout.key_offsets
    reqs = np.repeat(np.arange(upto, dtype=np.int64), np.diff(offs[: upto + 1]))
    keys = layout.keys[: offs[upto]]
    order = np.lexsort((reqs, keys))
    k, r = keys[order], reqs[order]
    same = np.zeros(k.shape[0], dtype=bool)
    same[:-1] = k[1:] == k[:-1]
    nxt = np.roll(r, -1)
    touches = np.bincount(cat[r], minlength=num_cats).astype(np.float64)
    reused = np.bincount(cat[r[same]], minlength=num_cats).astype(np.float64)
    gaps = arrival[nxt[same]] - arrival[r[same]]
    gap_sum = np.bincount(cat[r[same]], weights=gaps, minlength=num_cats)
    all_p = reused.sum() / max(touches.sum(), 1.0)
    all_rate = reused.sum() / max(gap_sum.sum(), 1e-9) if reused.sum() else 1.0
    p = np.where(touches >= min_samples, reused / np.maximum(touches, 1.0), all_p)
    rate = np.where(
        (touches >= min_samples) & (reused > 0), reused / np.maximum(gap_sum, 1e-9), all_rate
    )
    return p.astype(np.float64), rate.astype(np.float64), reused


@register("wa-atc25")
class WorkloadAware(EvictionPolicy):
    """WA (ATC'25): per-category reuse probability and exponential reuse time; tail first."""

    structures: ClassVar[frozenset[str]] = frozenset({"block"})
    needs_trace: ClassVar[bool] = True
    needs_future: ClassVar[bool] = True  # the profiling window's block keys (its past only)
    #: "wa": ATC'25's reuse probability; "per-category-lru": the UniCache paper's WA
    mode: ClassVar[str] = "wa"

    def __init__(
        self,
        profile: float = 0.2,
        window_s: float = 60.0,
        max_turn: int = 4,
        min_samples: int = 50,
    ) -> None:
        if (
            isinstance(profile, bool)
            or not isinstance(profile, int | float)
            or not 0 < profile <= 1
        ):
            raise ValueError(f"profile must be in (0, 1], got {profile!r}")
        if (isinstance(window_s, bool) or not isinstance(window_s, int | float)
                or not math.isfinite(window_s) or window_s <= 0):  # fmt: skip
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        for name, v in (("max_turn", max_turn), ("min_samples", min_samples)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.profile = float(profile)
        self.window_s = float(window_s)
        self.max_turn = max_turn
        self.min_samples = min_samples
        self._layout: BlockLayout | None = None
        self._req_cat: I64 = np.zeros(0, dtype=np.int64)
        self.names: list[str] = []
        self.p: F64 = np.zeros(0)
        self.rate: F64 = np.zeros(0)
        self.share: F64 = np.zeros(0)

    def params(self) -> dict[str, Any]:
        return {"profile": self.profile, "window_s": self.window_s, "max_turn": self.max_turn,
                "min_samples": self.min_samples}  # fmt: skip

    # ------------------------------------------------------------------ set-up
    def bind(self, view: EntryView) -> None:
        super().bind(view)
        n = view.num_entries
        self.cat = np.full(n, -1, dtype=np.int64)
        self.t_last = np.zeros(n, dtype=np.float64)
        self._token = np.full(n, -1, dtype=np.int64)
        self._next = 0
        self._heaps: list[list[tuple[float, int, int]]] = []  # (t_last, token, entry)
        self._evictable = np.zeros(0, dtype=np.int64)
        self._held = np.zeros(0, dtype=np.float64)

    def prepare(self, future: BlockLayout) -> None:
        self._layout = future

    def prepare_trace(self, trace: Any, clock: str) -> None:
        if self._layout is None:
            raise ConfigError(
                f"policy '{self.name}' needs the block layout (run it through a runner)"
            )
        self.names, self._req_cat = categories(trace, self.max_turn)
        super().prepare_trace(trace, clock)
        upto = max(1, math.ceil(self.profile * len(trace)))
        nc = len(self.names)
        self.p, self.rate, reuses = fit_categories(self._layout, self._arrival, self._req_cat,
                                                   nc, upto, self.min_samples)  # fmt: skip
        total = float(reuses.sum())
        self.share = reuses / total if total > 0 else np.full(nc, 1.0 / max(nc, 1))
        self._heaps = [[] for _ in range(nc)]
        self._evictable = np.zeros(nc, dtype=np.int64)
        self._held = np.zeros(nc, dtype=np.float64)

    def reuse_probability(self, c: int, age: float) -> float:
        """P(reuse within the next ``window_s``) of a block of category ``c`` idle ``age``."""
        lam = float(self.rate[c])
        return float(self.p[c]) * (math.exp(-lam * age) - math.exp(-lam * (age + self.window_s)))

    # ------------------------------------------------------------------ hooks
    def _touch(self, entries: I64) -> None:
        if not self._req_cat.shape[0]:
            raise ConfigError(f"policy '{self.name}' needs the trace (run it through a runner)")
        c = int(self._req_cat[self.view.request_index])
        old = self.cat[entries]
        np.subtract.at(self._held, old[old >= 0], 1.0)
        self.cat[entries] = c
        self._held[c] += float(entries.shape[0])
        self.t_last[entries] = self.now()

    def on_insert(self, entries: I64) -> None:
        self._touch(entries)

    def on_access(self, entries: I64) -> None:
        free = self._unlist(entries)
        self._touch(entries)
        self._push(free)

    def on_evictable(self, entries: I64) -> None:
        self._push(entries)

    def on_pinned(self, entries: I64) -> None:
        self._unlist(entries)

    def on_remove(self, entries: I64) -> None:
        self._unlist(entries)
        c = self.cat[entries]
        np.subtract.at(self._held, c[c >= 0], 1.0)
        self.cat[entries] = -1

    def _unlist(self, entries: I64) -> I64:
        live = entries[self._token[entries] >= 0]
        np.subtract.at(self._evictable, self.cat[live], 1)
        self._token[entries] = -1
        return live

    def _push(self, entries: I64) -> None:
        # released together: tail (deepest) first
        order = np.argsort(-self.view.depth[entries], kind="stable")
        for e in entries[order].tolist():
            c = int(self.cat[e])
            tok = self._next
            self._next += 1
            self._token[e] = tok
            self._evictable[c] += 1
            heapq.heappush(self._heaps[c], (float(self.t_last[e]), tok, e))

    def _head(self, c: int) -> int:
        h = self._heaps[c]
        while h:
            _, tok, e = h[0]
            if self._token[e] == tok:
                return e
            heapq.heappop(h)
        return -1

    def evict(self, n: int) -> I64:
        now = self.now()
        out: list[int] = []
        while len(out) < n:
            best, best_key = -1, None
            total = max(float(self._held.sum()), 1.0)
            for c in range(len(self._heaps)):
                if self._evictable[c] <= 0:
                    continue
                e = self._head(c)
                if self.mode == "wa":
                    age = max(now - float(self.t_last[e]), 0.0)
                    key: tuple[float, ...] = (self.reuse_probability(c, age),
                                              -float(self.view.depth[e]), float(c))  # fmt: skip
                else:  # the category most over its share of the capacity
                    over = float(self._held[c]) / total - float(self.share[c])
                    key = (-over, float(self.t_last[e]), float(c))
                if best_key is None or key < best_key:
                    best, best_key = e, key
            if best < 0:
                break
            c = int(self.cat[best])
            heapq.heappop(self._heaps[c])
            self._token[best] = -1
            self._evictable[c] -= 1
            self._held[c] -= 1.0
            self.cat[best] = -1
            out.append(best)
        return np.array(out, dtype=np.int64)


@register("wa")
class PerCategoryLRU(WorkloadAware):
    """WA as the UniCache paper defines it (Sec. 6.1): LRU within each task category."""

    mode: ClassVar[str] = "per-category-lru"

    def __init__(self, profile: float = 0.2, max_turn: int = 1) -> None:
        super().__init__(profile=profile, max_turn=max_turn)

    def params(self) -> dict[str, Any]:
        return {"profile": self.profile, "max_turn": self.max_turn}
