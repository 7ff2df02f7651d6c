"""prefixlab's hybrid cache against Marconi's published simulator, request by request.

Runs where ``PREFIXLAB_MARCONI_SIM`` names a patched checkout of github.com/ruipeterpan/marconi
(``docs/marconi.md``: how to get one; ``tests/reference/patch_marconi_sim.py``); skipped with
that reason elsewhere. Traces: a chat-like and an agentic-like generated trace, and the 19 real
SWE-agent trajectories of ``../shared/data/swe_agent`` when present, two cache sizes each.

With the simulator's insertion rule (``locks="none"``: nothing is kept while an insertion
evicts) and, for vLLM+, its size estimate (``vllm+:sizing=estimate``), every policy gives the
same hit tokens on at least 99% of the requests, and the systems rank the same way. With
prefixlab's defaults (an insertion keeps its matched path; exact sizes) the differences are
those ``docs/marconi.md`` explains, and the test only checks they stay that small.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.sources import open_trace
from prefixlab.workload.trace import Trace
from tests.reference import marconi_sim

SIM = marconi_sim.checkout()
pytestmark = pytest.mark.skipif(
    SIM is None, reason=f"set {marconi_sim.ENV} to a patched checkout of Marconi's simulator"
)
SWE = Path(__file__).resolve().parents[2] / "shared" / "data" / "swe_agent"
GB = 10**9


def _traces() -> list[tuple[str, Trace, tuple[int, int]]]:
    out = [
        ("chat", GENERATORS["sessions"].fn(num_sessions=40, seed=1), (2 * GB, 5 * GB)),
        (
            "agentic",
            GENERATORS["sessions"].fn(num_sessions=20, preset="agentic", seed=2),
            (2 * GB, 5 * GB),
        ),
    ]
    if SWE.is_dir():
        out.append(("swe-agent", open_trace(str(SWE), "swe-agent"), (1 * GB, 3 * GB)))
    return out


def _requests(trace: Trace) -> list[tuple[list[int], list[int]]]:
    values, offsets = trace.sequence_tokens()
    inputs = trace.input_length.tolist()
    seqs = [values[offsets[i] : offsets[i + 1]].tolist() for i in range(len(trace))]
    return [(s[: inputs[i]], s[inputs[i] :]) for i, s in enumerate(seqs)]


CASES = [(name, cap) for name, _, caps in _traces() for cap in caps] if SIM else []
#: (our spec, the simulator's policy, its fixed alpha or None for tuned)
SYSTEMS = [
    ("sglang+", "sglang+", None),
    ("marconi:alpha=1", "marconi", 1.0),
    ("marconi", "marconi", None),
    ("vllm+:sizing=estimate", "vllm+", None),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "capacity"), CASES, ids=[f"{n}-{c // GB}GB" for n, c in CASES])
def test_hits_equal_the_simulator_per_request(name: str, capacity: int) -> None:
    assert SIM is not None
    trace = next(t for n, t, _ in _traces() if n == name)
    reqs = _requests(trace)
    ranks = {}
    for spec, sim_policy, alpha in SYSTEMS:
        theirs, alphas = marconi_sim.replay(SIM, reqs, sim_policy, capacity, alpha)
        ours = replay_hybrid(trace, spec, HybridConfig(capacity, locks="none"))
        agree = float(np.mean(ours.hit_tokens == np.array(theirs)))
        assert agree >= 0.99, (spec, agree)
        if spec == "marconi":  # tuned at the same request to the same alpha
            assert [a for _, a in ours.alpha_history] == alphas[1:], (ours.alpha_history, alphas)
        ranks[spec] = (int(ours.hit_tokens.sum()), int(sum(theirs)))
        # prefixlab's defaults: the matched path is kept while inserting; exact sizes
        default = replay_hybrid(trace, spec.replace(":sizing=estimate", ""), HybridConfig(capacity))
        same = float(np.mean(default.hit_tokens == np.array(theirs)))
        print(
            f"{name} {capacity // GB} GB {spec}: simulator's rules {agree:.4f}, defaults {same:.4f}"
        )
    # the systems come out in the same order in both
    ours_order = sorted(ranks, key=lambda s: ranks[s][0])
    theirs_order = sorted(ranks, key=lambda s: ranks[s][1])
    assert ours_order == theirs_order, ranks
