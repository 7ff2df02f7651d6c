"""SGLang's SWA radix cache (cache/swa_radix.py) against SGLang's own, request by request.

Runs where ``PREFIXLAB_SGLANG_PYTHON`` names a Python with SGLang installed (0.5.23;
``../shared/REFERENCES.md``; the driver also imports ``openai`` and
``partial-json-parser``); skipped with that reason elsewhere. The driver,
``tests/reference/sglang_swa.py``, serves the trace one request at a time through SGLang's
``UnifiedRadixCache`` (FULL and SWA components), its two-pool allocator, its ``Req`` and
its allocation and caching functions; ``tests/reference/swa_protocol.py`` makes the same
calls on prefixlab's cache. Every request must get the same hit and evict the same full
and SWA tokens, at pools that evict heavily, at pools that hardly do, and at pools too
small for a request (both must stop at the same one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders.native import write_native
from tests.reference.drivers import json_lines
from tests.reference.swa_protocol import serve

ENV = "PREFIXLAB_SGLANG_PYTHON"
PYTHON = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with SGLang installed")


def _requests(path: Path) -> list[tuple[list[int], list[int]]]:
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if "input_tokens" in d:
            out.append((list(d["input_tokens"]), list(d.get("output_tokens") or [])))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "window", "pools"),
    [
        (16, 127, ["40000:32000", "20000:16000", "200000:160000", "8000:3000"]),  # gpt-oss
        (1, 127, ["60000:48000", "30000:24000"]),  # SGLang's default page
        (4, 40, ["30000:12000", "30000:7000"]),  # a small SWA pool: tombstones
    ],
)
def test_swa_radix_equals_sglang(tmp_path: Path, page: int, window: int, pools: list[str]) -> None:
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    path = tmp_path / "trace.jsonl"
    write_native(trace, path)
    assert PYTHON is not None
    rows = json_lines(
        PYTHON,
        "sglang_swa.py",
        str(path),
        str(page),
        str(window),
        ",".join(pools),
        "--no-waiting-refresh",
    )
    assert len(rows) == len(pools)
    reqs = _requests(path)
    for row in rows:
        row.pop("error", None)
        ours = serve(reqs, page, window, row["full_tokens"], row["swa_tokens"])
        assert ours == row, f"pools {row['full_tokens']}:{row['swa_tokens']}"
