"""Hit-ratio metrics, computed only from events (DESIGN §5).

token hit ratio   = sum of prefill tokens served from cache / sum of input tokens
request hit ratio = requests with at least one hit block / requests
block hit ratio   = hit lookup blocks / lookup blocks
All cold misses are included.
"""

from __future__ import annotations

import numpy as np

from prefixlab.cache.events import Admitted, Event, Hit, Miss, Rejected, Removed
from prefixlab.types import I64


class ReplayMetrics:
    """Accumulates per-request hits and cache evictions from events."""

    def __init__(self, num_requests: int) -> None:
        self.hit_tokens: I64 = np.zeros(num_requests, dtype=np.int64)
        self.hit_blocks: I64 = np.zeros(num_requests, dtype=np.int64)
        self.miss_blocks: I64 = np.zeros(num_requests, dtype=np.int64)
        self.num_evictions = 0
        #: blocks an admission let into the cache, and those it refused
        self.num_admitted_blocks = 0
        self.num_rejected_blocks = 0

    def on_event(self, event: Event) -> None:
        if isinstance(event, Hit):
            self.hit_tokens[event.request] = event.num_tokens
            self.hit_blocks[event.request] = event.num_blocks
        elif isinstance(event, Miss):
            self.miss_blocks[event.request] = event.num_blocks
        elif isinstance(event, Removed) and event.evicted:
            self.num_evictions += int(event.keys.shape[0])
        elif isinstance(event, Admitted):
            self.num_admitted_blocks += int(event.keys.shape[0])
        elif isinstance(event, Rejected):
            self.num_rejected_blocks += int(event.keys.shape[0])

    def summary(self, input_tokens: I64) -> dict[str, float | int]:
        return hit_summary(
            num_requests=int(input_tokens.shape[0]),
            num_input_tokens=int(input_tokens.sum()),
            num_hit_tokens=int(self.hit_tokens.sum()),
            num_requests_hit=int(np.count_nonzero(self.hit_blocks)),
            num_lookup_blocks=int(self.hit_blocks.sum() + self.miss_blocks.sum()),
            num_hit_blocks=int(self.hit_blocks.sum()),
            num_evictions=self.num_evictions,
        )


def hit_summary(
    *,
    num_requests: int,
    num_input_tokens: int,
    num_hit_tokens: int,
    num_requests_hit: int,
    num_lookup_blocks: int,
    num_hit_blocks: int,
    num_evictions: int,
) -> dict[str, float | int]:
    """The replay's summary from its totals (a streamed replay keeps only these)."""
    n, num_input, lookups = num_requests, num_input_tokens, num_lookup_blocks
    return {
        "num_requests": n,
        "num_input_tokens": num_input,
        "num_hit_tokens": num_hit_tokens,
        "token_hit_ratio": num_hit_tokens / num_input if num_input else 0.0,
        "request_hit_ratio": num_requests_hit / n if n else 0.0,
        "num_lookup_blocks": lookups,
        "num_hit_blocks": num_hit_blocks,
        "block_hit_ratio": num_hit_blocks / lookups if lookups else 0.0,
        "num_evictions": num_evictions,
    }
