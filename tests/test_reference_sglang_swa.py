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

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixlab.model.spec import get_model
from prefixlab.runner.engine import simulate
from prefixlab.runner.engine.swa_radix import sglang_pools, sglang_window
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders.native import write_native
from tests.reference.drivers import json_lines
from tests.reference.swa_protocol import read_requests, serve
from tests.test_swa_radix import TIMING, gpt_oss_like, one_at_a_time

ENV = "PREFIXLAB_SGLANG_PYTHON"
PYTHON = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with SGLang installed")


def _sglang(tmp_path: Path, page: int, window: int, pools: list[str]) -> tuple[Path, list[Any]]:
    """The demo workload's first 300 requests through SGLang's cache: one row per pool."""
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    path = tmp_path / "trace.jsonl"
    write_native(trace, path)
    assert PYTHON is not None
    args = (str(path), str(page), str(window), ",".join(pools), "--no-waiting-refresh")
    rows = json_lines(PYTHON, "sglang_swa.py", *args)
    assert len(rows) == len(pools)
    return path, rows


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
    path, rows = _sglang(tmp_path, page, window, pools)
    reqs = read_requests(path)
    for row in rows:
        row.pop("error", None)
        ours = serve(reqs, page, window, row["full_tokens"], row["swa_tokens"])
        assert ours == row, f"pools {row['full_tokens']}:{row['swa_tokens']}"


@pytest.mark.slow
@pytest.mark.parametrize(("page", "capacities"), [(16, [3000, 1500]), (1, [40000, 20000])])
def test_engine_with_sglang_swa_equals_sglang(
    tmp_path: Path, page: int, capacities: list[int]
) -> None:
    # The engine itself, one request at a time with unchunked prefill, on a gpt-oss-like
    # model (sliding and full layers alternating, a 128-token window: SGLang's 127).
    model = gpt_oss_like(tmp_path, 128)
    spec = get_model(str(model))
    pairs = []
    for cap in capacities:
        full, swa = sglang_pools(cap, spec, page)
        pairs.append(f"{full * page}:{swa * page}")
    _, rows = _sglang(tmp_path, page, sglang_window(spec), pairs)
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    for cap, row in zip(capacities, rows, strict=True):
        assert "failed_request" not in row
        cfg = one_at_a_time(cap, page, model)
        ours = simulate(trace, "sglang-lru", cfg, TIMING, check_every=50).hit_tokens
        theirs = np.array(row["hit_tokens"])
        assert np.array_equal(ours, theirs), (cap, np.flatnonzero(ours != theirs)[:5])
        assert theirs.sum() > 0
