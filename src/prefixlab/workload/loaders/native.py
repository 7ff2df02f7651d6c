"""prefixlab's native JSONL trace format (see docs/trace-format.md).

An optional first line ``{"prefixlab_trace": 1, "block_tokens": B}`` is the header (required
for hash-form traces: it gives the block size the ids cover). Then one request per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from prefixlab.io import atomic_open
from prefixlab.workload.loaders.base import FieldReader, Header, iter_json_lines, register_loader
from prefixlab.workload.loaders.rules import check_order, read_request
from prefixlab.workload.trace import Request, Trace

FORMAT_VERSION = 1


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
        req = read_request(f, block_tokens)
        check_order(f, req, previous)
        previous = req
        yield req


def _request_dict(r: Request) -> dict[str, object]:
    d: dict[str, object] = {
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
    header: dict[str, object] = {"prefixlab_trace": FORMAT_VERSION}
    if trace.block_tokens is not None:
        header["block_tokens"] = trace.block_tokens
    with atomic_open(path) as fh:
        fh.write(json.dumps(header) + "\n")
        for r in trace:
            fh.write(json.dumps(_request_dict(r), separators=(",", ":")) + "\n")
