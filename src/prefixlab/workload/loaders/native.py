"""prefixlab's native JSONL trace format (see docs/trace-format.md).

An optional first line ``{"prefixlab_trace": 1, "block_tokens": B}`` is the header (required
for hash-form traces: it gives the block size the ids cover). Then one request per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefixlab.io import atomic_open
from prefixlab.workload.loaders.base import (
    FieldReader,
    Header,
    check_hash_ids,
    iter_json_lines,
    register_loader,
)
from prefixlab.workload.trace import Request, Trace

FORMAT_VERSION = 1


FIELDS = frozenset(
    {
        "arrival_s", "input_length", "output_length", "input_tokens", "output_tokens",
        "hash_ids", "hashed_tokens", "session_id", "turn", "task", "prompt_text", "reply_text",
        "extra_key", "think_s",
    }
)  # fmt: skip


def _read_request(f: FieldReader, block_tokens: int | None) -> Request:
    unknown = sorted(set(f.obj) - FIELDS)
    if unknown:
        # A misspelt field would otherwise vanish without a word (e.g. sesion_id).
        raise f.fail(unknown[0], f"unknown field; known: {', '.join(sorted(FIELDS))}")
    inp_tokens = f.int_list("input_tokens", required=False)
    hash_ids = f.int_list("hash_ids", required=False, limit=1 << 64)
    if (inp_tokens is None) == (hash_ids is None):
        raise f.fail("input_tokens", "give exactly one of 'input_tokens' or 'hash_ids'")
    out_tokens = f.int_list("output_tokens", required=False)
    if inp_tokens is not None:
        inp = f.int_("input_length", required=False, default=len(inp_tokens))
        if inp != len(inp_tokens):
            raise f.fail("input_length", f"{inp} but input_tokens has {len(inp_tokens)}")
    else:
        inp = f.int_("input_length")
    if out_tokens is not None:
        out = f.int_("output_length", required=False, default=len(out_tokens))
        if out != len(out_tokens):
            raise f.fail("output_length", f"{out} but output_tokens has {len(out_tokens)}")
    else:
        out = f.int_("output_length")
    hashed = None
    if hash_ids is not None:
        if block_tokens is None:
            raise f.fail("hash_ids", "hash-form requests need a header line with block_tokens")
        hashed = f.int_("hashed_tokens", required=False, default=inp)
        if hashed > inp + out:
            raise f.fail("hashed_tokens", f"{hashed} exceeds input+output ({inp + out})")
        check_hash_ids(f, hash_ids, hashed, block_tokens)
    return Request(
        arrival_s=f.float_("arrival_s", required=False),
        input_length=inp,
        output_length=out,
        session_id=f.str_("session_id"),
        turn=f.int_("turn", required=False),
        task=f.str_("task"),
        input_tokens=inp_tokens,
        output_tokens=out_tokens,
        hash_ids=hash_ids,
        hashed_tokens=hashed,
        prompt_text=f.str_("prompt_text"),
        reply_text=f.str_("reply_text"),
        extra_key=f.str_("extra_key"),
        think_s=f.float_("think_s") if f.obj.get("think_s") is not None else None,
    )


@register_loader("native")
def load_native(path: Path) -> Iterator[Request | Header]:
    """Read a native JSONL trace; every line is validated as it streams by."""
    block_tokens: int | None = None
    previous: Request | None = None
    for lineno, obj in iter_json_lines(path):
        f = FieldReader(path, lineno, obj)
        if "prefixlab_trace" in obj:
            if previous is not None:
                raise f.fail("prefixlab_trace", "the header must be the first line")
            version = f.int_("prefixlab_trace")
            if version != FORMAT_VERSION:
                raise f.fail("prefixlab_trace", f"unsupported version {version}")
            bt = f.int_("block_tokens", required=False)
            if bt == 0 and "block_tokens" in obj:
                raise f.fail("block_tokens", "must be positive")
            block_tokens = bt or None
            yield Header(block_tokens)
            continue
        req = _read_request(f, block_tokens)
        if previous is not None:
            if req.arrival_s < previous.arrival_s:
                raise f.fail(
                    "arrival_s",
                    f"{req.arrival_s} is earlier than the previous request's "
                    f"{previous.arrival_s}: requests must be in arrival order",
                )
            if (req.hash_ids is None) != (previous.hash_ids is None):
                raise f.fail("hash_ids", "mixes token and hash forms")
        previous = req
        yield req


def _request_dict(r: Request) -> dict[str, Any]:
    d: dict[str, Any] = {
        "arrival_s": r.arrival_s,
        "input_length": r.input_length,
        "output_length": r.output_length,
    }
    for key in ("session_id", "task", "prompt_text", "reply_text", "extra_key"):
        value = getattr(r, key)
        if value is not None:
            d[key] = value
    if r.turn:
        d["turn"] = r.turn
    if r.think_s is not None:
        d["think_s"] = r.think_s
    if r.input_tokens is not None:
        d["input_tokens"] = list(r.input_tokens)
    if r.output_tokens is not None:
        d["output_tokens"] = list(r.output_tokens)
    if r.hash_ids is not None:
        d["hash_ids"] = list(r.hash_ids)
        if r.hashed_tokens is not None and r.hashed_tokens != r.input_length:
            d["hashed_tokens"] = r.hashed_tokens
    return d


def write_native(trace: Trace, path: str | Path) -> None:
    """Write a trace as native JSONL, atomically (a temp file renamed into place)."""
    path = Path(path)
    header: dict[str, Any] = {"prefixlab_trace": FORMAT_VERSION}
    if trace.block_tokens is not None:
        header["block_tokens"] = trace.block_tokens
    with atomic_open(path) as fh:
        fh.write(json.dumps(header) + "\n")
        for r in trace:
            fh.write(json.dumps(_request_dict(r), separators=(",", ":")) + "\n")
