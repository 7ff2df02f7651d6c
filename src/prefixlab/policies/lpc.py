"""LPC (learned prefix caching): evict the blocks of the conversations least likely to go on.

Each cached block carries a continuation probability ``p`` and a last-access time ``t``,
ranked by the probability decayed with idle time (the paper's Sec. 3.4.2)::

    p_cur = p d / (p d + 1 - p),   d = exp(-(t_now - t) * scale)   (scale 1e-2 / s)

(the odds of continuing shrink by ``d``). Which ``p`` and ``t`` a block carries (Sec.
3.4-3.5, read from ``../shared/papers/lpc-summary-zh.md``):

- a finished sequence's blocks enter the heap with *that request's* prediction and its
  time, so a conversation's latest turn replaces what its earlier turns predicted for the
  blocks it alone uses;
- a block shared by several conversations (a system prompt, a common first question) keeps
  each conversation's latest prediction and time and ranks by the largest of their decayed
  values (Sec. 3.5's max-pooling across conversations). The decay shrinks every
  conversation's odds by the same factor, so the largest stays the largest: it is the
  conversation with the largest ``logit(p) + scale * t``, found once per access.

Blocks enter a min-heap when they become evictable (their sequence finished); a hit pins
them, taking them out; every ``update_interval_s`` (10 s) every evictable block is
re-ranked with the current time, and in between the heap keeps the ranks it had.

``lpc:model=PATH`` uses a trained predictor (``prefixlab lpc train``); ``lpc-oracle`` uses
the true label (does the conversation continue after this request?) as ``p``. LPC's
predictor takes GPU memory the cache cannot use (1 GB in the paper's setup, "for a fair
comparison with LRU, LPC's available prefix-cache size is reduced by this 1 GB"):
``predictor_bytes`` (default 1 GiB for ``lpc``, 0 for the oracle) is deducted from the
capacity by the runners, which need the model (bytes per block) to do it.

Time: the engine runner's simulated clock; under the replay runner, the arrival time of the
request being processed.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.policies.base import I64, EntryView, PriorityPolicy, register

F64 = npt.NDArray[np.float64]


def decayed(p: Any, idle_s: Any, scale: float) -> Any:
    """LPC's decayed continuation probability (floats or arrays)."""
    pa = np.asarray(p, dtype=np.float64)
    d = np.exp(-np.asarray(idle_s, dtype=np.float64) * scale)
    pd = pa * d
    den = pd + 1.0 - pa
    out = np.divide(pd, den, out=np.zeros_like(pd), where=den > 0)
    # p = 1 is certainty: d / d = 1 however small d is (even once exp underflows to 0)
    return np.where(pa >= 1.0, 1.0, out)


def _rank(p: float, t: float, scale: float) -> float:
    """Order of a conversation's decayed probability at any later time: log-odds + scale t."""
    if p >= 1.0:
        return math.inf
    if p <= 0.0:
        return -math.inf
    return math.log(p / (1.0 - p)) + scale * t


