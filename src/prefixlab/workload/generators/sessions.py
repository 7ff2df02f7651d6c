"""Multi-turn session workloads (UniCache-style), seeded.

Sessions start as a Poisson process (``session_rate_per_s``). Every session opens with one of
``num_system_prompts`` shared system prompts (Zipf popularity, exponent ``system_zipf``), then
alternates user turns and assistant replies. Turn k's input is the whole history so far plus
the new user message; its output is the reply, which the next turn's input repeats::

    turn 0 input: [system][user0]                   output: [reply0]
    turn 1 input: [system][user0][reply0][user1]    output: [reply1]

Inter-turn gaps are log-normal (``gap_mu``, ``gap_sigma``, in log-seconds; presets ``chat``
mu=4.15 sigma=0.971 and ``agentic`` mu=1.81 sigma=1.092 from the UniCache paper). Open loop
(default), gaps run from the previous turn's arrival. Closed loop (``closed_loop=True``),
every later turn also records its gap as ``think_s``, which the engine runner counts from
the completion of the previous response; ``arrival_s`` then holds the open-loop times. Token
ids are random draws, so distinct content never collides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.workload.arrivals import GAP_PRESETS
from prefixlab.workload.generators.base import (
    lognormal_lengths,
    param,
    register_generator,
    resolve_params,
    session_turns,
)
from prefixlab.workload.trace import Request, Trace


@dataclass(slots=True, frozen=True)
class SessionParams:
    """Parameters of :func:`generate_sessions` (names as in the UniCache paper)."""

    num_sessions: int = param(200, 1, "Sessions to generate.")
    session_rate_per_s: float = param(1.0, 0, "Poisson rate of session starts.", True)
    mean_turns: float = param(5.0, 1, "Mean turns per session (geometric).")
    max_turns: int = param(40, 1, "Turns per session at most.")
    num_system_prompts: int = param(8, 1, "Shared system prompts.")
    system_tokens: int = param(1024, 1, "Tokens of a system prompt.")
    system_zipf: float = param(1.1, 0, "Zipf exponent of system prompt popularity.", True)
    mean_user_tokens: int = param(256, 1, "Mean tokens of a user turn.")
    mean_output_tokens: int = param(192, 1, "Mean tokens of a reply.")
    preset: str = param("chat", help="Gap preset: chat (4.15, 0.971) or agentic (1.81, 1.092).")
    gap_mu: float | None = param(None, help="Log-normal gap mu (overrides the preset).")
    gap_sigma: float | None = param(None, 0, "Log-normal gap sigma (overrides the preset).", True)
    vocab_size: int = param(128_000, 2, "Token id range.")
    closed_loop: bool = param(False, help="Record think times for the engine's closed loop.")
    seed: int = param(0, 0, "Random seed.")

    def validate(self) -> None:
        """What :func:`~prefixlab.workload.generators.base.check_params` cannot see."""
        if self.preset not in GAP_PRESETS:
            raise ConfigError(
                f"preset '{self.preset}' unknown; choose one of {', '.join(GAP_PRESETS)}"
            )


@register_generator("sessions", SessionParams, "Multi-turn chat/agentic sessions (UniCache).")
def generate_sessions(params: SessionParams | None = None, **overrides: object) -> Trace:
    """Generate a token-form multi-turn trace, sorted by arrival time."""
    p = resolve_params(SessionParams, params, overrides, "sessions")
    mu, sigma = GAP_PRESETS[p.preset]
    mu = p.gap_mu if p.gap_mu is not None else mu
    sigma = p.gap_sigma if p.gap_sigma is not None else sigma
    rng = np.random.default_rng(p.seed)
    systems = [rng.integers(0, p.vocab_size, p.system_tokens) for _ in range(p.num_system_prompts)]
    ranks = np.arange(1, p.num_system_prompts + 1, dtype=np.float64)
    popularity = ranks**-p.system_zipf
    popularity /= popularity.sum()
    starts = np.cumsum(rng.exponential(1.0 / p.session_rate_per_s, p.num_sessions))
    requests: list[Request] = []
    for s in range(p.num_sessions):
        num_turns = min(p.max_turns, int(rng.geometric(1.0 / p.mean_turns)))
        user_lens = lognormal_lengths(rng, p.mean_user_tokens, num_turns)
        out_lens = lognormal_lengths(rng, p.mean_output_tokens, num_turns)
        gaps = rng.lognormal(mu, sigma, num_turns)
        history = systems[int(rng.choice(p.num_system_prompts, p=popularity))]
        requests += session_turns(
            history,
            user_lens,
            out_lens,
            gaps,
            float(starts[s]),
            lambda n: rng.integers(0, p.vocab_size, n),
            session_id=f"s{s}",
            task=p.preset,
            closed_loop=p.closed_loop,
        )
    requests.sort(key=lambda r: r.arrival_s)
    return Trace.from_requests(requests, name=f"sessions-{p.preset}-seed{p.seed}")
