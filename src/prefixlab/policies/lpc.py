"""LPC (learned prefix caching): evict the blocks of the conversations least likely to go on.

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.lpc`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.policies._arrays import FS, NEG_ROWS, SC, ChunkPasses, State, new_state
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.lpc import (
    AUX_CONV,
    AUX_PROB,
    BEST,
    CODE,
    FREE_HEAD,
    HEAD,
    HPOS,
    INTERVAL,
    LAST_UPDATE,
    OWNER,
    RCONV,
    RNEXT,
    RP,
    RT,
    SCALE,
    TABLE,
    TAIL,
    TSIZE,
    P,
    T,
)
from prefixlab.types import F64, I64, Scalar
from prefixlab.workload.trace import Trace


class _LPCBase(ArrayPolicy):
    needs_trace: ClassVar[bool] = True
    reads_access_metadata = True  # not for ranking: kept for inspection (hits per block)
    code = CODE

    def __init__(
        self, update_interval_s: float = 10.0, scale: float = 1e-2, predictor_bytes: int = 0
    ) -> None:
        if (
            isinstance(predictor_bytes, bool)
            or not isinstance(predictor_bytes, int)
            or (predictor_bytes < 0)
        ):
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

    def params(self) -> dict[str, Scalar]:
        return {
            "update_interval_s": self.update_interval_s,
            "scale": self.scale,
            "predictor_bytes": self.predictor_bytes,
        }

    def init_state(self, num_entries: int) -> State:
        ist, fst = new_state(num_entries, 1, (0, 0), (14, 5))
        for row in (OWNER, HEAD, TAIL, HPOS, BEST, TABLE):
            ist[row] = -1
            ist[SC, NEG_ROWS] |= 1 << row
        ist[SC, FREE_HEAD] = -1
        ist[SC, TSIZE] = ist.shape[1]
        fst[FS, SCALE] = self.scale
        fst[FS, INTERVAL] = self.update_interval_s
        fst[FS, LAST_UPDATE] = -math.inf
        return ist, fst

    def request_probabilities(self, trace: Trace) -> F64:
        raise NotImplementedError

    def prepare_trace(self, trace: Trace, clock: str) -> None:

        probs = np.asarray(self.request_probabilities(trace), dtype=np.float64)
        if probs.shape[0] != len(trace):
            raise ConfigError(f"{self.name}: {probs.shape[0]} probabilities, {len(trace)} requests")
        self._conv_ids, self._next_conv = {}, 0
        conv, _ = self._numbered(trace.session_id)
        super().prepare_trace(trace, clock)
        self.aux = np.stack([self._arrival, probs, conv])

    _conv_ids: dict[str, int]
    _next_conv: int

    def _numbered(self, sessions: Sequence[str | None]) -> tuple[F64, F64]:
        """Each request's conversation number, numbered in order of first appearance (those
        met before, a streamed trace's earlier chunks, kept in ``_conv_ids``), a request
        without a session its own; and 1.0 where a request has no session."""
        ids = self._conv_ids
        conv = np.empty(len(sessions), np.float64)
        alone = np.zeros(len(sessions), np.float64)
        for i, session in enumerate(sessions):
            if session is None:
                conv[i], alone[i] = self._next_conv, 1.0
                self._next_conv += 1
            else:
                c = ids.get(session)
                if c is None:
                    c = ids[session] = self._next_conv
                    self._next_conv += 1
                conv[i] = c
        return conv, alone

    # For inspection and tests: each entry's (p, t), its owner, the shared entries' records.
    @property
    def p(self) -> F64:
        return self.state[1][P, : self.view.num_entries]

    @property
    def t(self) -> F64:
        return self.state[1][T, : self.view.num_entries]

    @property
    def owner(self) -> I64:
        return self.state[0][OWNER, : self.view.num_entries]

    @property
    def shared(self) -> dict[int, dict[int, tuple[float, float]]]:
        """Shared entry -> conversation -> its latest (p, t)."""
        ist, fst = self.state
        out: dict[int, dict[int, tuple[float, float]]] = {}
        for e in np.flatnonzero(ist[OWNER] == -2).tolist():
            recs: dict[int, tuple[float, float]] = {}
            r = int(ist[HEAD, e])
            while r >= 0:
                recs[int(ist[RCONV, r])] = (float(fst[RP, r]), float(fst[RT, r]))
                r = int(ist[RNEXT, r])
            if recs:
                out[e] = recs
        return out


@register("lpc")
class LPC(_LPCBase):
    """LPC: evict the lowest decayed predicted continuation probability (needs model=)."""

    def __init__(
        self,
        model: str = "",
        update_interval_s: float = 10.0,
        scale: float = 1e-2,
        predictor_bytes: int = 2**30,
    ) -> None:
        super().__init__(update_interval_s, scale, predictor_bytes)
        if not isinstance(model, str):
            raise ValueError(f"model must be a path, got {model!r}")
        self.model = model

    def params(self) -> dict[str, Scalar]:
        return {"model": self.model, **super().params()}

    def request_probabilities(self, trace: Trace) -> F64:
        if not self.model:
            raise ConfigError("policy 'lpc' needs model=PATH (train one: prefixlab lpc train)")
        from prefixlab.learn.predictor import ContinuationPredictor

        return ContinuationPredictor.load(self.model).predict_trace(trace)


@register("lpc-oracle")
class LPCOracle(_LPCBase):
    """LPC with the true continuation label as the probability (its upper bound)."""

    def request_probabilities(self, trace: Trace) -> F64:
        from prefixlab.learn.features import continuation_labels

        return continuation_labels(trace).astype(np.float64)

    # a streamed replay: conversations numbered as the chunks are read (as prepare_trace
    # numbers them: in order of first appearance, a request without a session its own),
    # the labels in a backward pass (chunks come in order of arrival: a conversation goes
    # on when a later chunk's request has its number)
    streams: ClassVar[str] = "two-pass"

    def chunk_columns(self, chunk: Trace, r0: int) -> F64:
        if r0 == 0:
            self._conv_ids, self._next_conv = {}, 0
        conv, alone = self._numbered(chunk.session_id)  # alone: no later turn
        arrival = np.asarray(chunk.arrival_s, dtype=np.float64)
        return np.stack([arrival, alone, conv])  # the middle row becomes the label

    def stream_prepare(self, passes: ChunkPasses, num_requests: int) -> None:
        later: set[float] = set()  # conversations with a request further on
        for _r0, _layout, cols in passes(False):
            for i in range(cols.shape[1] - 1, -1, -1):
                alone, c = cols[AUX_PROB, i], cols[AUX_CONV, i]
                cols[AUX_PROB, i] = 0.0 if alone or c not in later else 1.0
                if not alone:
                    later.add(c)
        if hasattr(self, "_conv_ids"):  # not when the stream was empty
            self._conv_ids.clear()