class _LPCBase(PriorityPolicy):
    needs_trace: ClassVar[bool] = True

    def __init__(self, update_interval_s: float = 10.0, scale: float = 1e-2,
                 predictor_bytes: int = 0) -> None:  # fmt: skip
        if isinstance(predictor_bytes, bool) or not isinstance(predictor_bytes, int) or (
                predictor_bytes < 0):  # fmt: skip
            raise ValueError(f"predictor_bytes must be an integer >= 0, got {predictor_bytes!r}")
        self.predictor_bytes = predictor_bytes
        self.reserved_bytes = predictor_bytes
        for name, v in (("update_interval_s", update_interval_s), ("scale", scale)):
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or v < 0
                or not math.isfinite(v)
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        self.update_interval_s = float(update_interval_s)
        self.scale = float(scale)
        self._probs: F64 = np.zeros(0)
        self._conv: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._last_update = -math.inf

    def params(self) -> dict[str, Any]:
        return {"update_interval_s": self.update_interval_s, "scale": self.scale,
                "predictor_bytes": self.predictor_bytes}  # fmt: skip

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.p = np.zeros(view.num_entries, dtype=np.float64)
        self.t = np.zeros(view.num_entries, dtype=np.float64)
        #: the one conversation using an entry (-1: none), or -2 when it is shared
        self.owner = np.full(view.num_entries, -1, dtype=np.int64)
        #: shared entries: conversation -> its latest (p, t)
        self.shared: dict[int, dict[int, tuple[float, float]]] = {}

    def request_probabilities(self, trace: Any) -> F64:
        raise NotImplementedError

    def prepare_trace(self, trace: Any, clock: str) -> None:
        from prefixlab.learn.features import conversations

        self._probs = np.asarray(self.request_probabilities(trace), dtype=np.float64)
        if self._probs.shape[0] != len(trace):
            raise ConfigError(f"{self.name}: {self._probs.shape[0]} probabilities, "
                              f"{len(trace)} requests")  # fmt: skip
        keys = conversations(trace)[0]
        ids: dict[str, int] = {}
        self._conv = np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)
        super().prepare_trace(trace, clock)

    # ------------------------------------------------------------------ time
    def _prob(self) -> float:
        if not self._probs.shape[0]:
            raise ConfigError(f"policy '{self.name}' needs the trace (run it through a runner)")
        return float(self._probs[self.view.request_index])

    # ------------------------------------------------------------------ hooks
    def on_insert(self, entries: I64) -> None:
        self.p[entries] = self._prob()
        self.t[entries] = self.now()
        self.owner[entries] = self._conv[self.view.request_index]
        for e in entries.tolist():
            self.shared.pop(e, None)

    def on_access(self, entries: I64) -> None:
        q, now = self._prob(), self.now()
        c = int(self._conv[self.view.request_index])
        own = self.owner[entries] == c
        mine = entries[own]
        self.p[mine] = q  # the conversation's latest prediction replaces its earlier one
        self.t[mine] = now
        for e in entries[~own].tolist():  # another conversation's block: now shared
            convs = self.shared.get(e)
            if convs is None:
                convs = {int(self.owner[e]): (float(self.p[e]), float(self.t[e]))}
                self.shared[e] = convs
                self.owner[e] = -2
            convs[c] = (q, now)
            self.p[e], self.t[e] = max(convs.values(), key=self._key)
        super().on_access(entries)

    def _key(self, pt: tuple[float, float]) -> tuple[float, float]:
        """A conversation's (p, t) ranked by its decayed probability at any later time."""
        return _rank(pt[0], pt[1], self.scale), pt[1]

    def on_update(self, entries: I64) -> None:
        """Changed without an access (a duplicate dropped, ...): re-rank, credit nothing."""
        PriorityPolicy.on_access(self, entries)

    def on_split(self, upper: int, lower: int) -> None:
        """The new upper part inherits the lower part's conversations, probability and time
        (the request that split it is credited only if it reuses it: that is an access)."""
        self.p[upper] = self.p[lower]
        self.t[upper] = self.t[lower]
        self.owner[upper] = self.owner[lower]
        if lower in self.shared:
            self.shared[upper] = dict(self.shared[lower])

    def on_remove(self, entries: I64) -> None:
        super().on_remove(entries)
        self.p[entries] = 0.0
        self.t[entries] = 0.0
        self.owner[entries] = -1
        for e in entries.tolist():
            self.shared.pop(e, None)

    def priorities(self, entries: I64) -> list[Any]:
        cur = decayed(self.p[entries], self.now() - self.t[entries], self.scale)
        out: list[Any] = cur.tolist()
        return out

    def priority(self, e: int) -> Any:
        return float(decayed(self.p[e], self.now() - self.t[e], self.scale))

    def evict(self, n: int) -> I64:
        now = self.now()
        if now - self._last_update >= self.update_interval_s:
            self._last_update = now
            free = np.flatnonzero(self._free)
            self._heap = []
            self._push(free)  # new tokens: the old ranks are dropped
        return super().evict(n)


@register("lpc")
class LPC(_LPCBase):
    """LPC: evict the lowest decayed predicted continuation probability (needs model=)."""

    def __init__(self, model: str = "", update_interval_s: float = 10.0,
                 scale: float = 1e-2, predictor_bytes: int = 2**30) -> None:  # fmt: skip
        super().__init__(update_interval_s, scale, predictor_bytes)
        if not isinstance(model, str):
            raise ValueError(f"model must be a path, got {model!r}")
        self.model = model

    def params(self) -> dict[str, Any]:
        return {"model": self.model, **super().params()}

    def request_probabilities(self, trace: Any) -> F64:
        if not self.model:
            raise ConfigError("policy 'lpc' needs model=PATH (train one: prefixlab lpc train)")
        from prefixlab.learn.predictor import ContinuationPredictor

        return ContinuationPredictor.load(self.model).predict_trace(trace)


@register("lpc-oracle")
class LPCOracle(_LPCBase):
    """LPC with the true continuation label as the probability (its upper bound)."""

    def request_probabilities(self, trace: Any) -> F64:
        from prefixlab.learn.features import continuation_labels

        return continuation_labels(trace).astype(np.float64)
