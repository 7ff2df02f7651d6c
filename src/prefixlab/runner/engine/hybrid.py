"""The hybrid (KV + SSM state) cache behind the engine runner's scheduler.

The scheduler speaks blocks (``match / acquire / grow / commit / release``); this adapter
maps them onto one byte budget shared by the hybrid tree and the running requests:

- a running request reserves the KV of the tokens it holds beyond its hit (``blocks x
  block_tokens - hit`` tokens; the hit's KV is the tree's, locked while it runs) plus one
  live recurrent state;
- the tree may use what the reservations leave; reserving evicts from the tree with the
  policy (the matched paths of running requests are locked);
- when a request finishes, its reservation is returned and its input + output is admitted
  to the tree with the policy's admission (Marconi's replay contract, at finish time). No
  partial sequence is cached while a request runs: a state exists only where admission
  put one, and Marconi saves them at the end of prefill and of decoding.

A hit may cover the whole input (as in the replay contract): the prefill then computes
nothing and the first token comes at the end of the step.

Tuned ``marconi`` is tuned here as in the replay runner, on the requests in the order they
were looked up: the bootstrap window is ``ceil(bootstrap_multiplier x s)`` lookups, ``s``
those made by the first eviction call; when a request finishes once the window is full,
the window's requests are replayed once per alpha of the grid (the replay contract: the
paper's "replaying the bootstrap requests") and the best alpha takes effect at once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from prefixlab.cache.hybrid import HybridCache, HybridMatch, Node
from prefixlab.errors import ConfigError
from prefixlab.model.spec import ModelSpec
from prefixlab.policies.hybrid import HybridPolicy, Marconi
from prefixlab.types import I64
from prefixlab.workload.trace import Trace


@dataclass(slots=True)
class _View:
    now: float = 0.0
    request_index: int = 0


@dataclass(slots=True)
class HybridEngineMatch:
    num_hit_blocks: int
    num_hit_tokens: int
    match: HybridMatch


@dataclass(slots=True)
class HybridHandle:
    request: int
    reserved: int  # bytes reserved for this request
    match: HybridMatch
    locked: list[Node] = field(default_factory=list)
    open: bool = True


def check_token_form(trace: Trace) -> None:
    if trace.input_tokens is None:
        raise ConfigError(
            "the hybrid structure needs token ids: a token-form trace, not block hashes"
        )


def capacity_blocks(capacity_bytes: int, model: ModelSpec, block_tokens: int) -> int:
    """The blocks a lone request may hold: the budget less its live state, in blocks."""
    state = model.state_bytes_per_checkpoint if model.num_ssm_layers else 0
    per_block = block_tokens * model.kv_bytes_per_token
    return max(0, (capacity_bytes - state) // per_block) if per_block else 1 << 62


def tune_on(
    trace: Trace, window: list[int] | I64, pol: Marconi, capacity_bytes: int, model: ModelSpec
) -> float:
    """Marconi's alpha from its bootstrap window (request indices in lookup order): the
    window replayed once per alpha of the grid on a cache of the engine's whole budget."""
    from prefixlab.runner.hybrid import HybridConfig, tune_alpha

    requests = trace.take(np.asarray(window, dtype=np.int64))
    return tune_alpha(requests, pol, HybridConfig(capacity_bytes, model))


