"""Heterogeneous mixes (UniCache traces #1-#3): multi-turn sessions plus single-turn tasks.

``trace=1`` makes about 80% of the requests multi-turn, ``trace=2`` 50%, ``trace=3`` 20%
(``multi_turn_fraction`` overrides the preset). The multi-turn part is chat and agentic
sessions (``agentic_fraction`` of the sessions are agentic), built like the ``sessions``
generator: Poisson starts, log-normal gaps with the session's preset, shared system prompts
with Zipf popularity. The single-turn part is the four templated tasks of ``templated``,
arriving as a Poisson process over the same span. The request count is exact: sessions are
added until the multi-turn share is reached (the last one cut short).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.workload.arrivals import GAP_PRESETS
from prefixlab.workload.generators.base import (
    TokenSource,
    lognormal_lengths,
    param,
    register_generator,
    resolve_params,
    session_turns,
    zipf_weights,
)
from prefixlab.workload.generators.templated import TASKS, TemplatedParams, TemplatedTasks
from prefixlab.workload.trace import Request, Trace

MIX_PRESETS = {1: 0.8, 2: 0.5, 3: 0.2}


@dataclass(frozen=True, slots=True)
class MixParams:
    trace: int = param(1, 1, "UniCache trace: 1 (~80% multi-turn), 2 (50/50), 3 (~20%).")
    multi_turn_fraction: float | None = param(None, 0, "Share of multi-turn requests.")
    num_requests: int = param(3000, 1, "Requests to generate.")
    agentic_fraction: float = param(0.5, 0, "Share of sessions that are agentic.")
    session_rate_per_s: float = param(0.5, 0, "Poisson rate of session starts.", strict=True)
    mean_turns: float = param(5.0, 1, "Mean turns per session (geometric).")
    max_turns: int = param(40, 1, "Turns per session at most.")
    num_system_prompts: int = param(8, 1, "Shared system prompts of the sessions.")
    system_tokens: int = param(1024, 1, "Tokens of a session system prompt.")
    system_zipf: float = param(1.1, 0, "Zipf exponent of system prompt popularity.")
    mean_user_tokens: int = param(256, 1, "Mean tokens of a user turn.")
    mean_output_tokens: int = param(192, 1, "Mean tokens of a reply.")
    task_weights: str = param("", help="Single-turn task weights (see templated).")
    vocab_size: int = param(128_000, 2, "Token id range.")
    seed: int = param(0, 0, "Random seed.")

    def fraction(self) -> float:
        if self.multi_turn_fraction is not None:
            return float(self.multi_turn_fraction)
        return MIX_PRESETS[self.trace]

    def validate(self) -> None:
        if self.trace not in MIX_PRESETS:
            raise ConfigError(f"trace must be 1, 2 or 3, got {self.trace}")
        for name in ("multi_turn_fraction", "agentic_fraction"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v}")


def _sessions(
    p: MixParams, count: int, rng: np.random.Generator, tokens: TokenSource
) -> list[Request]:
    systems = [tokens.draw(p.system_tokens) for _ in range(p.num_system_prompts)]
    popularity = zipf_weights(p.num_system_prompts, p.system_zipf)
    out: list[Request] = []
    start = 0.0
    s = 0
    while len(out) < count:
        start += float(rng.exponential(1.0 / p.session_rate_per_s))
        preset = "agentic" if rng.random() < p.agentic_fraction else "chat"
        mu, sigma = GAP_PRESETS[preset]
        turns = min(p.max_turns, int(rng.geometric(1.0 / p.mean_turns)), count - len(out))
        user_lens = lognormal_lengths(rng, p.mean_user_tokens, turns)
        out_lens = lognormal_lengths(rng, p.mean_output_tokens, turns)
        gaps = rng.lognormal(mu, sigma, turns)
        history = systems[int(rng.choice(p.num_system_prompts, p=popularity))]
        out += session_turns(
            history, user_lens, out_lens, gaps, start, tokens.draw,
            session_id=f"s{s}", task=preset,
        )  # fmt: skip
        s += 1
    return out


@register_generator("mix", MixParams, "UniCache heterogeneous mixes #1-#3 (multi + single turn).")
def generate_mix(params: MixParams | None = None, **overrides: object) -> Trace:
    """A token-form trace mixing sessions and single-turn tasks, in arrival order."""
    p = resolve_params(MixParams, params, overrides, "mix")
    rng = np.random.default_rng(p.seed)
    tokens = TokenSource(p.seed, p.vocab_size)
    n_multi = round(p.fraction() * p.num_requests)
    requests = _sessions(p, n_multi, rng, tokens)
    n_single = p.num_requests - n_multi
    if n_single:
        single = TemplatedParams(task_weights=p.task_weights, vocab_size=p.vocab_size, seed=p.seed)
        tasks = TemplatedTasks(single, tokens)
        span = max((r.arrival_s for r in requests), default=0.0)
        if span <= 0.0:
            span = n_single / single.request_rate_per_s
        times = np.sort(rng.uniform(0.0, span, n_single))
        picks = rng.choice(len(TASKS), size=n_single, p=single.weights())
        requests += [
            tasks.request(TASKS[k], float(t), rng)
            for k, t in zip(picks.tolist(), times.tolist(), strict=True)
        ]
    requests.sort(key=lambda r: r.arrival_s)
    return Trace.from_requests(requests, name=f"mix{p.trace}-seed{p.seed}")
