"""Conversation JSON loader: ShareGPT, LMSys-Chat-1M, Chatbot-Arena and OpenAI-style dumps.

The file is a JSON array of conversations, JSON Lines (one per line), or a single one. A
conversation is a list of turns ``{from|role, value|content}``, either bare or under one of
``conversations`` (ShareGPT), ``conversation`` (LMSys-Chat), ``conversation_a`` (Chatbot
Arena; ``side=b`` reads ``conversation_b``) or ``messages`` (OpenAI). Roles ``human``/``user``
and ``gpt``/``assistant``/``chatgpt``/``bard``/``model`` are normalised; ``system`` and tool
turns stay as context. Its id is ``id``, ``conversation_id`` or ``question_id`` (else its
position).

Each user turn becomes a request: its input is the whole history so far (every earlier turn,
assistant replies included) plus the new message; its output is the assistant reply that
follows (none when the conversation ends on the user). The user message is kept as
``prompt_text`` (LPC's predictor reads it). Texts are tokenised in batches with the chosen
tokenizer; arrival times come from the chosen arrival model (the dumps carry none that mean
serving time).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.workload.arrivals import make_arrivals
from prefixlab.workload.loaders._chat import Call, ChatSession, chat_requests
from prefixlab.workload.loaders._jsonstream import iter_json_records
from prefixlab.workload.loaders.base import Header, register_loader
from prefixlab.workload.tokenizers import DEFAULT_TOKENIZER, Tokenizer, as_tokenizer
from prefixlab.workload.trace import Request

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
CONTAINERS = ("conversations", "conversation", "messages")
ID_FIELDS = ("id", "conversation_id", "question_id")


def message_text(content: Any) -> str | None:
    """A turn's text: a string, or the text parts of an OpenAI-style content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if all(isinstance(t, str) for t in parts):
            return "\n".join(t for t in parts if t is not None)
    return None


def _turns(path: Path, line: int, record: Any, side: str) -> tuple[str | None, list[Any], str]:
    """The id, the raw turn list and the field it came from."""
    if isinstance(record, list):
        return None, record, "conversation"
    if not isinstance(record, dict):
        raise TraceFormatError(str(path), line, None, "expected a conversation (object or list)")
    conv_id = next((str(record[k]) for k in ID_FIELDS if record.get(k) is not None), None)
    keys = (f"conversation_{side}", *CONTAINERS) if side else CONTAINERS
    for key in keys:
        if key in record:
            turns = record[key]
            if not isinstance(turns, list):
                raise TraceFormatError(str(path), line, key, "expected a list of turns")
            return conv_id, turns, key
    raise TraceFormatError(
        str(path), line, "conversations", f"no turn list (looked for {', '.join(keys)})"
    )


def parse_conversation(
    path: Path, line: int, index: int, record: Any, side: str = "a"
) -> ChatSession:
    """One conversation record -> a session with one call per user turn."""
    conv_id, turns, key = _turns(path, line, record, side)
    session = ChatSession(session_id=conv_id if conv_id is not None else str(index), task="chat")
    for j, turn in enumerate(turns):
        where = f"{key}[{j}]"
        if not isinstance(turn, dict):
            raise TraceFormatError(str(path), line, where, "expected a {role, content} object")
        raw_role = turn.get("from", turn.get("role"))
        if not isinstance(raw_role, str) or raw_role.lower() not in ROLES:
            raise TraceFormatError(str(path), line, f"{where}.role", f"unknown role {raw_role!r}")
        text = message_text(turn.get("value", turn.get("content")))
        if text is None:
            raise TraceFormatError(
                str(path), line, f"{where}.content", "expected text (a string or text parts)"
            )
        role = ROLES[raw_role.lower()]
        session.messages.append((role, text))
        if role == "user":
            session.calls.append(Call(prompt_end=j + 1, output=None, prompt_text=text))
        elif role == "assistant" and session.calls and session.calls[-1].prompt_end == j:
            session.calls[-1].output = j
    return session


@register_loader("sharegpt")
def load_conversations(
    path: Path,
    tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
    arrival: str = "sessions",
    seed: int = 0,
    side: str = "a",
) -> Iterator[Request | Header]:
    """Read conversation JSON; ``arrival`` is an arrival-model spec (``lpc:lambda_chat=100``)."""
    if side not in ("a", "b"):
        raise ConfigError(f"side must be 'a' or 'b' (Chatbot Arena), got {side!r}")
    tok = as_tokenizer(tokenizer)
    model = make_arrivals(arrival)
    rng = np.random.default_rng(seed)
    yield Header(sort_by_arrival=True)
    sessions = (
        parse_conversation(path, line, i, rec, side)
        for i, (line, rec) in enumerate(iter_json_records(path))
    )
    yield from chat_requests(sessions, tok, model, rng)
