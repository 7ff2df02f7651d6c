"""The random prompt pool of the hash-table prefix-caching report, seeded.

``num_requests`` requests (default 1000). Each, with probability ``p``, repeats one of
``pool_size`` frequent prompts (chosen uniformly, or with Zipf popularity ``pool_zipf``);
otherwise it is a fresh random prompt. Every prompt has ``prompt_tokens`` tokens (15), and
asks for ``output_tokens`` decode tokens. Requests arrive as a Poisson process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.workload.generators.base import (
    TokenSource,
    param,
    register_generator,
    resolve_params,
    zipf_weights,
)
from prefixlab.workload.trace import Request, Trace


@dataclass(frozen=True, slots=True)
class RandomPoolParams:
    num_requests: int = param(1000, 1, "Requests to generate.")
    p: float = param(0.5, 0, "Probability a request repeats a pooled prompt.")
    pool_size: int = param(10, 1, "Number of frequent prompts.")
    pool_zipf: float = param(0.0, 0, "Zipf exponent of pool popularity (0: uniform).")
    prompt_tokens: int = param(15, 1, "Tokens per prompt.")
    output_tokens: int = param(16, 0, "Decode tokens per request.")
    request_rate_per_s: float = param(10.0, 0, "Poisson arrival rate.", strict=True)
    output_ids: bool = param(
        True,
        help="Draw the output token ids; false: lengths only, so a prompt's trailing partial "
        "block can be cached and hit (the report's setting, with --cache-partial).",
    )
    vocab_size: int = param(32_000, 2, "Token id range.")
    seed: int = param(0, 0, "Random seed.")

    def validate(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ConfigError(f"p must be a probability in [0, 1], got {self.p}")


@register_generator(
    "random-pool", RandomPoolParams, "Pooled vs random prompts (hash-table report)."
)
def generate_random_pool(params: RandomPoolParams | None = None, **overrides: object) -> Trace:
    """Token-form requests; task ``pool`` or ``random`` says which kind each one is."""
    q = resolve_params(RandomPoolParams, params, overrides, "random-pool")
    rng = np.random.default_rng(q.seed)
    tokens = TokenSource(q.seed, q.vocab_size)
    pool = [tokens.draw(q.prompt_tokens) for _ in range(q.pool_size)]
    popularity = zipf_weights(q.pool_size, q.pool_zipf)
    times = np.cumsum(rng.exponential(1.0 / q.request_rate_per_s, q.num_requests))
    pooled = rng.random(q.num_requests) < q.p
    picks = rng.choice(q.pool_size, size=q.num_requests, p=popularity)
    requests = []
    for i in range(q.num_requests):
        prompt = pool[int(picks[i])] if pooled[i] else tokens.draw(q.prompt_tokens)
        requests.append(
            Request(
                arrival_s=float(times[i]),
                input_length=q.prompt_tokens,
                output_length=q.output_tokens,
                task="pool" if pooled[i] else "random",
                input_tokens=prompt,
                output_tokens=tokens.draw(q.output_tokens) if q.output_ids else None,
            )
        )
    return Trace.from_requests(requests, name=f"random-pool-p{q.p}-seed{q.seed}")
