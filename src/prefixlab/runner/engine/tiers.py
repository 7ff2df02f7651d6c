"""KV tiers below GPU memory: a CPU pool per replica and a store shared by the fleet.

::

    GPU pool --evict / compute--> CPU pool (per replica) --evict / compute--> shared store
        ^                              |                                          |
        +---- load: bytes / bandwidth + latency, on the request's first token ----+

A request looks up its prefix in GPU memory; past the GPU hit, block by block, it takes
each from the highest tier that holds it, up to the first block no tier holds (a lower
tier may hold a block whose parent sits higher). Blocks found below are *loaded*: they take
new GPU blocks like computed ones, count as hits (they are not prefilled), and the request
waits for them before its prefill starts. Each tier's link to the replica is a queue:
a load starts when the link is free, and takes ``bytes / bandwidth + latency``; loads from
the two tiers run side by side, and the request is ready when the later ends. With
``overlap``, the load runs under the prefill of the rest of the prompt (layer by layer, as
LMCache and vLLM's offloading connector do): the request waits only for the part of the
load its own prefill, alone on the GPU, would not cover.

How blocks get into a tier (``write``):

- ``through``: every block the replica computes is offered as soon as it is cached on the
  GPU, and so is every block it loaded from a tier below (a store hit is written into the
  CPU pool); the tier keeps the ones it lacks. With one tier this is vLLM's offloading
  connector, which offers the keys past the CPU hit.
- ``back``: a block is written when the level above evicts it (the GPU pool for the CPU
  tier; the CPU tier, or the GPU pool when there is none, for the store).

A write takes link time in the other direction (the link is full duplex): each tier's
write link to the replica is a queue too, and a block is readable in its tier only once
its copy has landed (``bytes / bandwidth + latency`` after the link is free). A lookup
that finds a block in flight counts it, and the load waits for the copy to land (vLLM's
offloading manager answers ``HIT_PENDING`` and the connector defers the request until the
store completes); its transfer is booked from the landing on, at the first gap of the
link that fits, so others' loads use the link meanwhile. Writes never delay the request
that made them (its GPU blocks are not held for the copy: the GPU-side cost is not
modelled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixlab.cache.events import Event, Removed
from prefixlab.cache.tier import AnyTier, Tier, VllmLruTier
from prefixlab.configfile import parse_bytes
from prefixlab.errors import ConfigError
from prefixlab.model.spec import capacity_blocks_for_bytes
from prefixlab.model.timing import TimingModel
from prefixlab.policies.base import make_eviction_policy
from prefixlab.policies.block_admission import is_default, make_admission
from prefixlab.registry import parse_spec
from prefixlab.types import F64, I64
from prefixlab.workload.trace import BlockLayout

#: the tier policy that is vLLM's CPU offload manager with its LRU (not a block policy)
VLLM_LRU = "vllm-lru"
#: the tiers, top to bottom; ``store`` is one pool shared by every replica of a fleet
TIER_NAMES = ("cpu", "store")
WRITE_MODES = ("through", "back")
#: link defaults: PCIe 4.0 x16 as measured with pinned memory; a 100 Gb/s network
DEFAULT_GBPS = {"cpu": 25.0, "store": 12.5}
DEFAULT_LATENCY_S = {"cpu": 0.0, "store": 1e-4}


@dataclass(slots=True, frozen=True)
class TierConfig:
    """One tier: its pool, its eviction policy and admission, how blocks reach it, and the
    link between it and a replica's GPU (GB/s = 1e9 bytes per second, each way)."""

    name: str
    capacity_blocks: int
    policy: str = "lru"
    write: str = "through"
    bandwidth_gbps: float | None = None
    latency_s: float | None = None
    admission: str = "all"

    @property
    def bytes_per_s(self) -> float:
        gbps = self.bandwidth_gbps if self.bandwidth_gbps is not None else DEFAULT_GBPS[self.name]
        return gbps * 1e9

    @property
    def latency(self) -> float:
        lat = self.latency_s
        return lat if lat is not None else DEFAULT_LATENCY_S[self.name]

    def validate(self) -> None:
        if self.name not in TIER_NAMES:
            raise ConfigError(f"tier '{self.name}': the tiers are {', '.join(TIER_NAMES)}")
        c = self.capacity_blocks
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ConfigError(f"tier {self.name}: capacity_blocks must be >= 1, got {c!r}")
        if self.write not in WRITE_MODES:
            raise ConfigError(
                f"tier {self.name}: write must be one of {', '.join(WRITE_MODES)}, "
                f"got {self.write!r}"
            )
        for what, value, positive in (
            ("bandwidth_gbps", self.bandwidth_gbps, True),
            ("latency_s", self.latency_s, False),
        ):
            if value is None:
                continue
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0 or (positive and not value):
                rule = "positive" if positive else ">= 0"
                raise ConfigError(f"tier {self.name}: {what} must be {rule}, got {value!r}")
        if parse_spec(self.policy)[0] == VLLM_LRU:
            self._check_vllm()
            return
        pol = make_eviction_policy(self.policy, "block")
        if pol.needs_future or pol.needs_trace:
            raise ConfigError(
                f"tier {self.name}: policy '{pol.spec()}' learns from the trace's requests "
                "as the GPU sees them, not from the tier's reads and writes; choose an "
                "online policy"
            )
        if not is_default(self.admission):
            make_admission(self.admission)

    def _check_vllm(self) -> None:
        params = parse_spec(self.policy)[1]
        for key, value in params.items():
            if key not in ("store_threshold", "max_tracker_size"):
                raise ConfigError(
                    f"tier {self.name}: {VLLM_LRU} takes store_threshold and "
                    f"max_tracker_size, not {key!r}"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"tier {self.name}: {key} must be an integer >= 1")
        if not is_default(self.admission):
            raise ConfigError(
                f"tier {self.name}: {VLLM_LRU} admits by its own store_threshold, not "
                f"admission={self.admission!r}"
            )