class HybridEngineCache:
    """Block-speaking facade over :class:`HybridCache` for the scheduler."""

    def __init__(
        self,
        capacity_bytes: int,
        model: ModelSpec,
        policy: HybridPolicy,
        trace: Trace,
        block_tokens: int,
    ) -> None:
        check_token_form(trace)
        self.total = capacity_bytes
        self.tree = HybridCache(capacity_bytes, model, policy)
        self.policy = policy
        self.bt = block_tokens
        self.kv = model.kv_bytes_per_token
        self.state = self.tree.state
        self.values, offsets = trace.sequence_tokens()
        self.offs = offsets.tolist()
        self.inputs = trace.input_length.tolist()
        self.reserved = 0
        self.view = _View()
        self.trace = trace
        self.model = model
        #: request indices in the order they were looked up (Marconi's tuning window)
        self.looked_up: list[int] = []
        self.tune_at = -1
        #: (lookups so far when it took effect, alpha) for tuned Marconi
        self.alpha_history: list[tuple[int, float]] = []
        self.capacity_blocks = capacity_blocks(capacity_bytes, model, block_tokens)

    # ------------------------------------------------------------------ helpers
    def _input(self, r: int) -> I64:
        return self.values[self.offs[r] : self.offs[r] + self.inputs[r]]

    def _seq(self, r: int) -> I64:
        return self.values[self.offs[r] : self.offs[r + 1]]

    def _make_room(self, extra: int) -> bool:
        """Evict until ``extra`` more reserved bytes fit next to the tree. If they cannot
        fit even with every unlocked node gone, evict nothing and say so (a refused request
        leaves the cache as it was)."""
        over = self.tree.used + self.reserved + extra - self.total
        if over <= 0:
            return True
        # Locked nodes are running requests' hit paths with their ancestors; every other
        # node lies in a lock-free subtree, so evicting it frees all its bytes.
        pinned = sum(self.tree.node_bytes(nd) for nd in self.tree.iter_nodes() if nd.lock)
        if pinned + self.reserved + extra > self.total:
            return False
        self.tree.evict(over)
        self._window_set()
        return self.tree.used + self.reserved + extra <= self.total

    # ------------------------------------------------------------------ the protocol
    def match(self, keys: I64, lookup_end: int | None = None) -> HybridEngineMatch:
        r = self.view.request_index
        m = self.tree.reuse(self._input(r))
        hit = min(m.reusable, self.inputs[r])
        return HybridEngineMatch(hit // self.bt, hit, m)

    def acquire(self, m: HybridEngineMatch, num_blocks: int, keys: I64) -> HybridHandle | None:
        r = self.view.request_index
        handle = self._try_acquire(r, m, num_blocks)
        if handle is None and m.num_hit_tokens and not self.reserved:
            # Nothing else runs, yet the hit's locked path (its KV and the states along it)
            # leaves too little room: take the request as a miss, so it can always run.
            m.num_hit_tokens = m.num_hit_blocks = 0
            m.match = dataclasses.replace(m.match, path=[], reusable=0, reuse_node=None)
            handle = self._try_acquire(r, m, num_blocks)
        return handle

    def _try_acquire(self, r: int, m: HybridEngineMatch, num_blocks: int) -> HybridHandle | None:
        tokens = max(0, num_blocks * self.bt - m.num_hit_tokens)
        need = tokens * self.kv + self.state
        path = [nd for nd in m.match.path if nd.end <= m.num_hit_tokens]
        if m.match.reuse_node is not None and m.match.reuse_node not in path:
            path.append(m.match.reuse_node)
        for nd in path:  # the hit's KV and state stay while the request runs
            nd.lock += 1
            self.policy.changed(nd)
        if not self._make_room(need):
            for nd in path:
                nd.lock -= 1
                self.policy.changed(nd)
            return None
        self.reserved += need
        self.tree.touch(m.match)
        self.looked_up.append(r)
        return HybridHandle(r, need, m.match, path)

    def grow(self, handle: HybridHandle, num_blocks: int) -> HybridHandle | None:
        need = num_blocks * self.bt * self.kv
        if not self._make_room(need):
            return None
        self.reserved += need
        handle.reserved += need
        return handle

    def commit(self, handle: HybridHandle | None, keys: I64, start: int) -> None:
        """At the request's end: return its reservation, admit its sequence to the tree."""
        if handle is None or not handle.open:
            return
        self._close(handle)
        r = handle.request
        self._maybe_tune()
        self.tree.capacity = self.total - self.reserved
        try:
            inp = self._input(r)
            self.tree.admit(self._seq(r), len(inp), self.tree.match(inp))
        finally:
            self.tree.capacity = self.total
        self._window_set()

    # ------------------------------------------------------------------ Marconi's alpha
    def _window_set(self) -> None:
        pol = self.policy
        if (
            isinstance(pol, Marconi)
            and pol.tunes
            and self.tune_at < 0
            and self.tree.num_evict_calls > 0
        ):
            self.tune_at = math.ceil(pol.bootstrap_multiplier * len(self.looked_up))

    def _maybe_tune(self) -> None:
        pol = self.policy
        if not isinstance(pol, Marconi) or self.tune_at < 0 or len(self.looked_up) < self.tune_at:
            return
        window = self.looked_up[: self.tune_at]
        pol.current_alpha = tune_on(self.trace, window, pol, self.total, self.model)
        self.alpha_history.append((len(self.looked_up), pol.current_alpha))
        every = pol.retune_every
        self.tune_at = len(self.looked_up) + every if every else 1 << 62

    def release(self, handle: HybridHandle | None) -> None:
        if handle is not None and handle.open:
            self._close(handle)

    def _close(self, handle: HybridHandle) -> None:
        handle.open = False
        self.reserved -= handle.reserved
        for nd in handle.locked:
            nd.lock -= 1
            if nd.id in self.tree.nodes:
                self.policy.changed(nd)
                self.tree._normalize(nd)

    # ------------------------------------------------------------------ checks
    def check(self, handles: Sequence[object] | None = None) -> None:
        """Tree invariants (locks allowed for running requests) and the byte budget."""
        assert self.tree.used + self.reserved <= self.total, (
            f"tree {self.tree.used} + reserved {self.reserved} > {self.total}"
        )
        if handles is not None:
            held = sum(h.reserved for h in handles if isinstance(h, HybridHandle) and h.open)
            assert held == self.reserved, f"reservations {held} != {self.reserved}"
        locks = sum(nd.lock for nd in self.tree.nodes.values())
        expected = sum(len(h.locked) for h in (handles or []) if isinstance(h, HybridHandle))
        if handles is not None:
            assert locks == expected, f"locks {locks} != held paths {expected}"
        if not locks:
            self.tree.check()
