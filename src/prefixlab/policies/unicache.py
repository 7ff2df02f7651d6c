"""UniCache: task-aware multi-queue eviction for heterogeneous LLM workloads.

The class; its hooks (jit functions over the array state, run by the class and by the
replay and engine kernels) and the state layout are in
:mod:`prefixlab.policies.hooks.unicache`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal, overload

import numpy as np

from prefixlab.policies._arrays import (
    ABASE,
    FROWS,
    FS,
    IROWS,
    NEG_ROWS,
    SC,
    State,
    new_state,
    widen,
)
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import register
from prefixlab.policies.hooks.unicache import (
    AGENTIC,
    AHEAP,
    ALPHA0,
    BETA,
    BTOK,
    CHAT,
    CODE,
    DCOUNT,
    EPS,
    EVERY,
    EVICT,
    GIVEN,
    HELD0,
    HITS0,
    HPOS,
    KP0,
    LHEAD,
    LTAIL,
    MAXOFF,
    MINGAPS,
    MODEL0,
    NENT,
    OFFSET,
    OFFSETS,
    PAPER,
    QUEUE,
    QUEUES,
    SEEN,
    SPAN,
    STAGE2,
    STRUCT,
    TEMP,
    TLAST,
    UCOPT,
    WEIGHTED,
    WINDOW,
    WPOS,
    local_rank,
    parse_tasks,
    queue_gap,
    uc_evict_opt,
    update_weights,
    weight_rows,
)
from prefixlab.types import F64, I64, Scalar
from prefixlab.workload.arrivals import GAP_PRESETS, lognormal_cdf, previous_turn_gaps
from prefixlab.workload.trace import Trace

__all__ = [
    "AGENTIC",
    "CHAT",
    "EVICT",
    "QUEUES",
    "STRUCT",
    "UniCache",
    "UniCacheOPT",
    "lognormal_cdf",
    "parse_tasks",
    "update_weights",
]


def _check_numbers(positive: dict[str, object], finite: dict[str, object], beta: object) -> None:
    """Raise ValueError unless each of ``positive`` is a finite number > 0, each of
    ``finite`` a finite number, and ``beta`` in [0, 1] (checked in that order)."""
    low = 0.0
    for name, v in positive.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
        if v <= low:
            raise ValueError(f"{name} must be > {low:g}, got {v!r}")
    for name, v in finite.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")


def _check_options(
    fit: object,
    min_gaps: object,
    update_every: object,
    stage2: object,
    offset: object,
    alg2: object,
    hits: object,
    tasks: object,
) -> None:
    """Raise ValueError unless ``fit``, ``min_gaps`` and ``update_every`` (integers >= 1),
    ``stage2``, ``offset``, ``alg2``, ``hits`` and ``tasks`` are valid (in that order)."""
    if fit not in ("online", "given"):
        raise ValueError(f"fit must be 'online' or 'given', got {fit!r}")
    for name, iv in (("min_gaps", min_gaps), ("update_every", update_every)):
        if isinstance(iv, bool) or not isinstance(iv, int) or iv < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {iv!r}")
    if not isinstance(stage2, bool):
        raise ValueError(f"stage2 must be true or false, got {stage2!r}")
    if offset not in OFFSETS:
        raise ValueError(f"offset must be one of {', '.join(OFFSETS)}, got {offset!r}")
    if alg2 not in ("paper", "clip-ehat"):
        raise ValueError(f"alg2 must be 'paper' or 'clip-ehat', got {alg2!r}")
    if hits not in ("window", "cumulative"):
        raise ValueError(f"hits must be 'window' or 'cumulative', got {hits!r}")
    if not isinstance(tasks, str):
        raise ValueError(f"tasks must be a string of TASK:QUEUE items, got {tasks!r}")


@register("unicache")
class UniCache(ArrayPolicy):
    """UniCache: evict-first, session-reuse and structural-reuse queues, hit-efficiency weights."""

    structures: ClassVar[frozenset[str]] = frozenset({"block"})
    needs_trace: ClassVar[bool] = True
    code = CODE

    def __init__(
        self,
        update_every: int = 10,
        temperature: float = 0.2,
        beta: float = 0.9,
        eps: float = 1e-3,
        fit: str = "online",
        min_gaps: int = 20,
        chat_mu: float = GAP_PRESETS["chat"][0],
        chat_sigma: float = GAP_PRESETS["chat"][1],
        agentic_mu: float = GAP_PRESETS["agentic"][0],
        agentic_sigma: float = GAP_PRESETS["agentic"][1],
        stage2: bool = True,
        tasks: str = "",
        offset: str = "global",
        alg2: str = "paper",
        hits: str = "window",
    ) -> None:
        _check_numbers(
            {
                "temperature": temperature,
                "eps": eps,
                "chat_sigma": chat_sigma,
                "agentic_sigma": agentic_sigma,
            },
            {"chat_mu": chat_mu, "agentic_mu": agentic_mu},
            beta,
        )
        _check_options(fit, min_gaps, update_every, stage2, offset, alg2, hits, tasks)
        self.update_every = update_every
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.eps = float(eps)
        self.fit = fit
        self.min_gaps = min_gaps
        self.chat_mu, self.chat_sigma = float(chat_mu), float(chat_sigma)
        self.agentic_mu, self.agentic_sigma = float(agentic_mu), float(agentic_sigma)
        self.stage2 = stage2
        self.tasks = tasks
        self.offset = offset
        self.alg2 = alg2
        self.hit_count = hits
        self._task_queue = parse_tasks(tasks)

    # ------------------------------------------------------------------ set-up
    #: int rows after the shared ones (unicache-opt adds its own)
    _int_rows: ClassVar[int] = DCOUNT + 1 - IROWS

    def init_state(self, num_entries: int) -> State:
        ist, fst = new_state(num_entries, 1, (0, 0), (self._int_rows, KP0 + 2 - FROWS))
        for row in (QUEUE, HPOS, LHEAD, LTAIL):
            ist[row] = -1
            ist[SC, NEG_ROWS] |= 1 << row
        ist[SC, MAXOFF] = 1  # the deepest structural block ever seen (offset=global)
        ist[SC, SEEN] = -1  # requests up to here have had their gap counted
        ist[SC, EVERY] = self.update_every
        ist[SC, MINGAPS] = self.min_gaps
        ist[SC, GIVEN] = self.fit == "given"
        ist[SC, STAGE2] = self.stage2
        ist[SC, OFFSET] = OFFSETS.index(self.offset)
        ist[SC, PAPER] = self.alg2 == "paper"
        ist[SC, WINDOW] = self.hit_count == "window"
        ist[SC, NENT] = num_entries
        ist[SC, BTOK] = max(int(self.view.size[0]), 1) if num_entries else 1
        fst[FS, ALPHA0 : ALPHA0 + 4] = 1.0
        fst[FS, TEMP], fst[FS, BETA], fst[FS, EPS] = self.temperature, self.beta, self.eps
        models = (self.chat_mu, self.chat_sigma, self.agentic_mu, self.agentic_sigma)
        fst[FS, MODEL0 : MODEL0 + 4] = models
        return ist, fst

    def _room(self, keys: I64) -> None:
        pass  # nothing is indexed by key

    def _deep(self, entries: I64) -> None:
        """Room for the structural blocks' counts per depth (offset=cached): under a runner a
        request holds all its blocks at once, so depths stay below the capacity; a driver
        may place blocks deeper."""
        d = int(self.view.depth[entries].max()) + 1 if entries.shape[0] else 0
        if d > self.state[0].shape[1]:
            self.state = widen(*self.state, 2 * d)

    def on_insert(self, entries: I64) -> None:
        self._deep(entries)
        super().on_insert(entries)

    def on_access(self, entries: I64) -> None:
        self._deep(entries)
        super().on_access(entries)

    def _stamp(self, n: int = 0) -> State:
        ist, fst = super()._stamp(n)
        ist[SC, BTOK] = max(int(self.view.size[0]), 1)  # the block cache's block tokens
        return ist, fst

    def prepare_trace(self, trace: Trace, clock: str) -> None:
        super().prepare_trace(trace, clock)
        gaps = previous_turn_gaps(trace.session_id, trace.arrival_s)
        self.aux = self._columns(trace, self._arrival, gaps)
        self._past_weights: list[tuple[int, list[float]]] = []

    def _columns(self, trace: Trace, arrival: F64, gaps: F64) -> F64:
        """The aux rows of ``trace``'s requests: arrival, queue, prompt tokens, gap, and
        the weights' rows (NaN until an update writes them)."""
        n = len(trace)
        queues = np.empty(n, dtype=np.float64)
        for i, (task, session) in enumerate(zip(trace.task, trace.session_id, strict=True)):
            q = self._task_queue.get(task) if task is not None else None
            # unlabelled: a request of a session is chat-like, else templated-like
            queues[i] = q if q is not None else (CHAT if session is not None else STRUCT)
        inputs = np.asarray(trace.input_length, dtype=np.float64)
        weights = np.full((len(WEIGHTED), n), np.nan)
        return np.concatenate([np.stack([arrival, queues, inputs, gaps]), weights])

    # a streamed replay: each chunk's rows, the gaps from each session's last arrival so
    # far (chunks come in order of arrival, so a session's previous turn is the last met)
    streams: ClassVar[str] = "columns"

    def chunk_columns(self, chunk: Trace, r0: int) -> F64:
        if r0 == 0:
            self._last_turn: dict[str, float] = {}
            self._past_weights = []
        arrival = np.asarray(chunk.arrival_s, dtype=np.float64)
        gaps = previous_turn_gaps(chunk.session_id, arrival, self._last_turn)
        return self._columns(chunk, arrival, gaps)

    def carried_from(self) -> int:
        return int(self.state[0][SC, SEEN]) + 1  # the gaps not learnt yet (_catch_up)

    def columns_done(self, cols: F64, base: int) -> None:
        if not hasattr(self, "_past_weights"):
            self._past_weights = []
        self._past_weights.extend(weight_rows(cols, base))

    # ------------------------------------------------------------------ inspection
    @overload
    def _entries(self, st: Literal[0], row: int) -> I64: ...
    @overload
    def _entries(self, st: Literal[1], row: int) -> F64: ...
    def _entries(self, st: Literal[0, 1], row: int) -> I64 | F64:
        return self.state[st][row, : self.view.num_entries]

    @property
    def queue(self) -> I64:
        """Each entry's queue (-1: none)."""
        return self._entries(0, QUEUE)

    @property
    def t_last(self) -> F64:
        return self._entries(1, TLAST)

    @property
    def span(self) -> F64:
        """Each entry's request's prompt length in blocks (offset=request)."""
        return self._entries(1, SPAN)

    def _per_queue(self, slot: int) -> F64:
        return self.state[1][FS, slot : slot + len(QUEUES)]

    # views into the state: writing them (tests set weights) changes the policy
    held = property(lambda self: self._per_queue(HELD0), doc="blocks held per queue")
    hits = property(lambda self: self._per_queue(HITS0), doc="hits per queue (the window's)")
    alpha = property(lambda self: self._per_queue(ALPHA0), doc="each queue's weight")

    @property
    def max_offset(self) -> int:
        """The deepest structural block ever seen."""
        return int(self.state[0][SC, MAXOFF])

    @property
    def weight_history(self) -> list[tuple[int, list[float]]]:
        """(request index, weights of chat, agentic, structural) after each update (a
        streamed replay's too: the updates of the chunks it is done with are kept)."""
        base = int(self.state[0][SC, ABASE]) if hasattr(self, "state") else 0
        return getattr(self, "_past_weights", []) + weight_rows(self.aux, base)

    def gap_params(self, q: int) -> tuple[float, float]:
        """(mu, sigma) of the queue's log-normal gap model now."""
        mu, sigma = queue_gap(*self.state, q)
        return float(mu), float(sigma)

    def local_priority(self, e: int, q: int, now: float) -> float:
        """``s`` of entry ``e`` in queue ``q`` (lower goes first)."""
        return float(local_rank(*self.state, self.view.depth, e, q, float(now)))

    def params(self) -> dict[str, Scalar]:
        return {
            name: getattr(self, name)
            for name in (
                "update_every",
                "temperature",
                "beta",
                "eps",
                "fit",
                "min_gaps",
                "chat_mu",
                "chat_sigma",
                "agentic_mu",
                "agentic_sigma",
                "stage2",
                "tasks",
                "offset",
                "alg2",
            )
        } | {"hits": self.hit_count}


@register("unicache-opt")
class UniCacheOPT(UniCache):
    """UniCache ranked first by the next use seen in the engine's waiting queue."""

    uses_lookahead: ClassVar[bool] = True
    requires_engine: ClassVar[bool] = True

    compiled_waiting: ClassVar[bool] = True
    _int_rows: ClassVar[int] = AHEAP + 1 - IROWS

    def init_state(self, num_entries: int) -> State:
        ist, fst = super().init_state(num_entries)
        ist[WPOS] = -1
        ist[SC, NEG_ROWS] |= 1 << WPOS
        ist[SC, UCOPT] = 1
        return ist, fst

    def _room(self, keys: I64) -> None:
        ArrayPolicy._room(self, keys)  # WPOS is indexed by key

    def evict(self, n: int) -> I64:
        ist, fst = self._stamp()
        out = np.empty(n, np.int64)
        k = uc_evict_opt(ist, fst, self.view.depth, self.view.key, out, n)
        return out[:k]
