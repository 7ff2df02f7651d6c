"""Turn chat transcripts (text) into token-form requests, in batches.

A :class:`ChatSession` is a list of messages plus its LLM calls: call k's prompt is messages
``[prompt_start, prompt_end)`` (``prompt_start`` is usually 0) and its output is message
``output`` (or nothing). Each message is
rendered as ``<|role|>\\n{text}\\n`` and tokenised once; a prompt is the concatenation of its
messages' tokens, so a later call repeats an earlier call's prompt and output token for token,
as a serving engine sees it. Sessions are tokenised a chunk at a time with one batch call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.workload.arrivals import ArrivalModel, make_arrivals
from prefixlab.workload.loaders.base import Header
from prefixlab.workload.tokenizers import Tokenizer, as_tokenizer
from prefixlab.workload.trace import Request

CHUNK_SESSIONS = 128


@dataclass(slots=True)
class Call:
    prompt_end: int
    output: int | None
    prompt_text: str | None = None
    #: known think time before this call (e.g. a tool's measured execution time)
    gap_s: float | None = None
    #: first message of the prompt (sessions whose calls do not share one message list)
    prompt_start: int = 0


@dataclass(slots=True)
class ChatSession:
    session_id: str
    task: str
    messages: list[tuple[str, str]] = field(default_factory=list)  # (role, text)
    calls: list[Call] = field(default_factory=list)


def seeded_rng(seed: object) -> np.random.Generator:
    """The loader's random stream; a bad seed is a ConfigError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    return np.random.default_rng(seed)


def render(role: str, text: str) -> str:
    return f"<|{role}|>\n{text}\n"


def chat_stream(
    sessions: Iterable[ChatSession], tokenizer: str | Tokenizer, arrival: str, seed: object
) -> Iterator[Request | Header]:
    """What a text loader yields: a header (rows come session by session, with synthesised
    times: sort them) and the requests of ``sessions`` (options checked before any read)."""
    tok = as_tokenizer(tokenizer)
    model = make_arrivals(arrival)
    rng = seeded_rng(seed)
    yield Header(sort_by_arrival=True)
    yield from chat_requests(sessions, tok, model, rng)


def chat_requests(
    sessions: Iterable[ChatSession],
    tokenizer: Tokenizer,
    arrivals: ArrivalModel,
    rng: np.random.Generator,
) -> Iterator[Request]:
    """Requests of every call of every session, session by session (not time-sorted)."""
    chunk: list[ChatSession] = []
    for s in sessions:
        s.calls = [c for c in s.calls if c.prompt_end > c.prompt_start]
        if s.calls:
            chunk.append(s)
        if len(chunk) >= CHUNK_SESSIONS:
            yield from _chunk_requests(chunk, tokenizer, arrivals, rng)
            chunk = []
    if chunk:
        yield from _chunk_requests(chunk, tokenizer, arrivals, rng)


def _chunk_requests(
    chunk: list[ChatSession], tokenizer: Tokenizer, arrivals: ArrivalModel, rng: np.random.Generator
) -> Iterator[Request]:
    texts = [render(role, text) for s in chunk for role, text in s.messages]
    ids, offsets = tokenizer.encode_batch(texts)
    base = 0
    for s in chunk:
        m = len(s.messages)
        msg_offs = offsets[base : base + m + 1]
        out_tokens = sum(
            int(msg_offs[c.output + 1] - msg_offs[c.output])
            for c in s.calls
            if c.output is not None
        )
        times, gaps = arrivals.schedule(len(s.calls), rng, [c.gap_s for c in s.calls], out_tokens)
        thinks = arrivals.think_times(gaps)
        for k, call in enumerate(s.calls):
            prompt = ids[int(msg_offs[call.prompt_start]) : int(msg_offs[call.prompt_end])]
            out = (
                ids[int(msg_offs[call.output]) : int(msg_offs[call.output + 1])]
                if call.output is not None
                else ids[:0]
            )
            yield Request(
                arrival_s=float(times[k]),
                input_length=int(prompt.shape[0]),
                output_length=int(out.shape[0]),
                session_id=s.session_id,
                turn=k,
                task=s.task,
                input_tokens=prompt,
                output_tokens=out,
                prompt_text=call.prompt_text,
                reply_text=s.messages[call.output][1] if call.output is not None else None,
                think_s=thinks[k],
            )
        base += m
