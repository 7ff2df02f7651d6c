"""Agent-trace loaders: SWE-agent trajectories and ToolBench (files or folders of them).

**SWE-agent** (``.traj``, JSON): ``history`` is the message list the agent accumulated. Each
non-demonstration assistant message is one LLM call: its prompt is every message before it,
its output the message itself (text plus any ``tool_calls``). One session per trajectory
(id: the file name). Think times are agentic: the tool's measured ``execution_time`` from
``trajectory`` when the file has it, else a draw from the arrival model (default preset
``agentic``).

**ToolBench** (JSON): two shapes. An *instruction* file (a list of ``{query, api_list,
query_id}``) gives single-turn tool-use requests: a system prompt, the tool descriptions
(``api_list``) and the query. An *answer* file (``answer_generation.train_messages``: one
message list per step of the solving chain, with ``function`` the tool schemas) gives one
agentic session per file: step k's prompt is the tool schemas plus its messages but the last,
its output the last (an assistant message with a ``function_call``). Steps usually extend
each other; a retry may rewrite the history. An answer file without a valid chain
(``valid_data: false``, no ``train_messages``) gives its query as one request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

from prefixlab.errors import TraceFormatError
from prefixlab.types import JSON
from prefixlab.workload.loaders._chat import Call, ChatSession, chat_stream
from prefixlab.workload.loaders._jsonstream import iter_json_records
from prefixlab.workload.loaders.base import Header, register_loader
from prefixlab.workload.loaders.conversations import message_text
from prefixlab.workload.tokenizers import DEFAULT_TOKENIZER, Tokenizer
from prefixlab.workload.trace import Request

#: The instruction shown before the tools of a single-turn ToolBench request (our wording).
TOOLBENCH_SYSTEM = (
    "You can call the functions listed below to answer the user's request. Think step by "
    "step, call one function at a time, and call Finish with the final answer when done."
)


def _files(path: Path, suffix: str) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == suffix and p.is_file())
        if not files:
            raise TraceFormatError(str(path), None, None, f"folder has no {suffix} files")
        return files
    return [path]


def _load_json(path: Path) -> JSON:
    """A whole (small) JSON document; a syntax error names its line."""
    try:
        with path.open(encoding="utf-8") as fh:
            doc: JSON = json.load(fh)
            return doc
    except json.JSONDecodeError as exc:
        raise TraceFormatError(str(path), exc.lineno, None, f"bad JSON: {exc.msg}") from None
    except UnicodeDecodeError:
        raise TraceFormatError(str(path), None, None, "not UTF-8 text") from None


# ------------------------------------------------------------------ SWE-agent
def _assistant_text(msg: dict[str, JSON]) -> str:
    text = message_text(msg.get("content")) or ""
    calls = msg.get("tool_calls")
    if calls:
        text += "\n" + json.dumps(calls, sort_keys=True, ensure_ascii=False)
    return text


def parse_trajectory(path: Path) -> ChatSession:
    """One SWE-agent trajectory -> a session with one call per assistant message."""
    doc = _load_json(path)
    history = doc.get("history") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(history, list):
        raise TraceFormatError(str(path), None, "history", "expected an object with a history list")
    steps = doc.get("trajectory")
    exec_times: list[float | None] = []
    if isinstance(steps, list):
        for step in steps:
            t = step.get("execution_time") if isinstance(step, dict) else None
            ok = isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0
            exec_times.append(float(t) if ok and isinstance(t, (int, float)) else None)
    session = ChatSession(session_id=path.stem, task="swe-agent")
    for j, msg in enumerate(history):
        role = msg.get("role") if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or not isinstance(role, str):
            raise TraceFormatError(str(path), None, f"history[{j}].role", "missing")
        if role == "assistant":
            text = _assistant_text(msg)
        else:
            maybe = message_text(msg.get("content"))
            if maybe is None:
                raise TraceFormatError(
                    str(path), None, f"history[{j}].content", "expected text (a string or parts)"
                )
            text = maybe
        if role == "assistant" and not msg.get("is_demo"):
            k = len(session.calls)
            # The tool ran between call k-1 and call k: that is the agent's think time.
            gap = exec_times[k - 1] if 0 < k <= len(exec_times) else None
            session.calls.append(Call(prompt_end=j, output=j, gap_s=gap))
        session.messages.append((role, text))
    return session


@register_loader("swe-agent")
def load_swe_agent(
    path: Path,
    tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
    arrival: str = "sessions:preset=agentic,session_rate_per_s=0.05",
    seed: int = 0,
) -> Iterator[Request | Header]:
    """Read one ``.traj`` file or a folder of them (one session per trajectory)."""
    sessions = (parse_trajectory(p) for p in _files(path, ".traj"))
    yield from chat_stream(sessions, tokenizer, arrival, seed)


# ------------------------------------------------------------------ ToolBench
def _instruction_session(path: Path, line: int, i: int, rec: JSON) -> ChatSession:
    if not isinstance(rec, dict):
        raise TraceFormatError(str(path), line, None, "expected a query object")
    query = rec.get("query")
    if not isinstance(query, str):
        raise TraceFormatError(str(path), line, "query", "expected a string")
    apis = rec.get("api_list", [])
    if not isinstance(apis, list):
        raise TraceFormatError(str(path), line, "api_list", "expected a list of APIs")
    tools = "\n".join(json.dumps(a, sort_keys=True, ensure_ascii=False) for a in apis)
    qid = rec.get("query_id", i)
    session = ChatSession(session_id=f"{path.stem}:{qid}", task="tool-use")
    session.messages = [("system", TOOLBENCH_SYSTEM), ("tools", tools), ("user", query)]
    session.calls = [Call(prompt_end=3, output=None, prompt_text=query)]
    return session


def _answer_session(path: Path, doc: dict[str, JSON]) -> ChatSession:
    gen = doc.get("answer_generation")
    steps = gen.get("train_messages") if isinstance(gen, dict) else None
    if isinstance(gen, dict) and steps is None and gen.get("valid_data") is False:
        # No valid solving chain was recorded: the query alone is the one request.
        rec = {"query": gen.get("query"), "api_list": gen.get("function", [])}
        return _instruction_session(path, 0, 0, rec)
    if not isinstance(steps, list) or not all(isinstance(s, list) and s for s in steps):
        raise TraceFormatError(
            str(path), None, "answer_generation.train_messages", "expected a list of message lists"
        )
    assert isinstance(gen, dict)
    tools = json.dumps(gen.get("function", []), sort_keys=True, ensure_ascii=False)
    session = ChatSession(session_id=path.stem, task="tool-agent")
    # Each step is its own message list (a retry can rewrite the history), preceded by the
    # tool schemas; a step's prompt shares with the last step's what their texts share.
    for k, step in enumerate(cast("list[list[JSON]]", steps)):  # (checked above)
        start = len(session.messages)
        session.messages.append(("tools", tools))
        for j, msg in enumerate(step):
            role = msg.get("role") if isinstance(msg, dict) else None
            if not isinstance(msg, dict) or not isinstance(role, str):
                raise TraceFormatError(
                    str(path), None, f"answer_generation.train_messages[{k}][{j}].role", "missing"
                )
            content = msg.get("content")
            text = message_text(content) if content is not None else ""
            if text is None:
                raise TraceFormatError(
                    str(path),
                    None,
                    f"answer_generation.train_messages[{k}][{j}].content",
                    "expected text (a string or text parts) or null",
                )
            if msg.get("function_call") is not None:
                call = json.dumps(msg["function_call"], sort_keys=True, ensure_ascii=False)
                text += "\n" + call
            session.messages.append((role, text))
        out = len(session.messages) - 1
        session.calls.append(Call(prompt_end=out, output=out, prompt_start=start))
    return session


def _toolbench_sessions(files: list[Path]) -> Iterator[ChatSession]:
    for p in files:
        records = iter_json_records(p)
        first = next(records, None)
        if first is None:
            raise TraceFormatError(str(p), None, None, "empty file")
        line, rec = first
        if isinstance(rec, dict) and "answer_generation" in rec:
            yield _answer_session(p, rec)
            continue
        if not isinstance(rec, dict) or "query" not in rec:
            raise TraceFormatError(
                str(p),
                line,
                None,
                "not a ToolBench file: expected a list of queries (query, api_list) or an "
                "answer file (answer_generation)",
            )
        yield _instruction_session(p, line, 0, rec)
        for i, (line, rec) in enumerate(records, start=1):
            yield _instruction_session(p, line, i, rec)


@register_loader("toolbench")
def load_toolbench(
    path: Path,
    tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
    arrival: str = "sessions:preset=agentic",
    seed: int = 0,
) -> Iterator[Request | Header]:
    """Read a ToolBench instruction or answer file, or a folder holding both kinds."""
    sessions = _toolbench_sessions(_files(path, ".json"))
    yield from chat_stream(sessions, tokenizer, arrival, seed)
