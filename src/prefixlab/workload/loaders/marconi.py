"""Marconi simulator trace loader (JSONL, token ids).

Each line: ``session_id``, ``turn_id``, ``ts`` (s), ``num_input_tokens``,
``num_output_tokens``, ``input_tokens`` and ``output_tokens`` (token ids). The counts must
match the token lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prefixlab.workload.loaders.base import (
    FieldReader,
    Header,
    iter_json_lines,
    register_loader,
)
from prefixlab.workload.trace import Request


@register_loader("marconi")
def load_marconi(path: Path) -> Iterator[Request | Header]:
    """Read a Marconi JSONL trace (token form); rows are sorted by ``ts`` once loaded."""
    yield Header(sort_by_arrival=True)
    for lineno, obj in iter_json_lines(path):
        f = FieldReader(path, lineno, obj)
        inp = f.int_list("input_tokens")
        out = f.int_list("output_tokens")
        assert inp is not None and out is not None
        for count_field, tokens in (("num_input_tokens", inp), ("num_output_tokens", out)):
            n = f.int_(count_field, required=False, default=len(tokens))
            if n != len(tokens):
                raise f.fail(count_field, f"{n} but the token list has {len(tokens)}")
        yield Request(
            arrival_s=f.float_("ts", required=False),
            input_length=len(inp),
            output_length=len(out),
            session_id=f.str_("session_id"),
            turn=f.int_("turn_id", required=False),
            input_tokens=inp,
            output_tokens=out,
        )
