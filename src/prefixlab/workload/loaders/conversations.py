"""Conversation JSON loader: ShareGPT, LMSys-Chat-1M, Chatbot-Arena and OpenAI-style dumps.

The file is a JSON array of conversations, JSON Lines (one per line), or a single one. A
conversation is a list of turns ``{from|role, value|content}``, either bare or under one of
``conversations`` (ShareGPT), ``conversation`` (LMSys-Chat), ``conversation_a`` (Chatbot
Arena; ``side=b`` reads ``conversation_b``) or ``messages`` (OpenAI). Roles ``human``/``user``
and ``gpt``/``assistant``/``chatgpt``/``bard``/``model`` are normalised; ``system``,
``developer`` and tool turns stay as context. An assistant turn's ``tool_calls`` (its
``content`` may then be null) are part of its text, as JSON; non-text content parts (images)
are left out. Its id is ``id``, ``conversation_id`` or ``question_id`` (else its
position).

Each user turn becomes a request: its input is the whole history so far (every earlier turn,
assistant replies included) plus the new message; its output is the assistant reply that
follows (none when the conversation ends on the user). The user message is kept as
``prompt_text`` (LPC's predictor reads it). Texts are tokenised in batches with the chosen
tokenizer; arrival times come from the chosen arrival model (the dumps carry none that mean
serving time).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.types import JSON
from prefixlab.workload.loaders._chat import Call, ChatSession, chat_stream
from prefixlab.workload.loaders._jsonstream import iter_json_records
from prefixlab.workload.loaders.base import Header, register_loader
from prefixlab.workload.tokenizers import DEFAULT_TOKENIZER, Tokenizer
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
    "developer": "system",
    "ipython": "tool",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
CONTAINERS = ("conversations", "conversation", "messages")
ID_FIELDS = ("id", "conversation_id", "question_id")


def message_text(content: JSON) -> str | None:
    """A turn's text: a string, or the text parts of an OpenAI-style content list.

    Non-text parts (``image_url``, ``input_audio``...) carry no text and are left out; their
    tokens are not modelled. None when the content is neither shape.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        parts = cast("list[dict[str, JSON]]", content)  # (checked just above)
        texts = [p.get("text") for p in parts if p.get("type", "text") == "text"]
        if all(isinstance(t, str) for t in texts):
            return "\n".join(t for t in texts if isinstance(t, str))
    return None


def turn_text(turn: dict[str, JSON]) -> str | None:
    """A turn's text plus any tool calls it makes (OpenAI ``tool_calls`` / ``function_call``);
    an assistant turn that only calls tools has ``content: null``."""
    content = turn.get("value", turn.get("content"))
    calls = turn.get("tool_calls") or turn.get("function_call")
    text = "" if content is None and calls else message_text(content)
    if text is not None and calls:
        text += ("\n" if text else "") + json.dumps(calls, sort_keys=True, ensure_ascii=False)
    return text


def _turns(path: Path, line: int, record: JSON, side: str) -> tuple[str | None, list[JSON], str]:
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
    path: Path, line: int, index: int, record: JSON, side: str = "a"
) -> ChatSession:
    """One conversation record -> a session with one call per user turn."""
    conv_id, turns, key = _turns(path, line, record, side)
    session = ChatSession(session_id=conv_id if conv_id is not None else str(index), task="chat")
    for j, turn in enumerate(turns):
        where = f"{key}[{j}]"
        if not isinstance(turn, dict):
            raise TraceFormatError(str(path), line, where, "expected a {role, content} object")
        role_key = "from" if "from" in turn else "role"
        text_key = "value" if "value" in turn else "content"
        raw_role = turn.get(role_key)
        if not isinstance(raw_role, str) or raw_role.lower() not in ROLES:
            raise TraceFormatError(
                str(path), line, f"{where}.{role_key}", f"unknown role {raw_role!r}"
            )
        text = turn_text(turn)
        if text is None:
            raise TraceFormatError(
                str(path), line, f"{where}.{text_key}", "expected text (a string or text parts)"
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
    sessions = (
        parse_conversation(path, line, i, rec, side)
        for i, (line, rec) in enumerate(iter_json_records(path))
    )
    yield from chat_stream(sessions, tokenizer, arrival, seed)
