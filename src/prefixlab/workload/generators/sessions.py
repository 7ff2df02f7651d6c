"""Multi-turn session workloads (UniCache-style), seeded.

Sessions start as a Poisson process (``session_rate_per_s``). Every session opens with one of
``num_system_prompts`` shared system prompts (Zipf popularity, exponent ``system_zipf``), then
alternates user turns and assistant replies. Turn k's input is the whole history so far plus
the new user message; its output is the reply, which the next turn's input repeats::

    turn 0 input: [system][user0]                   output: [reply0]
    turn 1 input: [system][user0][reply0][user1]    output: [reply1]

Inter-turn gaps are log-normal (``gap_mu``, ``gap_sigma``, in seconds; presets ``chat``
mu=4.15 sigma=0.971 and ``agentic`` mu=1.81 sigma=1.092 from the UniCache paper). Gaps run
from the previous turn's arrival (open loop). Token ids are random draws, so distinct
content never collides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.workload.trace import Request, Trace

GAP_PRESETS = {"chat": (4.15, 0.971), "agentic": (1.81, 1.092)}


@dataclass(slots=True, frozen=True)
class SessionParams:
    """Parameters of :func:`generate_sessions` (names as in the UniCache paper)."""

    num_sessions: int = 200
    session_rate_per_s: float = 1.0
    mean_turns: float = 5.0
    max_turns: int = 40
    num_system_prompts: int = 8
    system_tokens: int = 1024
    system_zipf: float = 1.1
    mean_user_tokens: int = 256
    mean_output_tokens: int = 192
    preset: str = "chat"
    gap_mu: float | None = None
    gap_sigma: float | None = None
    vocab_size: int = 128_000
    seed: int = 0

    def validate(self) -> None:
        """Types and ranges, each error naming the parameter."""
        if self.preset not in GAP_PRESETS:
            raise ConfigError(
                f"preset '{self.preset}' unknown; choose one of {', '.join(GAP_PRESETS)}"
            )
        ints = {
            "num_sessions": 1,
            "max_turns": 1,
            "num_system_prompts": 1,
            "vocab_size": 2,
            "system_tokens": 1,
            "mean_user_tokens": 1,
            "mean_output_tokens": 1,
            "seed": 0,
        }
        floats = {"session_rate_per_s": 0.0, "mean_turns": 1.0, "system_zipf": 0.0}
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {v!r}")
        for name, low_f in floats.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= low_f:
                raise ConfigError(f"{name} must be a number >= {low_f}, got {v!r}")
        if self.session_rate_per_s == 0 or self.system_zipf == 0:
            raise ConfigError("session_rate_per_s and system_zipf must be positive")
        for name in ("gap_mu", "gap_sigma"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ConfigError(f"{name} must be a number, got {v!r}")
        if self.gap_sigma is not None and not self.gap_sigma > 0:
            raise ConfigError(f"gap_sigma must be positive, got {self.gap_sigma!r}")


def _lengths(rng: np.random.Generator, mean: int, n: int) -> list[int]:
    # Log-normal lengths with the given mean and a moderate spread (sigma 0.6).
    sigma = 0.6
    mu = np.log(mean) - sigma**2 / 2
    out: list[int] = np.maximum(1, rng.lognormal(mu, sigma, n).round()).astype(int).tolist()
    return out


def generate_sessions(params: SessionParams | None = None, **overrides: object) -> Trace:
    """Generate a token-form multi-turn trace, sorted by arrival time."""
    p = params or SessionParams()
    if overrides:
        fields = set(SessionParams.__dataclass_fields__)
        bad = [k for k in overrides if k not in fields]
        if bad:
            raise ConfigError(f"sessions generator has no parameter {bad[0]!r}")
        p = SessionParams(**{**{f: getattr(p, f) for f in fields}, **overrides})
    p.validate()
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
        user_lens = _lengths(rng, p.mean_user_tokens, num_turns)
        out_lens = _lengths(rng, p.mean_output_tokens, num_turns)
        gaps = rng.lognormal(mu, sigma, num_turns)
        history = systems[int(rng.choice(p.num_system_prompts, p=popularity))]
        t = float(starts[s])
        for k in range(num_turns):
            user = rng.integers(0, p.vocab_size, user_lens[k])
            reply = rng.integers(0, p.vocab_size, out_lens[k])
            prompt = np.concatenate([history, user])
            requests.append(
                Request(
                    arrival_s=t,
                    input_length=int(prompt.shape[0]),
                    output_length=int(reply.shape[0]),
                    session_id=f"s{s}",
                    turn=k,
                    task=p.preset,
                    input_tokens=prompt,
                    output_tokens=reply,
                )
            )
            history = np.concatenate([prompt, reply])
            t += float(gaps[k])
    requests.sort(key=lambda r: r.arrival_s)
    return Trace.from_requests(requests, name=f"sessions-{p.preset}-seed{p.seed}")
