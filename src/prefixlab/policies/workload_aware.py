"""Workload-aware eviction: ``wa-atc25`` ("KVCache Cache in the Wild", Wang et al., USENIX
ATC'25, arXiv 2506.02634) and ``wa``, the per-category LRU the UniCache paper compares with.

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.workload_aware`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.policies._arrays import FS, NEG_ROWS, SC, ChunkPasses, State, new_state
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.workload_aware import (
    AUX_CAT,
    CAT,
    CODE,
    HEAD,
    MODE,
    NCATS,
    NEXT,
    PREV,
    PROB,
    RATE,
    SHARE,
    TAIL,
    TOKEN,
    WINDOW,
    CategoryFit,
    categories,
    reuse_chance,
)
from prefixlab.types import F64, I64, Scalar
from prefixlab.workload.trace import BlockLayout, Trace


@register("wa-atc25")
class WorkloadAware(ArrayPolicy):
    """WA (ATC'25): per-category reuse probability and exponential reuse time; tail first."""

    structures: ClassVar[frozenset[str]] = frozenset({"block"})
    needs_trace: ClassVar[bool] = True
    needs_future: ClassVar[bool] = True  # the profiling window's block keys (its past only)
    code = CODE
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
        if (
            isinstance(window_s, bool)
            or not isinstance(window_s, int | float)
            or not math.isfinite(window_s)
            or window_s <= 0
        ):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        for name, v in (("max_turn", max_turn), ("min_samples", min_samples)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.profile = float(profile)
        self.window_s = float(window_s)
        self.max_turn = max_turn
        self.min_samples = min_samples
        self._layout: BlockLayout | None = None
        self.names: list[str] = []
        self._fit: tuple[F64, F64, F64] = (np.zeros(0), np.zeros(0), np.zeros(0))

    def params(self) -> dict[str, Scalar]:
        return {
            "profile": self.profile,
            "window_s": self.window_s,
            "max_turn": self.max_turn,
            "min_samples": self.min_samples,
        }

    # ------------------------------------------------------------------ set-up
    def init_state(self, num_entries: int) -> State:
        nc = len(self.names)
        ist, fst = new_state(max(num_entries, nc), 1, (0, 0), (7, 5))
        for row in (CAT, TOKEN, PREV, NEXT, HEAD, TAIL):
            ist[row] = -1
            ist[SC, NEG_ROWS] |= 1 << row
        ist[SC, NCATS] = nc
        ist[SC, MODE] = 0 if self.mode == "wa" else 1
        fst[FS, WINDOW] = self.window_s
        p, rate, share = self._fit
        fst[PROB, :nc], fst[RATE, :nc], fst[SHARE, :nc] = p, rate, share
        return ist, fst

    def prepare(self, future: BlockLayout) -> None:
        self._layout = future

    def prepare_trace(self, trace: Trace, clock: str) -> None:
        if self._layout is None:
            raise ConfigError(
                f"policy '{self.name}' needs the block layout (run it through a runner)"
            )
        self.names, req_cat = categories(trace, self.max_turn)
        super().prepare_trace(trace, clock)
        fit = CategoryFit()
        fit.add(
            self._layout.keys,
            self._layout.key_offsets,
            self._arrival,
            req_cat,
            self._window(len(trace)),
        )
        self._fitted(fit)
        self.aux = np.stack([self._arrival, req_cat.astype(np.float64)])

    def _window(self, num_requests: int) -> int:
        """The profiling window's length in requests."""
        return max(1, math.ceil(self.profile * num_requests))

    def _fitted(self, fit: CategoryFit) -> None:
        nc = len(self.names)
        p, rate, reuses = fit.result(nc, self.min_samples)
        total = float(reuses.sum())
        share = reuses / total if total > 0 else np.full(nc, 1.0 / max(nc, 1))
        self._fit = (p, rate, share)
        if hasattr(self, "view"):  # bound before: the categories' rows start now
            self.state = self.init_state(self.view.num_entries)

    # a streamed replay: the categories as the chunks are read, the fit in a second pass
    streams: ClassVar[str] = "two-pass"

    def chunk_columns(self, chunk: Trace, r0: int) -> F64:
        if r0 == 0:
            self._met: dict[str, int] = {}
        self.names, cat = categories(chunk, self.max_turn, self._met)
        return np.stack([np.asarray(chunk.arrival_s, np.float64), cat.astype(np.float64)])

    def stream_prepare(self, passes: ChunkPasses, num_requests: int) -> None:
        upto = self._window(num_requests)
        fit = CategoryFit()
        for r0, layout, cols in passes(True):
            if r0 >= upto:
                break
            count = min(upto - r0, cols.shape[1])
            fit.add(
                layout.raw_keys.view(np.int64),
                layout.key_offsets,
                cols[0],
                cols[AUX_CAT].astype(np.int64),
                count,
            )
        self._fitted(fit)

    def on_evictable(self, entries: I64) -> None:
        # released together: tail (deepest) first
        super().on_evictable(entries[np.argsort(-self.view.depth[entries], kind="stable")])

    def reuse_probability(self, c: int, age: float) -> float:
        """P(reuse within the next ``window_s``) of a block of category ``c`` idle ``age``."""
        return float(reuse_chance(float(self.p[c]), float(self.rate[c]), age, self.window_s))

    # The fitted parameters per category: the state's once bound (tests may set them).
    def _param(self, i: int, row: int) -> F64:
        if hasattr(self, "state"):
            return self.state[1][row, : len(self._fit[i])]
        return self._fit[i]

    def _set_param(self, i: int, row: int, value: npt.ArrayLike) -> None:
        fit = list(self._fit)
        fit[i] = np.asarray(value, dtype=np.float64)
        self._fit = (fit[0], fit[1], fit[2])
        if hasattr(self, "state"):
            self.state[1][row, : fit[i].shape[0]] = fit[i]

    p = property(lambda self: self._param(0, PROB), lambda self, v: self._set_param(0, PROB, v))
    rate = property(lambda self: self._param(1, RATE), lambda self, v: self._set_param(1, RATE, v))
    share = property(
        lambda self: self._param(2, SHARE), lambda self, v: self._set_param(2, SHARE, v)
    )


@register("wa")
class PerCategoryLRU(WorkloadAware):
    """WA as the UniCache paper defines it (Sec. 6.1): LRU within each task category."""

    mode: ClassVar[str] = "per-category-lru"

    def __init__(self, profile: float = 0.2, max_turn: int = 1) -> None:
        super().__init__(profile=profile, max_turn=max_turn)

    def params(self) -> dict[str, Scalar]:
        return {"profile": self.profile, "max_turn": self.max_turn}
