"""Mooncake trace loader (FAST'25 release).

Each line: ``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}``
with one id per 512-token block of the input (the last one may be partial). There are no
sessions or text. Source: kvcache-ai/Mooncake, FAST25-release/traces. Files are read by
pyarrow's JSON reader when every line passes the checks below (``_columnar``), else line
by line; a streamed replay reads them a chunk at a time (``runner.stream``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prefixlab.workload.loaders._columnar import iter_mooncake_chunks, read_mooncake
from prefixlab.workload.loaders.base import (
    CHUNK_LOADERS,
    FAST_LOADERS,
    FieldReader,
    Header,
    check_hash_ids,
    iter_json_lines,
    register_loader,
)
from prefixlab.workload.trace import Request

MOONCAKE_BLOCK_TOKENS = 512
FAST_LOADERS["mooncake"] = lambda path, opts: read_mooncake(path, MOONCAKE_BLOCK_TOKENS, opts)
CHUNK_LOADERS["mooncake"] = lambda path, opts: iter_mooncake_chunks(
    path, MOONCAKE_BLOCK_TOKENS, opts
)


@register_loader("mooncake")
def load_mooncake(path: Path) -> Iterator[Request | Header]:
    """Read a Mooncake JSONL trace (hash form, 512-token blocks)."""
    yield Header(MOONCAKE_BLOCK_TOKENS, sort_by_arrival=True)
    for lineno, obj in iter_json_lines(path):
        f = FieldReader(path, lineno, obj)
        inp = f.int_("input_length")
        hids = f.int_list("hash_ids", limit=1 << 64)
        assert hids is not None
        check_hash_ids(f, hids, inp, MOONCAKE_BLOCK_TOKENS)
        yield Request(
            arrival_s=f.float_("timestamp") / 1000.0,
            input_length=inp,
            output_length=f.int_("output_length"),
            hash_ids=hids,
            hashed_tokens=inp,
        )
