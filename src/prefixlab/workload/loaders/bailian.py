"""Qwen-Bailian ("KVCache Cache in the Wild", ATC'25) trace loader.

Each line: ``chat_id``, ``parent_chat_id`` (-1 for a conversation's first request),
``timestamp`` (s), ``input_length``, ``output_length``, ``type`` (text, search, image,
file...), ``turn`` and ``hash_ids`` (one id per 16-token block). Sessions are rebuilt from
the parent chain: every request belongs to the session of its root request; a parent that
is not in the file (a time slice that starts mid-conversation) stands in as the root, so its
children still share one session. ``type`` becomes the task label. Rows are sorted by
``timestamp`` once loaded. The published release is not available offline; tests use
fixtures that follow its field list.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prefixlab.workload.loaders.base import (
    FieldReader,
    Header,
    check_hash_ids,
    iter_json_lines,
    register_loader,
)
from prefixlab.workload.trace import Request

BAILIAN_BLOCK_TOKENS = 16


def _parent(f: FieldReader) -> int | None:
    raw = f.obj.get("parent_chat_id", -1)
    if raw is None or raw == -1:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise f.fail("parent_chat_id", f"expected a chat id or -1, got {raw!r}")
    return raw


@register_loader("bailian")
def load_bailian(path: Path) -> Iterator[Request | Header]:
    """Read a Bailian JSONL trace (hash form, 16-token blocks), rebuilding sessions."""
    yield Header(BAILIAN_BLOCK_TOKENS, sort_by_arrival=True)
    root_of: dict[int, int] = {}
    for lineno, obj in iter_json_lines(path):
        f = FieldReader(path, lineno, obj)
        chat = f.int_("chat_id")
        if chat in root_of:
            raise f.fail("chat_id", f"chat id {chat} appears twice")
        parent = _parent(f)
        if parent is None:
            root_of[chat] = chat
        else:
            # A parent outside the file (a time slice that starts mid-conversation) is the
            # session's root: its later children still join one session.
            root_of[chat] = root_of.get(parent, parent)
        inp = f.int_("input_length")
        hids = f.int_list("hash_ids", limit=1 << 64)
        assert hids is not None
        check_hash_ids(f, hids, inp, BAILIAN_BLOCK_TOKENS)
        yield Request(
            arrival_s=f.float_("timestamp"),
            input_length=inp,
            output_length=f.int_("output_length"),
            session_id=str(root_of[chat]),
            turn=f.int_("turn", required=False),
            task=f.str_("type"),
            hash_ids=hids,
            hashed_tokens=inp,
        )
