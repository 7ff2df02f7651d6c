"""Continuous batching over a shared KV pool (vLLM v1-style, simplified).

Each step, running requests go first (in admission order): a request still prefilling gets
its next chunk, a decoding one one token. Then waiting requests are admitted first come,
first served while the token budget (``max_num_batched_tokens``) and ``max_num_seqs`` allow
and their prompt fits in memory: prefix lookup, pin the hits, take blocks for the rest.
Memory is one pool: running requests' blocks are pinned, everything else is the prefix
cache. A request holds ``ceil((input + g) / block_tokens)`` blocks when its next step
leaves ``g`` generated tokens (the replay runner's holding rule at the end). When a decode
needs a block and none can be freed, the most recently admitted request is preempted: its
blocks are released and it is recomputed later (prompt and tokens generated so far).

With tiers below GPU memory (:mod:`prefixlab.runner.engine.tiers`), an admitted request
also looks up the blocks past its GPU hit there; the ones found are loaded into its new
blocks and count as hits, and it waits (``LOADING``) until they are in, then prefills the
rest. Its computed blocks are offered to the write-through tiers as they are cached.

Tokens of a prompt, chunked (``B`` = budget left this step)::

    | hits (cached) | chunk 1 (<= B) | chunk 2 ... | -> first token at the end of the step
                                                     that finishes the prompt
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Hit, Miss, Observer
from prefixlab.cache.radix import RadixCache, RadixHandle
from prefixlab.errors import CapacityError
from prefixlab.policies.base import EvictionPolicy, Policy
from prefixlab.runner.engine.events import FirstToken, Preempted, Scheduled
from prefixlab.types import I64
from prefixlab.workload.trace import BlockLayout, Trace

if TYPE_CHECKING:
    from prefixlab.cache.events import MatchResult
    from prefixlab.runner.engine.hybrid import HybridEngineCache
    from prefixlab.runner.engine.swa_radix import SwaEngineCache
    from prefixlab.runner.engine.tiers import TierStack
    from prefixlab.runner.engine.windowed import WindowedBlockCache

WAITING, PREFILL, DECODE, DONE, LOADING = 1, 2, 3, 4, 5
_NO_SRC = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class Batch:
    """One step's work: prefill chunks ``(request, new tokens, cached tokens)`` and decode
    tokens ``(request, context tokens)``."""

    chunks: list[tuple[int, int, int]] = field(default_factory=list)
    decodes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c[1] for c in self.chunks) + len(self.decodes)


class Scheduler:
    """Owns the waiting queue, the running set and every request's KV blocks."""

    def __init__(
        self,
        trace: Trace,
        layout: BlockLayout,
        cache: BlockCache | RadixCache | HybridEngineCache | WindowedBlockCache | SwaEngineCache,
        policy: Policy,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
        observers: list[Observer],
        cache_while_running: bool = True,
    ) -> None:
        n = len(trace)
        #: a BlockCache, RadixCache or HybridEngineCache: the same protocol, own match types
        self.cache: Any = cache  # Any: three caches, one duck-typed protocol of verbs
        self.policy = policy
        self.layout = layout
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.chunked = chunked_prefill
        self.cache_while_running = cache_while_running
        self.observers = observers
        self.bt = layout.block_tokens
        self.input, self.output = trace.input_length.tolist(), trace.output_length.tolist()
        self.num_lookup = layout.num_lookup_blocks.tolist()
        self.lookup_end = layout.lookup_end_tokens.tolist()
        self.offs = layout.key_offsets.tolist()
        self.phase = [0] * n
        self.computed = [0] * n  # tokens whose KV exists (hits + chunks run)
        self.prompt_len = [0] * n  # tokens to prefill: input (+ generated, after preemption)
        self.generated = [0] * n
        self.blocks = [0] * n
        self.committed = [0] * n  # leading blocks whose keys are in the cache
        self.admit_hits = [0] * n  # hit tokens at the current admission
        num_keys = np.diff(layout.key_offsets).tolist()
        self.input_keys = [min(i // self.bt, k) for i, k in zip(self.input, num_keys, strict=True)]
        # Any: per structure: block ids, a RadixHandle, a HybridHandle (None: not running)
        self.handle: list[Any] = [None] * n
        self.first_hit_tokens = [-1] * n  # at the first admission (the metric)
        self.num_preemptions = [0] * n
        self.waiting, self.running = deque[int](), list[int]()  # running: in admission order
        self.preempted_this_step, self._lookahead = False, policy.uses_lookahead
        self.tiers: TierStack | None = None  # the tiers below GPU memory
        # when a LOADING request's loads end; its leading blocks offered to the tiers
        self.ready_s, self.offered = [0.0] * n, [0] * n
        self.tier_src: list[tuple[int, I64]] = [(0, _NO_SRC)] * n  # GPU hit, tier per load
        self.slides = hasattr(cache, "slide")  # it frees pages past a window (windowed.py)
        # SGLang's SWA cache (swa_radix.py): no lookahead token, token counts at inserts
        self.exact = bool(getattr(cache, "exact_slots", False))
        self.ahead = 0 if self.exact else 1

    # ------------------------------------------------------------------ helpers
    def blocks_needed(self, r: int, generated: int) -> int:
        tokens: int = self.input[r] + min(generated, self.output[r])
        blocks: int = -(-tokens // self.bt)
        return blocks

    def keys(self, r: int) -> np.ndarray:
        return self.layout.keys[self.offs[r] : self.offs[r + 1]]

    def _emit(self, event: object) -> None:
        for obs in self.observers:
            obs.on_event(event)  # type: ignore[arg-type]

    def add(self, r: int) -> None:
        need = self.blocks_needed(r, self.output[r])
        if need > self.cache.capacity_blocks:
            raise CapacityError(
                f"request {r} needs {need} blocks of {self.bt} tokens ({self.input[r]} input + "
                f"{self.output[r]} output tokens) but the pool holds "
                f"{self.cache.capacity_blocks}; raise the capacity"
            )
        self.phase[r] = WAITING
        self.waiting.append(r)

    # ------------------------------------------------------------------ one step
    def schedule(self, now: float) -> Batch | None:
        batch = Batch()
        budget = self.budget
        self.preempted_this_step = False
        self.cache.view.now = now
        if self.tiers is not None:
            self.tiers.now = now
        spare = getattr(self.cache, "spare_blocks", 0)
        if spare:  # SGLang: a free page per running request before each decode step
            decoding = [r for r in self.running if self.phase[r] == DECODE]
            if self.exact:  # maybe_evict_swa, then the decode allocation's eviction
                for r in decoding:
                    self._slide(r)
            if decoding:
                self.cache.keep_free(spare * len(decoding))
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            if self.phase[r] == LOADING:
                if self.ready_s[r] > now:
                    i += 1
                    continue
                self.phase[r] = PREFILL
            if self.slides and not self.exact:
                self._slide(r)
            if self.phase[r] == PREFILL:
                n = min(self.prompt_len[r] - self.computed[r], budget)
                if not self.chunked and n < self.prompt_len[r] - self.computed[r]:
                    i += 1
                    continue
                batch.chunks.append((r, n, self.computed[r]))
                budget -= n
            else:
                # Only a decode that crosses into a new block needs memory.
                g = min(self.generated[r] + self.ahead, self.output[r])
                full = self.input[r] + g > self.blocks[r] * self.bt
                if full and not self._ensure_blocks(r, self.generated[r] + self.ahead):
                    continue  # r itself was preempted: the list shifted
                batch.decodes.append((r, self.input[r] + self.generated[r]))
                budget -= 1
            i += 1
        if not self.preempted_this_step:
            budget = self._admit(now, batch, budget)
        return batch if (batch.chunks or batch.decodes) else None

    def _admit(self, now: float, batch: Batch, budget: int) -> int:
        if self._lookahead and isinstance(self.policy, EvictionPolicy):
            self.policy.on_waiting([self.keys(r)[: self.num_lookup[r]] for r in self.waiting])
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            keys = self.keys(r)
            nl = self.num_lookup[r]
            self.cache.view.request_index = r
            m = self.cache.match(keys[:nl], self.lookup_end[r])
            src, hit_blocks, hit_tokens = self._lower(r, m)
            prompt = self.input[r] + self.generated[r]
            rem = prompt - hit_tokens
            if not self.chunked and rem > budget and (batch.chunks or batch.decodes):
                break
            handle = self.cache.acquire(
                m, self.blocks_needed(r, self.generated[r] + self.ahead), keys[m.num_hit_blocks :]
            )
            if handle is None:
                break
            if self.tiers is None:  # the hybrid cache may drop a hit it cannot hold
                hit_blocks, hit_tokens = m.num_hit_blocks, m.num_hit_tokens
            rem = prompt - hit_tokens
            self.waiting.popleft()
            first = self.first_hit_tokens[r] < 0
            if first:
                self.first_hit_tokens[r] = hit_tokens
                self._emit(Hit(r, hit_blocks, hit_tokens))
                self._emit(
                    Miss(r, max(0, nl - hit_blocks), max(0, self.lookup_end[r] - hit_tokens))
                )
            self.handle[r] = handle
            self.blocks[r] = self.blocks_needed(r, self.generated[r] + self.ahead)
            self.committed[r] = m.num_hit_blocks
            self.admit_hits[r] = hit_tokens
            self.computed[r] = hit_tokens
            self.prompt_len[r] = prompt
            self.running.append(r)
            self._emit(Scheduled(r, now, hit_tokens))
            if self.tiers is not None and self._load(r, m, src, (rem, hit_tokens), first):
                self.phase[r] = LOADING
                continue
            self.phase[r] = PREFILL
            n = rem if not self.chunked else min(rem, budget)
            batch.chunks.append((r, n, hit_tokens))
            budget -= n
        return budget

    def _slide(self, r: int) -> None:
        """Before r's next step, as vLLM's ``remove_skipped_blocks`` at its allocation:
        the tokens whose KV exists (a decode computes the last generated token's)."""
        if self.phase[r] == PREFILL:
            done = self.computed[r]
        else:
            done = self.input[r] + self.generated[r] - 1
        self.cache.slide(self.handle[r], done, self.keys(r))

    def _lower(self, r: int, m: MatchResult) -> tuple[I64, int, int]:
        """The tier each block past the GPU hit would load from, and the hit (blocks,
        tokens) with them."""
        h, nl = m.num_hit_blocks, self.num_lookup[r]
        if self.tiers is None or h >= nl:
            return _NO_SRC, h, m.num_hit_tokens
        src = self.tiers.peek(self.keys(r)[h:nl])
        n = h + int(src.shape[0])
        return src, n, self._hit_tokens(r, n) if n > h else m.num_hit_tokens

    def _hit_tokens(self, r: int, num_blocks: int) -> int:
        end: int = self.lookup_end[r] if num_blocks == self.num_lookup[r] else num_blocks * self.bt
        return end

    def _load(self, r: int, m: MatchResult, src: I64, rest: tuple[int, int], first: bool) -> bool:
        """Read the blocks past the GPU hit from the tiers; True if r must wait for them."""
        assert self.tiers is not None
        h, t = m.num_hit_blocks, int(src.shape[0])
        self.tier_src[r] = (h, src)
        if not t:
            return False
        now = self.cache.view.now
        self.ready_s[r] = self.tiers.load(r, self.keys(r)[h : h + t], src, now, rest, h)
        if first:
            tokens = np.bincount(src, minlength=len(self.tiers.tiers)) * self.bt
            tokens[src[-1]] += self._hit_tokens(r, h + t) - (h + t) * self.bt
            self.tiers.hit_tokens[:, r] = tokens
            self.tiers.load_wait_s[r] = self.ready_s[r] - now
        waits: bool = self.ready_s[r] > now
        return waits

    def next_ready(self) -> float | None:
        """When the first LOADING request's blocks are in (None: none is loading)."""
        times = [self.ready_s[r] for r in self.running if self.phase[r] == LOADING]
        return min(times) if times else None

    def _ensure_blocks(self, r: int, generated: int) -> bool:
        """Grow r's blocks for its next token, preempting from the tail; False if r itself
        had to go."""
        more = self.blocks_needed(r, generated) - self.blocks[r]
        while more > 0:
            grown = self.cache.grow(self.handle[r], more)
            if grown is not None:
                self.handle[r] = grown
                self.blocks[r] += more
                return True
            victim = self.running[-1]
            self.preempt(victim)
            if victim == r:
                return False
        return True

    def preempt(self, r: int) -> None:
        self.cache.release(self.handle[r])
        self.handle[r] = None
        self.blocks[r] = 0
        self.computed[r] = 0
        self.phase[r] = WAITING
        self.running.remove(r)
        self.waiting.appendleft(r)
        self.num_preemptions[r] += 1
        self.preempted_this_step = True
        self._emit(Preempted(r, self.cache.view.now))

    # ------------------------------------------------------------------ completion
    def complete(self, batch: Batch, end_s: float) -> tuple[list[int], list[int]]:
        """Apply a finished step; returns (requests with a first token, finished requests)."""
        first: list[int] = []
        done: list[int] = []
        self.cache.view.now = end_s
        if self.tiers is not None:
            self.tiers.now = end_s
        for r, n, _ in batch.chunks:
            if self.phase[r] != PREFILL:
                continue  # preempted after being scheduled
            self.computed[r] += n
            if self.cache_while_running:
                self._cache_computed(r)
            if self.computed[r] < self.prompt_len[r]:
                continue
            if self.generated[r] == 0:
                first.append(r)
                self._emit(FirstToken(r, end_s))
            if self.output[r] > 0:
                self.generated[r] += 1
            self.phase[r] = DECODE
            if self.generated[r] >= self.output[r]:
                done.append(r)
        for r, _ in batch.decodes:
            if self.phase[r] != DECODE:
                continue
            self.generated[r] += 1
            if self.generated[r] >= self.output[r]:
                done.append(r)
        for r in done:
            self._finish(r)
        return first, done

    def _cache_computed(self, r: int) -> None:
        """Cache the prompt's blocks as soon as they are full (vLLM v1 does so after each
        step), so requests running at the same time share them."""
        if self.exact:
            self._checkpoint(r)
            return
        upto = min(self.computed[r], self.input[r]) // self.bt
        upto = min(upto, self.input_keys[r])
        if upto > self.committed[r]:
            self.cache.view.request_index = r
            self.cache.commit(self.handle[r], self.keys(r)[:upto], self.committed[r])
            self.committed[r] = upto
            self._offer(r, upto)

    def _checkpoint(self, r: int) -> None:
        """SGLang's checkpoint after every prefill chunk, with or without a new full
        page; none for a request that finishes at this step (its release inserts it)."""
        if self.computed[r] >= self.prompt_len[r] and self.generated[r] + 1 >= self.output[r]:
            return
        tokens = min(self.computed[r], self.input[r])
        upto = min(tokens // self.bt, self.input_keys[r])
        self.cache.view.request_index = r
        self.cache.commit(self.handle[r], self.keys(r)[:upto], self.committed[r], tokens=tokens)
        self.committed[r] = max(self.committed[r], upto)

    def _offer(self, r: int, upto: int) -> None:
        """Offer the request's blocks cached on the GPU up to ``upto`` to the tiers."""
        if self.tiers is not None and upto > self.offered[r]:
            now = self.cache.view.now
            h, src = self.tier_src[r]
            self.tiers.offer(r, self.keys(r), (self.offered[r], upto), (h, src), now)
            self.offered[r] = upto

    def _finish(self, r: int) -> None:
        self.cache.view.request_index = r
        handle = self.handle[r]
        if self.exact:  # the last sampled token has no KV
            tokens = self.input[r] + max(self.generated[r], 1) - 1
            self.cache.commit(handle, self.keys(r), self.committed[r], tokens=tokens, finished=True)
        else:
            self.cache.commit(handle, self.keys(r), self.committed[r])
        self._offer(r, int(self.keys(r).shape[0]))
        if self.tiers is not None:
            self.tiers.finish(r)
        self.cache.release(handle)
        self.handle[r] = None
        self.blocks[r] = 0
        self.phase[r] = DONE
        self.running.remove(r)

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        """Memory never over capacity; every running request holds exactly its blocks."""
        if isinstance(self.cache, BlockCache | RadixCache):
            self.cache.check()
        for r in self.running:
            # Between steps: a prefilling request holds room for its first token; a decoding
            # one for the tokens generated so far.
            g = self.generated[r] + self.ahead - (0 if self.phase[r] in (PREFILL, LOADING) else 1)
            if self.blocks[r] != self.blocks_needed(r, g):
                want = self.blocks_needed(r, g)
                raise AssertionError(f"request {r} holds {self.blocks[r]} blocks, not {want}")
        if not isinstance(self.cache, BlockCache | RadixCache):  # the hybrid adapter
            self.cache.check([self.handle[r] for r in self.running])
            return
        cap = self.cache.capacity_blocks
        if isinstance(self.cache, BlockCache):
            # Running requests share hit blocks: each physical block's ref count must equal
            # the number of running requests holding it, and no more blocks than exist.
            held = [h for h in (self.handle[r] for r in self.running) if isinstance(h, np.ndarray)]
            flat = np.concatenate(held) if held else np.zeros(0, dtype=np.int64)
            refs = np.bincount(flat, minlength=cap)
            if not np.array_equal(refs, self.cache.view.ref[:cap]):
                raise AssertionError("block ref counts differ from the running requests' holdings")
            if int(np.count_nonzero(refs)) > cap:
                raise AssertionError("running requests pin more blocks than the pool has")
        else:
            reserved = sum(
                h.reserved_blocks
                for h in (self.handle[r] for r in self.running)
                if isinstance(h, RadixHandle)
            )
            if reserved != self.cache.reserved_blocks:
                raise AssertionError(f"reserved pages {self.cache.reserved_blocks} != {reserved}")
            if self.cache.reserved_blocks + self.cache.tree_blocks > cap:
                raise AssertionError("tree pages + reserved pages exceed the capacity")
