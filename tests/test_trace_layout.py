"""Block layout: dense key ids and the one-key-per-prefix check."""

from __future__ import annotations

import numpy as np
import pytest

from prefixlab.errors import ConfigError
from prefixlab.workload.trace import _dense_keys


def test_dense_keys_number_keys_as_np_unique_and_report_the_first_repeat() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        counts = rng.integers(0, 6, size=rng.integers(1, 8))
        offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # distinct within each request, shared across requests
        raw = np.concatenate([rng.choice(20, size=int(c), replace=False) for c in counts])
        raw = raw.astype(np.uint64)
        dense, k = _dense_keys(raw, offs)
        if raw.shape[0]:
            uniq, inv = np.unique(raw, return_inverse=True)
            assert dense.tolist() == inv.reshape(-1).tolist() and k == uniq.shape[0]
        else:
            assert dense.shape == (0,) and k == 0
    # request 1 repeats 9 and 5, request 2 repeats 3: request 1's key 5 is named
    offs = np.array([0, 2, 6, 9], np.int64)
    raw = np.array([1, 2, 9, 5, 9, 5, 3, 4, 3], np.uint64)
    with pytest.raises(ConfigError, match="request 1: block id 5 appears twice"):
        _dense_keys(raw, offs)