#: a tier spec's keys besides its size, and the TierConfig fields they set
_TIER_KEYS = {"write": "write", "gbps": "bandwidth_gbps", "latency_s": "latency_s"}


def tier_of(spec: str, model: str | None, block_tokens: int) -> TierConfig:
    """A tier from its spec (``cpu:size=64GB,policy=s3fifo,write=back``: ``--tier`` and
    experiment configs); ``size`` needs ``model`` (the KV bytes of a block)."""
    name, kwargs = parse_spec(spec, "tier spec")
    size, blocks = kwargs.pop("size", None), kwargs.pop("blocks", None)
    if (size is None) == (blocks is None):
        raise ConfigError(f"tier spec '{spec}': give size=64GB or blocks=N (one of them)")
    if size is not None:
        nbytes = size if isinstance(size, int) else parse_bytes(str(size))
        if nbytes is None or isinstance(nbytes, bool) or nbytes <= 0:
            raise ConfigError(f"tier spec '{spec}': size={size!r} is not a size (64GB, 8GiB)")
        if model is None:
            raise ConfigError(f"tier spec '{spec}': size= needs a model (KV bytes per block)")
        blocks = capacity_blocks_for_bytes(nbytes, model, block_tokens)
    fields: dict[str, Any] = {"capacity_blocks": blocks}  # Any: validate() checks them
    for part in ("policy", "admission"):
        sub = {k.partition(".")[2]: kwargs.pop(k) for k in list(kwargs) if k.startswith(part + ".")}
        if part in kwargs or sub:
            base = str(kwargs.pop(part, "lru" if part == "policy" else "all"))
            fields[part] = base + (
                ":" + ",".join(f"{k}={v}" for k, v in sub.items()) if sub else ""
            )
    unknown = sorted(set(kwargs) - set(_TIER_KEYS))
    if unknown:
        known = "size, blocks, policy, admission, " + ", ".join(_TIER_KEYS)
        raise ConfigError(f"tier spec '{spec}': unknown key {unknown[0]!r} (known: {known})")
    fields.update({_TIER_KEYS[k]: v for k, v in kwargs.items()})
    return TierConfig(name.strip(), **fields)


def tier_setup(text: str, model: str | None, block_tokens: int) -> tuple[TierConfig, ...]:
    """A tier setup written as one string: ``none`` (or empty), or tier specs joined by
    `` + `` (``cpu:size=200GB + store:size=2TB``), as ``plan --tiers`` and the variant
    column of a ``[fleet] tiers`` sweep write it."""
    specs = [t.strip() for t in text.split(" + ") if t.strip()]
    if specs in ([], ["none"]):
        return ()
    return tuple(tier_of(t, model, block_tokens) for t in specs)


