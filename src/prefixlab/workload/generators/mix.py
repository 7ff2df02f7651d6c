"""Heterogeneous mixes (UniCache traces #1-#3): multi-turn sessions plus single-turn tasks.

``trace=1`` makes about 80% of the requests multi-turn, ``trace=2`` 50%, ``trace=3`` 20%
(``multi_turn_fraction`` overrides the preset). The multi-turn part is chat and agentic
sessions (``agentic_fraction`` of the sessions are agentic), built like the ``sessions``
generator: log-normal gaps from one turn's arrival to the next with the session's preset
(the paper's fits, Sec. 6.1), system prompts with Zipf popularity drawn from one pool
(``system_pool=shared``) or one pool per task (``per-task``; ``system_tokens=0``: none).
The single-turn part is the four templated tasks of ``templated`` (its parameters as
``templates_per_task``, ``template_zipf``, ``single_system_tokens`` and the ``*_tokens``
lengths). The request count is exact: sessions are added until the multi-turn share is
reached (the last one cut short).

Time: with ``duration_s`` (UniCache Sec. 6.1: Poisson session starts, "each trace spans
approximately one hour"), the session starts and the single-turn arrivals are uniform over
``[0, duration_s)`` -- a Poisson process given its count; without it sessions start at
``session_rate_per_s`` and the single-turn requests spread over the span that makes.
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
    duration_s: float | None = param(
        None, 0, "Trace span: starts and single-turn arrivals Poisson over it.", strict=True
    )
    num_system_prompts: int = param(8, 1, "System prompts of the sessions (per pool).")
    system_tokens: int = param(1024, 0, "Tokens of a session system prompt (0: none).")
    system_zipf: float = param(1.1, 0, "Zipf exponent of system prompt popularity.")
    system_pool: str = param("shared", help="Session prompts: 'shared' or 'per-task' pools.")
    mean_user_tokens: int = param(256, 1, "Mean tokens of a user turn.")
    mean_output_tokens: int = param(192, 1, "Mean tokens of a reply.")
    task_weights: str = param("", help="Single-turn task weights (see templated).")
    templates_per_task: int = param(50, 1, "Single-turn template pool size per task.")
    template_zipf: float = param(1.0, 0, "Zipf exponent of template popularity.")
    single_system_tokens: int = param(512, 1, "Tokens of a single-turn system prompt.")
    single_system_tokens_per_task: str = param(
        "", help="Per-task single-turn system tokens, e.g. 'untemplated:8' (see templated)."
    )
    query_tokens: int = param(64, 1, "Mean tokens of a single-turn query.")
    program_tokens: int = param(1024, 1, "Mean tokens of a program description.")
    tool_tokens: int = param(1536, 1, "Mean tokens of a tool description.")
    document_tokens: int = param(3072, 1, "Mean tokens of a document.")
    single_output_tokens: int = param(256, 1, "Mean decode tokens of a single-turn request.")
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
        if self.system_pool not in ("shared", "per-task"):
            raise ConfigError(
                f"system_pool must be 'shared' or 'per-task', got {self.system_pool!r}"
            )
        self.single().validate()

    def single(self) -> TemplatedParams:
        """The single-turn part's parameters."""
        return TemplatedParams(
            task_weights=self.task_weights,
            vocab_size=self.vocab_size,
            seed=self.seed,
            system_tokens=self.single_system_tokens,
            system_tokens_per_task=self.single_system_tokens_per_task,
            templates_per_task=self.templates_per_task,
            template_zipf=self.template_zipf,
            query_tokens=self.query_tokens,
            program_tokens=self.program_tokens,
            tool_tokens=self.tool_tokens,
            document_tokens=self.document_tokens,
            output_tokens=self.single_output_tokens,
        )


def _sessions(
    p: MixParams, count: int, rng: np.random.Generator, tokens: TokenSource
) -> list[Request]:
    pools = ("shared",) if p.system_pool == "shared" else ("chat", "agentic")
    systems = {
        pool: [tokens.draw(p.system_tokens) for _ in range(p.num_system_prompts)] for pool in pools
    }
    popularity = zipf_weights(p.num_system_prompts, p.system_zipf)
    plan: list[int] = []  # turns per session, drawn first when the starts are spread
    starts: list[float] = []
    if p.duration_s is not None:
        prng = np.random.default_rng([p.seed, 0x5E55])
        while sum(plan) < count:
            plan.append(
                min(p.max_turns, int(prng.geometric(1.0 / p.mean_turns)), count - sum(plan))
            )
        starts = np.sort(prng.uniform(0.0, p.duration_s, len(plan))).tolist()
    out: list[Request] = []
    start = 0.0
    s = 0
    while len(out) < count:
        if plan:
            start = starts[s]
        else:
            start += float(rng.exponential(1.0 / p.session_rate_per_s))
        preset = "agentic" if rng.random() < p.agentic_fraction else "chat"
        mu, sigma = GAP_PRESETS[preset]
        if plan:
            turns = plan[s]
        else:
            turns = min(p.max_turns, int(rng.geometric(1.0 / p.mean_turns)), count - len(out))
        user_lens = lognormal_lengths(rng, p.mean_user_tokens, turns)
        out_lens = lognormal_lengths(rng, p.mean_output_tokens, turns)
        gaps = rng.lognormal(mu, sigma, turns)
        pool = systems["shared" if p.system_pool == "shared" else preset]
        history = pool[int(rng.choice(p.num_system_prompts, p=popularity))]
        out += session_turns(
            history,
            user_lens,
            out_lens,
            gaps,
            start,
            tokens.draw,
            session_id=f"s{s}",
            task=preset,
        )
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
        single = p.single()
        tasks = TemplatedTasks(single, tokens)
        span = max((r.arrival_s for r in requests), default=0.0)
        if p.duration_s is not None:
            span = p.duration_s
        elif span <= 0.0:
            span = n_single / single.request_rate_per_s
        times = np.sort(rng.uniform(0.0, span, n_single))
        picks = rng.choice(len(TASKS), size=n_single, p=single.weights())
        requests += [
            tasks.request(TASKS[k], float(t), rng)
            for k, t in zip(picks.tolist(), times.tolist(), strict=True)
        ]
    requests.sort(key=lambda r: r.arrival_s)
    return Trace.from_requests(requests, name=f"mix{p.trace}-seed{p.seed}")
