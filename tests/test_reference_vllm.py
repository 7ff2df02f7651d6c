"""The ``vllm`` policy on the block structure against vLLM's real KVCacheManager.

Runs where ``PREFIXLAB_VLLM_PYTHON`` names a Python with vLLM installed (a separate
environment of about 3 GB: ``../shared/REFERENCES.md``); skipped with that reason elsewhere.
The driver, ``tests/reference/vllm_kv_manager.py``, replays the trace through vLLM's own
``KVCacheManager``, block hasher and block pool. (Without vLLM, ``tests/test_golden.py``
checks the same contract against an independent model of its block pool,
``tests/reference/vllm_pool_ref.py``.)

Traces: the workload of ``prefixlab demo`` in token form (outputs cached) at two sizes, and
the first 3,000 requests of the shared Mooncake trace in hash form (512-token blocks,
outputs reserved) when ``../shared/data`` is present. Every request must get the same hits.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders.native import write_native
from prefixlab.workload.sources import open_trace
from prefixlab.workload.trace import Trace
from tests.reference.drivers import json_lines

ENV = "PREFIXLAB_VLLM_PYTHON"
PYTHON = os.environ.get(ENV)
MOONCAKE = Path(__file__).resolve().parents[2] / "shared/data/mooncake/conversation_trace.jsonl"
pytestmark = pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with vLLM installed")


def _check(trace: Trace, tmp: Path, block: int, capacities: list[int]) -> None:
    path = tmp / "trace.jsonl"
    write_native(trace, path)
    assert PYTHON is not None
    rows = json_lines(
        PYTHON, "vllm_kv_manager.py", str(path), str(block), ",".join(map(str, capacities))
    )
    assert len(rows) == len(capacities)
    for row in rows:
        cfg = ReplayConfig(capacity_blocks=row["capacity_blocks"], block_tokens=block)
        ours = replay(trace, "vllm", cfg).hit_tokens
        theirs = np.array(row["hit_tokens"])
        assert np.array_equal(ours, theirs), (
            row["capacity_blocks"],
            np.flatnonzero(ours != theirs)[:5],
        )
        assert theirs.sum() > 0


@pytest.mark.slow
def test_vllm_equals_kv_cache_manager_on_the_demo_trace(tmp_path: Path) -> None:
    _check(GENERATORS["mix"].fn(trace=2, num_requests=1000), tmp_path, 16, [1942, 7766])


@pytest.mark.slow
@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/data/mooncake is absent")
def test_vllm_equals_kv_cache_manager_on_mooncake(tmp_path: Path) -> None:
    _check(open_trace(str(MOONCAKE), "mooncake", limit=3000), tmp_path, 512, [2000])
