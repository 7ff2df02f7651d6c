"""Single-turn templated tasks (UniCache, Table 3), seeded.

Four tasks, each with its own system prompt and, but for ``untemplated``, a pool of
``templates_per_task`` templates drawn with Zipf popularity (exponent ``template_zipf``):

================  =====================================================================
task              prompt
================  =====================================================================
``untemplated``   system + query
``programming``   system + program description (template) + query
``tool-use``      system + tool description (template) + query
``document-qa``   system + document (template) + query
================  =====================================================================

The query is unique to the request (log-normal length, mean ``query_tokens``); the
template lengths are log-normal around ``program_tokens``, ``tool_tokens`` and
``document_tokens``. Decode lengths are log-normal with mean ``output_tokens``. Requests
arrive as a Poisson process (``request_rate_per_s``); each picks its task by
``task_weights`` (comma-separated, one per task in the order above; empty: equal).

``arrivals_from`` names an Azure LLM inference CSV (content-free): its first
``num_requests`` rows then give the arrival times, prompt lengths (the query is sized so the
prompt has the row's ``ContextTokens``; a row shorter than its task's system prompt and
template keeps them plus one query token) and decode lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.types import I64
from prefixlab.workload.generators.base import (
    TokenSource,
    lognormal_lengths,
    param,
    register_generator,
    resolve_params,
    zipf_weights,
)
from prefixlab.workload.trace import Request, Trace

TASKS = ("untemplated", "programming", "tool-use", "document-qa")


@dataclass(frozen=True, slots=True)
class TemplatedParams:
    num_requests: int = param(2000, 1, "Requests to generate.")
    request_rate_per_s: float = param(4.0, 0, "Poisson arrival rate.", strict=True)
    task_weights: str = param("", help="Weights of untemplated,programming,tool-use,document-qa.")
    system_tokens: int = param(512, 1, "Tokens of each task's system prompt.")
    system_tokens_per_task: str = param(
        "", help="Per-task system prompt tokens, e.g. 'untemplated:8,tool-use:300' (0: none)."
    )
    templates_per_task: int = param(50, 1, "Template pool size of each templated task.")
    template_zipf: float = param(1.0, 0, "Zipf exponent of template popularity.")
    query_tokens: int = param(64, 1, "Mean tokens of the unique query.")
    program_tokens: int = param(1024, 1, "Mean tokens of a program description.")
    tool_tokens: int = param(1536, 1, "Mean tokens of a tool description.")
    document_tokens: int = param(3072, 1, "Mean tokens of a document.")
    output_tokens: int = param(256, 1, "Mean decode tokens.")
    vocab_size: int = param(128_000, 2, "Token id range.")
    arrivals_from: str = param("", help="Azure CSV: take arrivals and lengths from it.")
    seed: int = param(0, 0, "Random seed.")

    def weights(self) -> npt.NDArray[np.float64]:
        if not self.task_weights.strip():
            return np.full(len(TASKS), 1.0 / len(TASKS))
        try:
            w = np.array([float(x) for x in self.task_weights.split(",")], dtype=np.float64)
        except ValueError:
            raise ConfigError(
                f"task_weights must be {len(TASKS)} comma-separated numbers, got "
                f"{self.task_weights!r}"
            ) from None
        if w.shape[0] != len(TASKS) or not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
            raise ConfigError(
                f"task_weights needs {len(TASKS)} non-negative weights ({', '.join(TASKS)}) "
                f"with a positive sum, got {self.task_weights!r}"
            )
        out: npt.NDArray[np.float64] = w / w.sum()
        return out

    def system_lengths(self) -> dict[str, int]:
        """Each task's system prompt length: ``system_tokens`` unless overridden."""
        out = dict.fromkeys(TASKS, self.system_tokens)
        for item in filter(None, (x.strip() for x in self.system_tokens_per_task.split(","))):
            task, sep, n = (part.strip() for part in item.partition(":"))
            if not sep or task not in out or not n.isdigit():
                raise ConfigError(
                    f"system_tokens_per_task: expected TASK:TOKENS items separated by ',' "
                    f"(TASK one of {', '.join(TASKS)}, TOKENS >= 0), got {item!r}"
                )
            out[task] = int(n)
        return out

    def validate(self) -> None:
        self.weights()
        self.system_lengths()


class TemplatedTasks:
    """The fixed content of the four tasks; draws requests from them."""

    def __init__(self, p: TemplatedParams, tokens: TokenSource) -> None:
        self.p = p
        self.tokens = tokens
        self.system = {t: tokens.draw(n) for t, n in p.system_lengths().items()}
        means = {
            "programming": p.program_tokens,
            "tool-use": p.tool_tokens,
            "document-qa": p.document_tokens,
        }
        lengths_rng = np.random.default_rng([p.seed, 0x7E])
        self.templates: dict[str, list[I64]] = {
            t: [
                tokens.draw(n)
                for n in lognormal_lengths(lengths_rng, m, p.templates_per_task).tolist()
            ]
            for t, m in means.items()
        }
        self.popularity = zipf_weights(p.templates_per_task, p.template_zipf)

    def request(
        self,
        task: str,
        arrival_s: float,
        rng: np.random.Generator,
        input_length: int | None = None,
        output_length: int | None = None,
    ) -> Request:
        """One request; given lengths (a real trace's) set the query and decode lengths."""
        parts = [self.system[task]]
        if task != "untemplated":
            pick = int(rng.choice(len(self.popularity), p=self.popularity))
            parts.append(self.templates[task][pick])
        query = int(lognormal_lengths(rng, self.p.query_tokens, 1)[0])
        decode = int(lognormal_lengths(rng, self.p.output_tokens, 1)[0])
        if input_length is not None:
            query = max(1, input_length - sum(int(x.shape[0]) for x in parts))
        if output_length is not None:
            decode = output_length
        parts.append(self.tokens.draw(query))
        prompt = np.concatenate(parts)
        out = self.tokens.draw(decode)
        return Request(
            arrival_s=arrival_s,
            input_length=int(prompt.shape[0]),
            output_length=int(out.shape[0]),
            task=task,
            input_tokens=prompt,
            output_tokens=out,
        )


@register_generator("templated", TemplatedParams, "Single-turn templated tasks (UniCache Table 3).")
def generate_templated(params: TemplatedParams | None = None, **overrides: object) -> Trace:
    """A token-form trace of single-turn requests over the four tasks, in arrival order."""
    p = resolve_params(TemplatedParams, params, overrides, "templated")
    rng = np.random.default_rng(p.seed)
    tasks = TemplatedTasks(p, TokenSource(p.seed, p.vocab_size))
    n = p.num_requests
    lengths: list[tuple[int | None, int | None]] = [(None, None)] * n
    if p.arrivals_from:
        # Arrivals and lengths from a real trace that has no content (Azure): the content
        # is ours, its timing and sizes theirs (the query absorbs the length difference).
        from prefixlab.workload.loaders import load_trace

        real = load_trace(p.arrivals_from, "azure", limit=n)
        n = len(real)
        times = real.arrival_s
        lengths = list(zip(real.input_length.tolist(), real.output_length.tolist(), strict=True))
    else:
        times = np.cumsum(rng.exponential(1.0 / p.request_rate_per_s, n))
    picks = rng.choice(len(TASKS), size=n, p=p.weights())
    requests = [
        tasks.request(TASKS[k], float(t), rng, *lengths[i])
        for i, (k, t) in enumerate(zip(picks.tolist(), times.tolist(), strict=True))
    ]
    return Trace.from_requests(requests, name=f"templated-seed{p.seed}")
