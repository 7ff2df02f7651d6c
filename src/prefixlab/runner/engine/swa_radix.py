"""SGLang's SWA radix cache (:mod:`prefixlab.cache.swa_radix`) behind the engine's scheduler.

The radix structure caches a model with sliding-window layers by SGLang's rule for them
(``sliding_window_rule = "window"``, the default): two pools sized as SGLang sizes them,
SGLang's own eviction, and its calls at SGLang's points of a request's life:

- **pools**: SGLang splits the KV memory so that ``swa_tokens = 0.8 x full_tokens``
  (``--swa-full-tokens-ratio``): ``full_tokens = floor_page(bytes / (full layers' bytes
  per token + 0.8 x sliding layers'))``. The memory is the structure's capacity, every
  layer of every block (as the ``full`` rule keeps them);
- **window**: SGLang's model reports ``sliding_window - 1`` (gpt-oss: 127);
- **slots**: a request takes its prompt's pages at admission and a page when a decode step
  starts one (the engine's scheduler runs this cache without its one-token lookahead);
  before each decode step, SGLang evicts for a page per decoding request, and from a
  request's second decode step frees its out-of-window SWA slots once 128 tokens have
  left the window;
- **inserts**: after each prefill chunk (``checkpoint``) and at the end, ``input + output -
  1`` tokens (the last sampled token has no KV).

KV events carry the full KV's pages: a new leaf is stored, a deleted leaf removed
(tombstoning frees SWA slots only, as SGLang's events for the full pool do not change).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prefixlab.cache.events import Observer, Removed, Stored
from prefixlab.cache.swa_radix import DECODE_INTERVAL, SwaMatch, SwaRadixCache, SwaRequest
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.model.spec import ModelSpec
from prefixlab.types import I64

#: SGLang's --swa-full-tokens-ratio default
SWA_FULL_TOKENS_RATIO = 0.8


@dataclass(slots=True)
class SwaView:
    """What the scheduler tells a cache before it calls it."""

    now: float = 0.0
    request_index: int = -1


@dataclass(slots=True)
class SwaHandle:
    """A running request: its slots and locks, and its first decode position."""

    req: SwaRequest
    first_decode: int = -1


def sglang_pools(capacity_blocks: int, model: ModelSpec, block_tokens: int) -> tuple[int, int]:
    """SGLang's two pools (full, SWA), in pages, from the memory of ``capacity_blocks``
    blocks of every layer (``HybridSWAPoolConfigurator``)."""
    layers = model.num_attention_layers
    sliding = model.num_sliding_layers
    tokens = capacity_blocks * block_tokens * layers
    full_tokens = int(tokens // ((layers - sliding) + SWA_FULL_TOKENS_RATIO * sliding))
    full_tokens = full_tokens // block_tokens * block_tokens
    swa_tokens = int(full_tokens * SWA_FULL_TOKENS_RATIO) // block_tokens * block_tokens
    return full_tokens // block_tokens, swa_tokens // block_tokens


def sglang_hybrid_swa(model: ModelSpec) -> bool:
    """Whether SGLang 0.5.23 serves the model with its SWA pools: not Gemma 2 or 3, which
    it runs on one full-size pool (``gemma2_gemma3.py`` sets ``disable_hybrid_swa_memory``;
    ``is_hybrid_swa_model`` lists gpt-oss, Llama 4, Gemma 4, MiMo-V2, ...)."""
    name = model.name.lower()
    if name.endswith(".json"):
        try:
            data = json.loads(Path(model.name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        kind = data.get("model_type") if isinstance(data, dict) else None
        text = data.get("text_config") if isinstance(data, dict) else None
        if isinstance(text, dict) and isinstance(text.get("model_type"), str):
            kind = text["model_type"]
        name = kind if isinstance(kind, str) else ""
    return not name.replace("-", "").startswith(("gemma2", "gemma3"))


def sglang_window(model: ModelSpec) -> int:
    """The window SGLang's model code reports: the config's ``sliding_window - 1``."""
    return max(model.sliding_window - 1, 1)


class SwaEngineCache:
    """The engine's verbs (match, acquire, grow, commit, release) on SGLang's SWA cache."""

    structure = "radix"
    #: the scheduler holds no lookahead token for this cache, and passes token counts
    exact_slots = True
    #: SGLang evicts for a free page per decoding request before each decode step
    spare_blocks = 1

    def __init__(
        self,
        capacity_blocks: int,
        model: ModelSpec,
        block_tokens: int,
        observers: Sequence[Observer] = (),
    ) -> None:
        full, swa = sglang_pools(capacity_blocks, model, block_tokens)
        self.bt = block_tokens
        self.window = sglang_window(model)
        self.cache = SwaRadixCache(full, swa, block_tokens, self.window)
        self.cache.on_store = self._stored if observers else None
        self.cache.on_remove = self._removed if observers else None
        self.observers = list(observers)
        self.view = SwaView()
        #: the most pages a request can hold (the scheduler's capacity check)
        self.capacity_blocks = full

    def _stored(self, keys: I64) -> None:
        for obs in self.observers:
            obs.on_event(Stored(keys.copy()))

    def _removed(self, keys: I64) -> None:
        for obs in self.observers:
            obs.on_event(Removed(keys.copy(), True))

    # ------------------------------------------------------------------ lookup
    def match(self, keys: I64, lookup_end: int | None = None) -> SwaMatch:
        return self.cache.match(keys)

    # ------------------------------------------------------------------ lifecycle
    def acquire(self, m: SwaMatch, num_blocks: int, keys: I64) -> SwaHandle | None:
        """Lock the hit, evict for the prompt's pages (and a spare page, when paged) and
        take them; None (nothing taken) when even evicting all it may would not free
        them."""
        c = self.cache
        need = num_blocks - m.num_hit_blocks
        if need > c.swa_pages or num_blocks > c.full_pages:
            raise CapacityError(
                f"request {self.view.request_index} needs {num_blocks} pages of "
                f"{self.bt} tokens for its prompt, but SGLang's pools hold {c.full_pages} "
                f"full and {c.swa_pages} SWA pages; raise the capacity"
            )
        req = c.admit(m)
        if not c.reclaimable(need, need):
            c.release(req)
            return None
        c.evict_for(need * self.bt + (self.bt if self.bt > 1 else 0))
        taken = c.allocate(req, need)
        assert taken, "the pools could not give what eviction freed"
        return SwaHandle(req)

    def grow(self, handle: SwaHandle, num_blocks: int) -> SwaHandle | None:
        c = self.cache
        if not c.reclaimable(num_blocks, num_blocks):
            return None
        c.evict_for(num_blocks * self.bt)
        taken = c.allocate(handle.req, num_blocks)
        assert taken, "the pools could not give what eviction freed"
        return handle

    def keep_free(self, num_blocks: int) -> None:
        """SGLang's eviction before a decode step: room for a page per decoding request."""
        self.cache.evict_for(num_blocks * self.bt)

    def slide(self, handle: SwaHandle, computed_tokens: int, keys: I64) -> None:
        """Before a decode step whose position is ``computed_tokens``: from the request's
        second step, free its out-of-window SWA slots once ``DECODE_INTERVAL`` tokens
        have left the window (SGLang's ``maybe_evict_swa``)."""
        if handle.first_decode < 0:
            handle.first_decode = computed_tokens
            return
        if computed_tokens <= handle.first_decode:
            return
        req = handle.req
        if computed_tokens - self.window >= req.freed * self.bt + DECODE_INTERVAL:
            self.cache.free_out_of_window(req, computed_tokens)

    def commit(
        self,
        handle: SwaHandle,
        keys: I64,
        start: int,
        *,
        tokens: int | None = None,
        finished: bool = False,
    ) -> int:
        """Insert the request's first ``tokens`` tokens (``keys`` names their pages)."""
        n = tokens if tokens is not None else int(keys.shape[0]) * self.bt
        self.cache.checkpoint(handle.req, keys, n, finished)
        return min(int(keys.shape[0]), n // self.bt)

    def release(self, handle: SwaHandle | None) -> None:
        """Free the request's slots past the tree's and unlock (a finish or a preemption)."""
        if handle is not None:
            self.cache.finish(handle.req)

    # ------------------------------------------------------------------ checks
    def check(self, handles: Sequence[object] = ()) -> None:
        self.cache.check([h.req for h in handles if isinstance(h, SwaHandle)])


def check_swa_radix(policy_name: str, config_tiers: bool, admission_default: bool) -> None:
    """What SGLang's SWA rule does not combine with, refused with the way around it."""
    why = ""
    if policy_name != "sglang-lru":
        why = f"it evicts by SGLang's own LRU, not policy '{policy_name}' (use sglang-lru)"
    elif config_tiers:
        why = "tiers below GPU memory are not modelled with it"
    elif not admission_default:
        why = "a non-default admission is not modelled with it"
    if why:
        raise ConfigError(
            f"the sliding-window cache rule on the radix structure (SGLang's SWA radix "
            f"cache): {why}; or use sliding_window_rule = 'full' (--sliding-window-rule full)"
        )
