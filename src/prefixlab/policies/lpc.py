"""LPC (learned prefix caching): evict the blocks of the conversations least likely to go on.

Each cached block carries a continuation probability ``p`` and a last-access time: the
probability the predictor gave the request that stored or last reused it, max-pooled when
several conversations share the block, and the latest access time among them. It is ranked
by the probability decayed with idle time::

    p_cur = p d / (p d + 1 - p),   d = exp(-(t_now - t_last) * scale)   (scale 1e-2 / s)

(the odds of continuing shrink by ``d``). Blocks enter a min-heap when they become
evictable (their sequence finished); a hit pins them, taking them out; every
``update_interval_s`` (10 s) every evictable block is re-ranked with the current time, and
in between the heap keeps the ranks it had (as in the paper).

``lpc:model=PATH`` uses a trained predictor (``prefixlab lpc train``); ``lpc-oracle`` uses
the true label (does the conversation continue after this request?) as ``p``.

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


class _LPCBase(PriorityPolicy):
    needs_trace: ClassVar[bool] = True

    def __init__(self, update_interval_s: float = 10.0, scale: float = 1e-2) -> None:
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
        self._last_update = -math.inf

    def params(self) -> dict[str, Any]:
        return {"update_interval_s": self.update_interval_s, "scale": self.scale}

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.p = np.zeros(view.num_entries, dtype=np.float64)
        self.t = np.zeros(view.num_entries, dtype=np.float64)

    def request_probabilities(self, trace: Any) -> F64:
        raise NotImplementedError

    def prepare_trace(self, trace: Any, clock: str) -> None:
        self._probs = np.asarray(self.request_probabilities(trace), dtype=np.float64)
        if self._probs.shape[0] != len(trace):
            raise ConfigError(f"{self.name}: {self._probs.shape[0]} probabilities, "
                              f"{len(trace)} requests")  # fmt: skip
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

    def on_access(self, entries: I64) -> None:
        # a shared block: the max over the conversations using it, the latest access
        self.p[entries] = np.maximum(self.p[entries], self._prob())
        self.t[entries] = np.maximum(self.t[entries], self.now())
        super().on_access(entries)

    def on_update(self, entries: I64) -> None:
        """Changed without an access (a duplicate dropped, ...): re-rank, credit nothing."""
        PriorityPolicy.on_access(self, entries)

    def on_split(self, upper: int, lower: int) -> None:
        """The new upper part inherits the lower part's probability and time (the request
        that split it is credited only if it reuses it: that is an access)."""
        self.p[upper] = self.p[lower]
        self.t[upper] = self.t[lower]

    def on_remove(self, entries: I64) -> None:
        super().on_remove(entries)
        self.p[entries] = 0.0
        self.t[entries] = 0.0

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
                 scale: float = 1e-2) -> None:  # fmt: skip
        super().__init__(update_interval_s, scale)
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
