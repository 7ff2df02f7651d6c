"""``kv-aware``: Dynamo's KV router (llm-d's precise prefix-cache scorer works alike).

The router learns what each replica caches from the replica's own KV events (a block
stored, a block removed), each seen ``event_delay`` seconds after it happened, and keeps
each replica's load from the requests it routed. For a request it computes, per replica::

    overlap         leading prompt blocks the replica holds (by its events)
    prefill_blocks  (prompt tokens of its requests still awaiting a first token, less the
                     overlap each had when routed, + this prompt's tokens less this
                     overlap) / block size
    decode_blocks   distinct blocks of its unfinished requests' prompts, + this prompt's
    cost            overlap_score_weight * prefill_blocks + decode_blocks

and picks the lowest cost (ties to the lowest index), or with ``router_temperature`` > 0
draws from a softmax of the costs normalised by their range (seeded). Parameters are
Dynamo's (``--kv-overlap-score-weight`` 1.0, ``--router-temperature`` 0.0); the delay
stands for the event transport, which Dynamo does not model (0: the events of a step are
seen by the next arrival).
"""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from prefixlab.routers._compiled import KV_AWARE
from prefixlab.routers.base import Fleet, Router, check_seed, leading_run, register
from prefixlab.types import F64, I64, Scalar

#: the methods whose rule the compiled router repeats (a subclass changing one is not)
_RULES = ("route", "costs", "routed", "answered", "finished", "kv_event", "overlaps")


@register("kv-aware")
class KvAware(Router):
    """Dynamo's KV router: overlap-weighted prefill blocks plus decode blocks, lowest."""

    reads_kv_events = True

    def __init__(
        self,
        overlap_score_weight: float = 1.0,
        router_temperature: float = 0.0,
        event_delay: float = 0.0,
        seed: int = 0,
    ) -> None:
        if overlap_score_weight < 0 or router_temperature < 0 or event_delay < 0:
            raise ValueError(
                "overlap_score_weight, router_temperature and event_delay must be >= 0"
            )
        self.overlap_score_weight = float(overlap_score_weight)
        self.router_temperature = float(router_temperature)
        self.event_delay = float(event_delay)
        self.seed = check_seed(seed)

    def params(self) -> dict[str, Scalar]:
        return {
            "overlap_score_weight": self.overlap_score_weight,
            "router_temperature": self.router_temperature,
            "event_delay": self.event_delay,
            "seed": self.seed,
        }

    def compiled(self) -> tuple[int, F64] | None:
        """Compiled with its events seen at once and no temperature (see
        :mod:`prefixlab.routers._compiled`); else on the reference loop."""
        if self.event_delay > 0 or self.router_temperature > 0:
            return None
        if any(getattr(type(self), m) is not getattr(KvAware, m) for m in _RULES):
            return None
        return KV_AWARE, np.array([self.overlap_score_weight])

    def bind(self, fleet: Fleet) -> None:
        super().bind(fleet)
        n = fleet.replicas
        self.rng = np.random.default_rng(self.seed)
        #: per replica: key -> blocks holding it, as the events seen so far say
        self.cached: list[Counter[int]] = [Counter() for _ in range(n)]
        self.pending: deque[tuple[float, int, I64, bool]] = deque()
        #: per replica: prompt tokens to prefill of requests awaiting a first token
        self.prefill_tokens = np.zeros(n, np.float64)
        #: per replica: blocks of unfinished requests' prompts (shared ones once)
        self.active: list[Counter[int]] = [Counter() for _ in range(n)]
        self._uncached: dict[int, int] = {}
        self._last: tuple[int, F64] = (-1, np.zeros(n))

    def kv_event(self, replica: int, keys: I64, stored: bool, now: float) -> None:
        self.pending.append((now + self.event_delay, replica, keys.copy(), stored))

    def _apply_events(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, i, keys, stored = self.pending.popleft()
            held = self.cached[i]
            for k in keys.tolist():
                if stored:
                    held[k] += 1
                elif held[k] > 1:
                    held[k] -= 1
                else:
                    held.pop(k, None)

    def overlaps(self, keys: list[int]) -> list[int]:
        """Leading blocks of ``keys`` each replica holds, by the events seen."""
        return [leading_run(keys, held) for held in self.cached]

    def costs(self, r: int, now: float) -> F64:
        """Each replica's cost for request ``r`` (after the events due by ``now``)."""
        self._apply_events(now)
        bt = self.fleet.layout.block_tokens
        keys = self.fleet.prompt_keys(r).tolist()
        tokens = int(self.fleet.trace.input_length[r])
        overlap = np.array(self.overlaps(keys), dtype=np.float64)
        self._last = (r, overlap)  # routed() reuses it: no event arrives in between
        prefill = (self.prefill_tokens + tokens - overlap * bt) / bt
        blocks = -(-tokens // bt)
        decode = np.array([len(a) for a in self.active], dtype=np.float64) + blocks
        cost: F64 = self.overlap_score_weight * prefill + decode
        return cost

    def route(self, r: int, now: float) -> int:
        cost = self.costs(r, now)
        if self.router_temperature <= 0:
            return int(np.argmin(cost))
        span = float(cost.max() - cost.min())
        logits = -(cost - cost.min()) / (span if span > 0 else 1.0) / self.router_temperature
        p = np.exp(logits - logits.max())
        return int(self.rng.choice(cost.shape[0], p=p / p.sum()))

    def routed(self, r: int, replica: int, now: float) -> None:
        keys = self.fleet.prompt_keys(r).tolist()
        bt = self.fleet.layout.block_tokens
        last_r, overlap = self._last
        hit = int(overlap[replica]) if last_r == r else self.overlaps(keys)[replica]
        uncached = int(self.fleet.trace.input_length[r]) - hit * bt
        self._uncached[r] = uncached
        self.prefill_tokens[replica] += uncached
        self.active[replica].update(keys)

    def answered(self, r: int, replica: int, now: float) -> None:
        self.prefill_tokens[replica] -= self._uncached.pop(r, 0)

    def finished(self, r: int, replica: int, now: float) -> None:
        active = self.active[replica]
        active.subtract(self.fleet.prompt_keys(r).tolist())
        for k in [k for k, c in active.items() if c <= 0]:
            del active[k]