def setup_label(specs: Sequence[str]) -> str:
    """The string :func:`tier_setup` reads back: the specs joined by `` + ``, or ``none``."""
    return " + ".join(s.strip() for s in specs) if specs else "none"


def check_tiers(tiers: Sequence[TierConfig], structure: str, model: str | None) -> None:
    """The tiers' order and settings, and what they need of the engine."""
    if not tiers:
        return
    if structure == "hybrid":
        raise ConfigError("tiers hold KV blocks: use the block or radix structure")
    if model is None:
        raise ConfigError("tiers need a model: the KV bytes of a block set its load time")
    for t in tiers:
        t.validate()
    names = [t.name for t in tiers]
    if names != [n for n in TIER_NAMES if n in names]:
        raise ConfigError(f"tiers must be given top down, each once ({', '.join(TIER_NAMES)})")


def make_tier(config: TierConfig, layout: BlockLayout) -> AnyTier:
    """A tier's pool, with a fresh policy and admission."""
    name, params = parse_spec(config.policy)
    if name == VLLM_LRU:
        return VllmLruTier(config.name, config.capacity_blocks, **params)  # type: ignore[arg-type]
    pol = make_eviction_policy(config.policy, "block")
    adm = None if is_default(config.admission) else make_admission(config.admission)
    return Tier(
        config.name,
        config.capacity_blocks,
        pol,
        int(layout.keys.max(initial=-1)) + 1,
        block_tokens=layout.block_tokens,
        admission=adm,
    )


