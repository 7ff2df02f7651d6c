"""The sliding-window cache rule (runner/engine/windowed.py) against vLLM's own hybrid
KV-cache manager, request by request.

Runs where ``PREFIXLAB_VLLM_PYTHON`` names a Python with vLLM installed (0.33.0;
``../shared/REFERENCES.md``); skipped with that reason elsewhere. The driver,
``tests/reference/vllm_window_run.py``, builds vLLM's ``KVCacheManager`` for a model whose
attention layers are spelt ``s`` (sliding window) and ``f`` (full), grouped by vLLM's own
planner, and serves the trace as prefixlab's engine does with one running request and
unchunked prefill (prompt with one lookahead token, one decode step at a time, the
finished sequence cached, then freed). Every request must get the same hit, at a pool
that evicts and at one that hardly does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from prefixlab.model.spec import get_model
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.windowed import pages_for, window_groups
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders.native import write_native
from tests.reference.drivers import json_lines

ENV = "PREFIXLAB_VLLM_PYTHON"
PYTHON = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with vLLM installed")
TIMING = make_timing("power:preset=llama-3.2-1b-a100+tpot:s=0.01")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layers", "window"),
    [
        ("ssfssf", 64),  # groups of 2: two sliding, one full
        ("sssssfsssssf", 100),  # Gemma 3's 5:1, a window not a multiple of the block
        ("sfsfsf", 128),  # gpt-oss: one group of each
        ("ssss", 64),  # every layer sliding: one group
    ],
)
def test_window_rule_equals_vllm(tmp_path: Path, layers: str, window: int) -> None:
    spec = {
        "hidden_size": 64,
        "num_attention_layers": len(layers),
        "num_sliding_layers": layers.count("s"),
        "sliding_window": window,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 32,
    }
    model = tmp_path / "model.json"
    model.write_text(json.dumps(spec))
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    path = tmp_path / "trace.jsonl"
    write_native(trace, path)
    groups = window_groups(get_model(str(model)), 16)
    capacities = [900, 2500]
    pages = [pages_for(c, get_model(str(model)), groups) for c in capacities]
    assert PYTHON is not None
    rows = json_lines(
        PYTHON,
        "vllm_window_run.py",
        str(path),
        "16",
        layers,
        str(window),
        ",".join(map(str, pages)),
    )
    assert len(rows) == len(capacities)
    for cap, row in zip(capacities, rows, strict=True):
        assert len(row["groups"]) == groups.groups  # vLLM's planner grouped as we do
        cfg = EngineConfig(
            capacity_blocks=cap,
            block_tokens=16,
            model=str(model),
            max_num_seqs=1,
            chunked_prefill=False,
            max_num_batched_tokens=1 << 24,
        )
        ours = simulate(trace, "vllm", cfg, TIMING).hit_tokens
        theirs = np.array(row["hit_tokens"])
        assert np.array_equal(ours, theirs), (cap, np.flatnonzero(ours != theirs)[:5])
        assert theirs.sum() > 0
