"""UniCache: task-aware multi-queue eviction for heterogeneous LLM workloads.

Every cached block belongs to one of four queues, chosen from the task label of the request
that last stored or reused it (``tasks`` maps labels to queues) and from its phase:

- ``evict`` (evict-first): the prefill blocks of untemplated single-turn tasks and every
  decode block of a single-turn task. Nothing reuses them, so they are drained first,
  largest offset (block position) first.
- ``chat`` and ``agentic`` (session reuse): the blocks of multi-turn sessions. Local
  priority ``s = 1 - CDF_q(t_now - t_last)``: the probability that the session's next turn
  is still to come, with a per-queue log-normal CDF of inter-turn gaps. Its parameters are
  given (``chat_mu``...) or fitted online (``fit=online``, the default) from the gaps of
  the requests seen so far (maximum likelihood on log gaps; the presets until
  ``min_gaps`` gaps are in).
- ``structural`` (structural reuse): templated single-turn tasks, whose shared templates sit
  at the head of the prompt. ``s = 1 - offset / max_offset``: deeper blocks go first. The
  paper's ``max_offset`` is "the maximum offset among all blocks" (Sec. 5.2); ``offset``
  picks the reading: the deepest structural block ever seen (``global``, the default), the
  deepest cached now (``cached``), or the block's own prompt (``request``, not the paper's).
  The score has no time term, in the paper as here.

Stage 2 (global choice): among each queue's lowest-``s`` candidate, evict the one with the
lowest ``G_q = alpha_q * s_q`` (Algorithm 1). The weights follow the hit efficiency of each
queue, updated every ``update_every`` requests by Algorithm 2 (:func:`update_weights`):
``E_q = H_q / (C_q + eps)``, with ``H_q`` the hits on the queue's blocks since the last
update and ``C_q`` the share of the capacity it holds; ``E^_q = (E_q / (mean(E) + eps)) ^
(1 / T)``; ``alpha_q <- clamp(beta alpha_q + (1 - beta) E^_q, L, U)`` with ``[L, U] =
[max(0.001, mu - 2 sigma), min(10, mu + 2 sigma)]`` of the ``E^`` (``alg2=paper``, the
printed order; ``alg2=clip-ehat`` clips ``E^`` before the EMA, this project's earlier
reading). ``H_q`` counts the hits since the last update (``hits=window``: Sec. 5.3's "over a
recent time window") or since the start (``hits=cumulative``: Algorithm 2's "cumulative
hit-token counts"). Queues that hold nothing keep their weight. The paper gives no value for ``T``,
``beta``, ``eps`` or the update period: ``T = 0.2``, ``beta = 0.9`` and every 10 requests
are this project's choice, reported to follow the authors' code (which we could not
reach). The log-normal presets are the paper's fits (Sec. 6.1: chat 4.15 / 0.971, agentic
1.81 / 1.092; ``prefixlab.workload.arrivals.GAP_PRESETS``); the paper fits them offline
on history, which is ``fit=given``.

``stage2=false`` is the ablation: each queue evicts independently, the victims shared among
the queues in proportion to the evictable blocks each holds.

``unicache-opt`` ranks first by the next use seen in the engine's waiting queue: a block
that a waiting request will look up is kept while any other can go, and among those the
one needed last goes first; the rest are ranked by UniCache.

Time: the engine runner's simulated clock; under the replay runner, the arrival time of the
request being processed. The block cache only (offsets are block positions).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.policies.base import I64, EntryView, EvictionPolicy, register
from prefixlab.policies.opt_online import waiting_positions
from prefixlab.workload.arrivals import GAP_PRESETS, lognormal_cdf, previous_turn_gaps

F64 = npt.NDArray[np.float64]

QUEUES = ("evict", "chat", "agentic", "structural")
#: the structural score's ``max_offset``: the deepest structural block ever seen, the deepest
#: cached now, or (not the paper's) the prompt length of the block's own request
OFFSETS = ("global", "cached", "request")
EVICT, CHAT, AGENTIC, STRUCT = range(4)
WEIGHTED = (CHAT, AGENTIC, STRUCT)
#: task label -> queue, for the labels of the bundled generators and loaders
DEFAULT_TASKS = {
    "chat": "chat",
    "agentic": "agentic",
    "agent": "agentic",
    "swe-agent": "agentic",
    "tool-agent": "agentic",
    "untemplated": "evict",
    "programming": "structural",
    "tool-use": "structural",
    "document-qa": "structural",
}


def parse_tasks(spec: str) -> dict[str, int]:
    """``"chat:chat/agent:agentic/qa:structural/spam:evict"`` -> task -> queue index, on top
    of :data:`DEFAULT_TASKS`."""
    out = {t: QUEUES.index(q) for t, q in DEFAULT_TASKS.items()}
    for item in filter(None, (p.strip() for p in spec.split("/"))):
        task, sep, queue = (part.strip() for part in item.rpartition(":"))
        if not sep or not task or queue not in QUEUES:
            raise ValueError(
                f"tasks: expected TASK:QUEUE items separated by '/', QUEUE one of "
                f"{', '.join(QUEUES)}; got '{item}'"
            )
        out[task] = QUEUES.index(queue)
    return out


def update_weights(
    alpha: F64,
    hits: F64,
    held: F64,
    temperature: float,
    beta: float,
    eps: float,
    order: str = "paper",
) -> F64:
    """One step of Algorithm 2 over the queues that hold blocks (the others keep theirs).

    ``order="paper"`` is Algorithm 2 as printed: ``E_q = H_q / (C_q + eps)``,
    ``E_bar = mean(E) + eps`` (line 12), ``E^_q = (E_q / E_bar) ^ (1 / T)`` (line 15),
    bounds ``[max(0.001, mu - 2 sigma), min(10, mu + 2 sigma)]`` of the ``E^`` (line 18),
    then ``alpha_q = clamp(beta alpha_q + (1 - beta) E^_q, L, U)`` (lines 21-22): the EMA
    first, the clamp on the weight. ``order="clip-ehat"`` is this project's earlier
    reading: ``E^_q = (E_q / mean(E) + eps) ^ (1 / T)`` clipped to the bounds, then the EMA
    (with three queues no ``E^`` is ever 2 sigma from the mean, so only the constants bind).
    Sigma is the population standard deviation (the paper does not say which). A window
    without a hit anywhere changes nothing (the paper's bounds would cross).
    """
    out: F64 = alpha.copy()
    live = held > 0
    if not live.any():
        return out
    e = hits[live] / (held[live] + eps)
    if float(e.max()) <= 0.0:
        return out  # no hits anywhere in the window: nothing to learn from
    if order == "paper":
        e_hat = (e / (float(e.mean()) + eps)) ** (1.0 / temperature)
        mu, sd = float(e_hat.mean()), float(e_hat.std())
        raw = beta * alpha[live] + (1.0 - beta) * e_hat
        out[live] = np.minimum(np.maximum(raw, max(0.001, mu - 2.0 * sd)), min(10.0, mu + 2.0 * sd))
        return out
    e_hat = (e / float(e.mean()) + eps) ** (1.0 / temperature)
    mu, sd = float(e_hat.mean()), float(e_hat.std())
    e_hat = np.clip(e_hat, max(0.001, mu - 2.0 * sd), min(10.0, mu + 2.0 * sd))
    out[live] = beta * alpha[live] + (1.0 - beta) * e_hat
    return out


@register("unicache")
class UniCache(EvictionPolicy):
    """UniCache: evict-first, session-reuse and structural-reuse queues, hit-efficiency weights."""

    structures: ClassVar[frozenset[str]] = frozenset({"block"})
    needs_trace: ClassVar[bool] = True

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
        for name, v, low in (("temperature", temperature, 0.0), ("eps", eps, 0.0),
                             ("chat_sigma", chat_sigma, 0.0),
                             ("agentic_sigma", agentic_sigma, 0.0)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            if v <= low:
                raise ValueError(f"{name} must be > {low:g}, got {v!r}")
        for name, v in (("chat_mu", chat_mu), ("agentic_mu", agentic_mu)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta!r}")
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
        # per-trace state (prepare_trace)
        self._req_queue: I64 = np.zeros(0, dtype=np.int64)
        self._req_input: I64 = np.zeros(0, dtype=np.int64)
        self._req_gap: F64 = np.zeros(0)

    # ------------------------------------------------------------------ set-up
    def bind(self, view: EntryView) -> None:
        super().bind(view)
        n = view.num_entries
        self.queue = np.full(n, -1, dtype=np.int64)  # queue of a cached entry, -1 if none
        self.t_last = np.zeros(n, dtype=np.float64)
        self.span = np.ones(n, dtype=np.float64)  # prompt blocks of the entry's request
        self._token = np.full(n, -1, dtype=np.int64)  # live heap item of an evictable entry
        self._order = np.zeros(n, dtype=np.int64)
        self._next = 0
        # per queue, a lazily invalidated min-heap: an entry's latest push is its live item
        self._heaps: list[list[tuple[Any, int, int, int]]] = [[] for _ in QUEUES]
        self._evictable = np.zeros(len(QUEUES), dtype=np.int64)
        self.held = np.zeros(len(QUEUES), dtype=np.float64)
        self.hits = np.zeros(len(QUEUES), dtype=np.float64)
        self.alpha = np.ones(len(QUEUES), dtype=np.float64)
        self.max_offset = 1  # the deepest structural block ever seen (offset=global)
        # offset=cached: structural blocks cached per depth, and a max-heap of depths
        self._depth_count = np.zeros(64, dtype=np.int64)
        self._depth_listed = np.zeros(64, dtype=bool)
        self._depths: list[int] = []
        self._credit = np.zeros(len(QUEUES), dtype=np.float64)
        self._since_update = 0
        self._seen = -1  # requests up to here have had their gap counted
        # online log-normal fit per session queue: count, sum of log gaps, sum of squares
        self._gap_stats = np.zeros((len(QUEUES), 3), dtype=np.float64)
        self.weight_history: list[tuple[int, list[float]]] = []

    def prepare_trace(self, trace: Any, clock: str) -> None:
        n = len(trace)
        queues = np.empty(n, dtype=np.int64)
        for i, (task, session) in enumerate(zip(trace.task, trace.session_id, strict=True)):
            q = self._task_queue.get(task) if task is not None else None
            # unlabelled: a request of a session is chat-like, else templated-like
            queues[i] = q if q is not None else (CHAT if session is not None else STRUCT)
        self._req_queue = queues
        self._req_input = np.asarray(trace.input_length, dtype=np.int64)
        self._req_gap = previous_turn_gaps(trace.session_id, trace.arrival_s)
        super().prepare_trace(trace, clock)

    # ------------------------------------------------------------------ time, fit
    def _request(self) -> int:
        r = self.view.request_index
        if not self._req_queue.shape[0]:
            raise ConfigError(f"policy '{self.name}' needs the trace (run it through a runner)")
        if r > self._seen:  # learn the gaps of newly seen requests, in order, once
            for i in range(self._seen + 1, r + 1):
                g = self._req_gap[i]
                q = int(self._req_queue[i])
                if q in (CHAT, AGENTIC) and g > 0:
                    lg = math.log(g)
                    self._gap_stats[q] += (1.0, lg, lg * lg)
                self._since_update += 1
                if self._since_update >= self.update_every:
                    self._since_update = 0
                    self.update_weights(i)
            self._seen = r
        return r

    def gap_params(self, q: int) -> tuple[float, float]:
        """(mu, sigma) of the queue's log-normal gap model now."""
        given = (self.chat_mu, self.chat_sigma) if q == CHAT else (self.agentic_mu,
                                                                   self.agentic_sigma)  # fmt: skip
        n, s1, s2 = self._gap_stats[q]
        if self.fit == "given" or n < self.min_gaps:
            return given
        mu = s1 / n
        var = max(s2 / n - mu * mu, 0.0)
        return mu, max(math.sqrt(var), 1e-6)

    # ------------------------------------------------------------------ scores
    def local_priority(self, e: int, q: int, now: float) -> float:
        """``s`` of entry ``e`` in queue ``q`` (lower goes first)."""
        if q == STRUCT:
            return 1.0 - float(self.view.depth[e]) / self._offset_scale(e)
        if q == EVICT:
            return 0.0
        mu, sigma = self.gap_params(q)
        return 1.0 - float(lognormal_cdf(now - float(self.t_last[e]), mu, sigma))

    def _offset_scale(self, e: int) -> float:
        if self.offset == "global":
            return float(self.max_offset)
        if self.offset == "request":
            return float(self.span[e])
        listed, count = self._depths, self._depth_count
        while listed and count[-listed[0]] == 0:
            self._depth_listed[-heapq.heappop(listed)] = False
        return float(max(-listed[0], 1)) if listed else 1.0

    def _item(self, e: int, q: int, tok: int) -> tuple[Any, int, int, int]:
        return (self._heap_key(e, q), int(self._order[e]), tok, e)

    def _heap_key(self, e: int, q: int) -> Any:
        # session queues: oldest last access first (s falls with idle time); the others:
        # largest offset first
        if q in (CHAT, AGENTIC):
            return float(self.t_last[e])
        if q == STRUCT and self.offset == "request":
            return -float(self.view.depth[e]) / float(self.span[e])
        return -int(self.view.depth[e])

    # ------------------------------------------------------------------ hooks
    def _assign(self, entries: I64, r: int) -> None:
        base = int(self._req_queue[r])
        v = self.view
        q = np.full(entries.shape[0], base, dtype=np.int64)
        if base in (EVICT, STRUCT):  # single-turn: decode blocks are never reused
            decode = (v.depth[entries] + 1) * v.size[entries] > self._req_input[r]
            q[decode] = EVICT
        self._move(entries, q)
        self.span[entries] = (
            max(self._req_input[r] // int(v.size[entries[0]]), 1) if entries.shape[0] else 1
        )
        s = entries[q == STRUCT]
        if s.shape[0]:
            self.max_offset = max(self.max_offset, int(v.depth[s].max()))

    def _move(self, entries: I64, q: I64) -> None:
        """Set the queue of ``entries`` (-1: none), keeping the counts."""
        old = self.queue[entries]
        np.subtract.at(self.held, old[old >= 0], 1.0)
        np.add.at(self.held, q[q >= 0], 1.0)
        self.queue[entries] = q
        if self.offset == "cached":
            depth = self.view.depth
            np.subtract.at(self._depth_count, depth[entries[old == STRUCT]], 1)
            d = depth[entries[q == STRUCT]]
            if d.shape[0]:
                top = int(d.max())
                if top >= self._depth_count.shape[0]:
                    grow = max(self._depth_count.shape[0], top + 1 - self._depth_count.shape[0])
                    self._depth_count = np.concatenate(
                        [self._depth_count, np.zeros(grow, dtype=np.int64)]
                    )
                    self._depth_listed = np.concatenate(
                        [self._depth_listed, np.zeros(grow, dtype=bool)]
                    )
                np.add.at(self._depth_count, d, 1)
                for x in np.unique(d).tolist():
                    if not self._depth_listed[x]:
                        self._depth_listed[x] = True
                        heapq.heappush(self._depths, -x)

    def _drop(self, e: int) -> None:
        """Entry ``e`` leaves the cache (evicted)."""
        q = int(self.queue[e])
        self._token[e] = -1
        self._evictable[q] -= 1
        self.held[q] -= 1.0
        self.queue[e] = -1
        if q == STRUCT and self.offset == "cached":
            self._depth_count[int(self.view.depth[e])] -= 1

    def on_insert(self, entries: I64) -> None:
        r = self._request()
        self._assign(entries, r)
        self.t_last[entries] = self.now()

    def on_access(self, entries: I64) -> None:
        r = self._request()
        q = self.queue[entries]
        np.add.at(self.hits, q[q >= 0], 1.0)  # the queue the hit block was in earns it
        free = self._unlist(entries)
        self._assign(entries, r)
        self.t_last[entries] = np.maximum(self.t_last[entries], self.now())
        self._push(free)  # re-ranked in its (new) queue

    def on_update(self, entries: I64) -> None:
        pass  # a duplicate key promoted: same queue, same age

    def on_evictable(self, entries: I64) -> None:
        self._order[entries] = np.arange(self._next, self._next + entries.shape[0])
        self._next += int(entries.shape[0])
        self._push(entries)

    def on_pinned(self, entries: I64) -> None:
        self._unlist(entries)

    def on_remove(self, entries: I64) -> None:
        self._unlist(entries)
        self._move(entries, np.full(entries.shape[0], -1, dtype=np.int64))

    def _unlist(self, entries: I64) -> I64:
        """Take entries out of the heaps (lazily); returns those that were evictable."""
        live = entries[self._token[entries] >= 0]
        np.subtract.at(self._evictable, self.queue[live], 1)
        self._token[entries] = -1
        return live

    def _push(self, entries: I64) -> None:
        for e in entries.tolist():
            q = int(self.queue[e])
            tok = self._next
            self._next += 1
            self._token[e] = tok
            self._evictable[q] += 1
            heapq.heappush(self._heaps[q], (self._heap_key(e, q), int(self._order[e]), tok, e))

    # ------------------------------------------------------------------ eviction
    def _head(self, q: int) -> int:
        items = self._heaps[q]
        while items:
            _, _, tok, e = items[0]
            if self._token[e] == tok:
                return e
            heapq.heappop(items)
        return -1

    def _take(self, e: int) -> None:
        heapq.heappop(self._heaps[int(self.queue[e])])
        self._drop(e)

    def update_weights(self, at: int) -> None:
        """Algorithm 2 over the weighted queues (at request ``at``); the hit window restarts."""
        idx = list(WEIGHTED)
        held = self.held[idx]
        if self.alg2 == "paper":  # C_q: the share of the capacity the queue holds
            held = held / max(self.view.num_entries, 1)
        new = update_weights(self.alpha[idx], self.hits[idx], held, self.temperature,
                             self.beta, self.eps, self.alg2)  # fmt: skip
        self.alpha[idx] = new
        self.weight_history.append((at, [float(a) for a in new]))
        if self.hit_count == "window":
            self.hits[:] = 0.0

    def choose(self, now: float, skip: Any = None) -> int:
        """The next victim (not yet taken), or -1: evict-first, then stage 2 (or the
        proportional split without it). ``skip(e)`` hides heads (unicache-opt)."""
        e = self._head(EVICT)
        if e >= 0:
            return e
        best, best_g = -1, math.inf
        if not self.stage2:
            # only queues with a candidate left (unicache-opt sets needed blocks aside)
            heads = {q: self._head(q) for q in WEIGHTED}
            live = [q for q in WEIGHTED if heads[q] >= 0]
            if not live:
                return -1
            total = float(sum(int(self._evictable[q]) for q in live))
            for q in live:
                self._credit[q] += self._evictable[q] / total
            pick = max(live, key=lambda q: (self._credit[q], -q))
            self._credit[pick] -= 1.0
            return heads[pick]
        for q in WEIGHTED:
            h = self._head(q)
            if h < 0:
                continue
            g = self.alpha[q] * self.local_priority(h, q, now)
            if g < best_g:
                best, best_g = h, g
        return best

    def evict(self, n: int) -> I64:
        now = self.now()
        out: list[int] = []
        while len(out) < n:
            e = self.choose(now)
            if e < 0:
                break
            self._take(e)
            out.append(e)
        return np.array(out, dtype=np.int64)

    def params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (
            "update_every", "temperature", "beta", "eps", "fit", "min_gaps", "chat_mu",
            "chat_sigma", "agentic_mu", "agentic_sigma", "stage2", "tasks", "offset",
            "alg2")} | {"hits": self.hit_count}  # fmt: skip


@register("unicache-opt")
class UniCacheOPT(UniCache):
    """UniCache ranked first by the next use seen in the engine's waiting queue."""

    uses_lookahead: ClassVar[bool] = True
    requires_engine: ClassVar[bool] = True

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._next_use: dict[int, int] = {}

    def on_waiting(self, waiting_keys: Sequence[I64]) -> None:
        self._next_use = waiting_positions(waiting_keys)

    def evict(self, n: int) -> I64:
        now = self.now()
        out: list[int] = []
        aside: list[int] = []  # needed by a waiting request: kept while others can go
        known = self._next_use
        key = self.view.key
        while len(out) < n:
            e = self.choose(now)
            if e < 0:
                break
            q = int(self.queue[e])
            if int(key[e]) in known:
                heapq.heappop(self._heaps[q])  # set aside, still evictable
                aside.append(e)
                continue
            self._take(e)
            out.append(e)
        # the rest from the set-aside blocks, the one needed last first
        aside.sort(key=lambda e: (-known[int(key[e])], -int(self.view.depth[e])))
        for e in aside:
            q = int(self.queue[e])
            if len(out) < n:
                self._drop(e)
                out.append(e)
            else:
                heapq.heappush(self._heaps[q], self._item(e, q, int(self._token[e])))
        return np.array(out, dtype=np.int64)