class TierStack:
    """One replica's view of the tiers: the pools (the store may be shared), its links to
    them, and what it read and wrote, per tier."""

    def __init__(
        self,
        configs: Sequence[TierConfig],
        tiers: Sequence[AnyTier],
        block_bytes: int,
        num_requests: int,
        timing: TimingModel | None = None,
    ) -> None:
        self.configs = list(configs)
        self.tiers = list(tiers)
        self.block_bytes = block_bytes
        #: overlap loads with the prefill of the rest (priced by this model); None: not
        self.timing = timing
        k = len(self.tiers)
        #: per link, the read direction's booked transfers (start, end), in order
        self.link_busy: list[list[tuple[float, float]]] = [[] for _ in range(k)]
        self.write_free = [0.0] * k  # the write direction of each link (first come, first served)
        #: per tier: loads that waited for a write still in flight
        self.in_flight_waits = [0] * k
        self.bytes_loaded = [0] * k
        self.bytes_stored = [0] * k
        self.num_evictions = [0] * k
        #: per tier and request: tokens loaded at the request's first admission
        self.hit_tokens: I64 = np.zeros((k, num_requests), dtype=np.int64)
        #: per request: how long its first admission waited for loads (s)
        self.load_wait_s: F64 = np.zeros(num_requests)
        self.now = 0.0
        for j, t in enumerate(self.tiers):
            if not t.watched:  # a shared store's evictions are counted once, by one replica
                t.watched = True
                t.observers.append(_Evictions(self, j))

    def peek(self, keys: I64) -> I64:
        """For the longest run of ``keys`` (the lookup keys past the GPU hit) some tier
        holds, the tier each comes from: the highest that holds it."""
        held = np.stack([t.holds(keys) for t in self.tiers])
        anywhere = held.any(axis=0)
        n = int(keys.shape[0]) if anywhere.all() else int(np.argmin(anywhere))
        src: I64 = np.argmax(held[:, :n], axis=0).astype(np.int64)
        return src

    def _landing(self, tier: AnyTier, keys: I64, now: float) -> float:
        """When the last of ``keys`` still being written to ``tier`` lands (``now``: none)."""
        pending = tier.pending
        if not pending:
            return now
        if len(pending) > 1024:  # forget the writes that landed
            for key in [k for k, t in pending.items() if t <= now]:
                del pending[key]
        return max(now, max((pending.get(k, now) for k in keys.tolist()), default=now))

    def load(
        self, r: int, keys: I64, src: I64, now: float, rest: tuple[int, int], first: int = 0
    ) -> float:
        """Read ``keys`` (blocks ``first``... of the request), each from tier ``src``;
        returns when they are all on the GPU. ``rest``: (tokens to prefill, tokens cached
        before them), for the overlap."""
        ready = landed = now
        pos = np.arange(first, first + keys.shape[0], dtype=np.int64)
        for j, t in enumerate(self.tiers):
            mask = src == j
            mine = keys[mask]
            if not mine.shape[0]:
                continue
            t.take(mine, now, r, pos[mask])
            size = int(mine.shape[0]) * self.block_bytes
            self.bytes_loaded[j] += size
            cfg = self.configs[j]
            # a block still in flight: the request is deferred until it lands, and only
            # then takes the link (the loads of others may use it meanwhile)
            landing = self._landing(t, mine, now)
            self.in_flight_waits[j] += landing > now
            landed = max(landed, landing)
            end = book(self.link_busy[j], now, landing, size / cfg.bytes_per_s + cfg.latency)
            ready = max(ready, end)
        if self.timing is not None and ready > now:
            hidden = self.timing.step_s([(rest[0], rest[1], 0)], [])
            ready = max(landed, ready - hidden)
        return ready

    def offer(
        self, r: int, keys: I64, span: tuple[int, int], loaded: tuple[int, I64], now: float
    ) -> None:
        """Blocks ``span`` of the request were cached on the GPU: each write-through tier
        keeps those it lacks among the ones computed and the ones loaded from below it
        (``loaded``: the GPU hit, and the tier of each block loaded after it)."""
        h, src = loaded
        start, end = max(span[0], h), span[1]
        if start >= end:
            return
        pos = np.arange(start, end)
        inside = pos < h + src.shape[0]
        for j in range(len(self.tiers)):
            if self.configs[j].write != "through":
                continue
            offered = np.ones(pos.shape[0], dtype=bool)
            offered[inside] = src[pos[inside] - h] > j
            at = pos[offered]
            self._write(j, keys[at], now, r, at)

    def finish(self, r: int) -> None:
        """Request ``r`` finished: tiers that commit recency then (vLLM's) do it now."""
        for t in self.tiers:
            t.finish(r)

    def write_back(self, j: int, keys: I64) -> None:
        """The level above tier ``j`` evicted ``keys``: a write-back tier keeps them."""
        self._write(j, keys, self.now, -1, None)

    def _write(self, j: int, keys: I64, now: float, r: int, pos: I64 | None) -> None:
        """Offer ``keys`` to tier ``j``; those it keeps are copied over the write link,
        readable when the copy lands."""
        t = self.tiers[j]
        new = keys[~t.holds(keys)]
        written = t.store(keys, now, r, pos)
        if not written:
            return
        size = written * self.block_bytes
        self.bytes_stored[j] += size
        cfg = self.configs[j]
        begin = max(now, self.write_free[j])
        self.write_free[j] = end = begin + size / cfg.bytes_per_s + cfg.latency
        if end > now:
            kept = new[t.holds(new)]
            t.pending.update(zip(kept.tolist(), [end] * int(kept.shape[0]), strict=True))


def book(busy: list[tuple[float, float]], now: float, earliest: float, duration: float) -> float:
    """Book ``duration`` on a link at the first gap from ``earliest`` on (``busy``: its
    booked transfers, in order; those over by ``now`` are dropped); returns its end."""
    while busy and busy[0][1] <= now:
        busy.pop(0)
    t = earliest
    for i, (start, end) in enumerate(busy):
        if t + duration <= start:
            busy.insert(i, (t, t + duration))
            return t + duration
        t = max(t, end)
    busy.append((t, t + duration))
    return t + duration


class _Evictions:
    """A tier's (or the GPU's) evictions: counted, and written back to the tier below
    when that one writes back."""

    def __init__(self, stack: TierStack, source: int) -> None:
        self.stack = stack
        self.source = source  # -1: the GPU pool
        below = source + 1
        configs = stack.configs
        self.target = below if below < len(configs) and configs[below].write == "back" else -1

    def on_event(self, event: Event) -> None:
        if not isinstance(event, Removed) or not event.evicted:
            return
        if self.source >= 0:
            self.stack.num_evictions[self.source] += int(event.keys.shape[0])
        if self.target >= 0:
            self.stack.write_back(self.target, event.keys)


def gpu_evictions(stack: TierStack) -> _Evictions:
    """The observer to put on the replica's GPU cache (write-back into the first tier)."""
    return _Evictions(stack, -1)
