"""sglang-lru on the radix structure against SGLang's real radix caches, request by request.

Runs where ``PREFIXLAB_SGLANG_PYTHON`` names a Python with SGLang installed (a separate
environment: ``../shared/REFERENCES.md`` says how it installs on a CPU-only machine);
skipped with that reason elsewhere. The driver, ``tests/reference/sglang_radix.py``, replays
the trace through SGLang's own ``RadixCache``, allocators and eviction entry point, and
again through ``UnifiedRadixCache`` with its FULL component alone (``--unified``: what
SGLang 0.5.23 builds by default, for models without sliding windows too).

Traces: the workload of ``prefixlab demo`` (UniCache's trace #2, 1,000 requests: multi-turn
sessions and templated tasks) with 16-token pages at three sizes, and a small chat trace
with 1-token pages (SGLang's default). Every request must get the same hit tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.trace import Trace
from tests.reference.drivers import json_lines

ENV = "PREFIXLAB_SGLANG_PYTHON"
PYTHON = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with SGLang installed")


def _theirs(
    trace: Trace, tmp: Path, page: int, capacities: list[int], unified: bool
) -> dict[int, np.ndarray]:
    path = tmp / "trace.jsonl"
    write_native(trace, path)
    assert PYTHON is not None
    args = [str(path), str(page), ",".join(map(str, capacities))]
    rows = json_lines(PYTHON, "sglang_radix.py", *args, *(["--unified"] if unified else []))
    return {r["capacity_pages"]: np.array(r["hit_tokens"]) for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("unified", [False, True], ids=["RadixCache", "UnifiedRadixCache"])
@pytest.mark.parametrize(
    ("name", "page", "capacities"),
    [("demo", 16, [1942, 3883, 7766]), ("chat", 1, [12_000, 30_000])],
)
def test_sglang_lru_equals_sglang_radix_cache(
    tmp_path: Path, name: str, page: int, capacities: list[int], unified: bool
) -> None:
    # SGLang 0.5.23 builds UnifiedRadixCache (its FULL component alone) by default, also
    # for models without sliding windows; RadixCache is the class it had before.
    if name == "demo":
        trace = GENERATORS["mix"].fn(trace=2, num_requests=1000)
    else:
        trace = GENERATORS["sessions"].fn(num_sessions=60, seed=4)
    theirs = _theirs(trace, tmp_path, page, capacities, unified)
    for cap in capacities:
        cfg = ReplayConfig(capacity_blocks=cap, block_tokens=page, structure="radix")
        ours = replay(trace, "sglang-lru", cfg).hit_tokens
        assert np.array_equal(ours, theirs[cap]), (cap, np.flatnonzero(ours != theirs[cap])[:5])
        assert theirs[cap].sum() > 0
