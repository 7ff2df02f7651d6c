"""The paper's theory as tests (Angelopoulos, Marchal, Obrecht, Simon, arXiv 2509.02408).

* Theorem 3.3 (LRU's lower bound): on the cyclic sequence over k + 1 pages, n = (k+1)/l per
  layer, LRU faults on every request while OPT faults once per k requests (exactly, here).
* Theorem 3.1 (fixed partitions): a policy with a fixed share per layer has an unbounded
  competitive ratio once a layer needs more pages than its share: its faults grow with the
  sequence while OPT's stay at the number of distinct pages.
* Boundary cases: k >= n * l faults only on first use; k = 1 with l >= 2 faults always.
* LLRU against LRU on random and on Llama-MoE-like / Mixtral-like synthetic traces.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from prefixlab.errors import ConfigError
from prefixlab.experts.generators import generate
from prefixlab.experts.policies import make_policy, registered
from prefixlab.experts.simulate import ExpertResult, simulate

I64 = npt.NDArray[np.int64]
ALL = sorted(registered())
SHARED = [p for p in ALL if not make_policy(p).partitioned]


def sim(pages: I64, layers: int, n: int, k: int, policy: str, record: bool = False) -> ExpertResult:
    return simulate(
        pages, num_layers=layers, num_experts=n, capacity=k, policy=policy, record=record
    )


def zipf_trace(
    layers: int, n: int, num_tokens: int, a: float, b: float, r: float, seed: int
) -> I64:
    """Per-layer Zipf popularity p_j ~ 1 / (j + b)^a over a random permutation of the
    experts; with probability r a token keeps the previous token's expert (temporal
    reuse, a Markov chain per layer)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / (np.arange(n) + b) ** a
    perms = np.stack([rng.permutation(n) for _ in range(layers)])
    layer = np.arange(layers)[None, :]
    experts = perms[layer, rng.choice(n, size=(num_tokens, layers), p=p / p.sum())]
    stay = rng.random((num_tokens, layers)) < r
    stay[0] = False
    source = np.maximum.accumulate(np.where(stay, 0, np.arange(num_tokens)[:, None]), axis=0)
    pages: I64 = (layer * n + experts[source, layer]).ravel().astype(np.int64)
    return pages


# ------------------------------------------------------------------------ Theorem 3.3
def cyclic(layers: int, n: int, num_rounds: int) -> I64:
    """Round r asks expert r mod n in every layer: a cycle over all n * l pages."""
    rounds = np.arange(num_rounds)[:, None] % n
    return (np.arange(layers)[None, :] * n + rounds).ravel().astype(np.int64)


@pytest.mark.parametrize(("layers", "n"), [(2, 5), (4, 3), (32, 2)])
def test_theorem_3_3_lru_faults_always_opt_once_per_k(layers: int, n: int) -> None:
    k = n * layers - 1  # k + 1 pages in all, n = (k + 1) / l per layer
    pages = cyclic(layers, n, 40 * n)
    num_requests = len(pages)
    assert sim(pages, layers, n, k, "lru").num_faults == num_requests
    assert sim(pages, layers, n, k, "fifo").num_faults == num_requests
    opt = sim(pages, layers, n, k, "opt", record=True)
    assert opt.fault_mask is not None
    # faults at t = 0 .. k (the k + 1 first uses), then exactly at t = 2k, 3k, ...
    expected = list(range(k + 1)) + list(range(2 * k, num_requests, k))
    assert np.flatnonzero(opt.fault_mask).tolist() == expected
    assert opt.num_faults == k + (num_requests - 1) // k
    # so after the warm-up no k consecutive requests hold two faults
    window = np.convolve(opt.fault_mask[k + 1 :].astype(int), np.ones(k, int), "valid")
    assert window.max() == 1


# ------------------------------------------------------------------------ Theorem 3.1
def thm31(layers: int, n: int, share: int, num_rounds: int) -> I64:
    """Layer 0 cycles through share + 1 experts; every other layer always asks expert 0."""
    experts = np.zeros((num_rounds, layers), dtype=np.int64)
    experts[:, 0] = np.arange(num_rounds) % (share + 1)
    return (np.arange(layers)[None, :] * n + experts).ravel()


def test_theorem_3_1_fixed_partitions_are_not_competitive() -> None:
    layers, n, k = 4, 4, 8  # share 2 per layer; layer 0 needs 3 pages (n > k / l)
    distinct = 3 + (layers - 1)  # 6 <= k: a shared cache keeps them all
    faults = {}
    for num_rounds in (100, 200):
        pages = thm31(layers, n, 2, num_rounds)
        faults[num_rounds] = {p: sim(pages, layers, n, k, p).num_faults for p in ALL}
        assert faults[num_rounds]["opt"] == distinct
    short, long_ = faults[100], faults[200]
    # lru-dist faults on every layer-0 request, opt-dist once per 2 (Belady in 2 slots)
    assert long_["lru-dist"] - short["lru-dist"] == 100
    assert long_["opt-dist"] - short["opt-dist"] == 50
    assert long_["opt-dist"] / long_["opt"] > short["opt-dist"] / short["opt"] > 4
    # every shared policy keeps all 6 pages (k = 8): first uses only
    assert {p: long_[p] for p in SHARED} == dict.fromkeys(SHARED, distinct)


# -------------------------------------------------------------------- boundary cases
@pytest.mark.parametrize(("layers", "n"), [(1, 6), (3, 4), (8, 2)])
def test_capacity_of_every_page_faults_only_on_first_use(layers: int, n: int) -> None:
    pages = zipf_trace(layers, n, 300, 0.8, 1.0, 0.3, seed=layers)
    distinct = len(set(pages.tolist()))
    for k in (n * layers, n * layers + 3):
        assert {p: sim(pages, layers, n, k, p).num_faults for p in ALL} == dict.fromkeys(
            ALL, distinct
        )


@pytest.mark.parametrize("layers", [2, 5])
def test_one_page_faults_on_every_request(layers: int) -> None:
    pages = zipf_trace(layers, 3, 200, 1.0, 1.0, 0.9, seed=layers)  # heavy reuse does not help
    for policy in SHARED:
        assert sim(pages, layers, 3, 1, policy).num_faults == len(pages)
    for policy in sorted(set(ALL) - set(SHARED)):
        with pytest.raises(ConfigError, match="below num_layers"):
            sim(pages, layers, 3, 1, policy)


# ----------------------------------------------------------------------- LLRU vs LRU
def test_llru_is_close_to_lru_on_random_traces() -> None:
    # No theorem bounds LLRU by LRU, so the margin is empirical. Measured over 2000 random
    # configurations drawn like these (l 2..16, n 2..8, Zipf a 0..1.5, reuse r 0..0.9,
    # k 1..n*l, 200 tokens): LLRU / LRU faults max 1.077 (78 vs 84 faults), 99.9th
    # percentile 1.047, mean 0.929; LLRU faulted more than LRU on 8.5 % of them. These 40
    # traces: max 1.045, mean 0.876. Margin per trace 10 %; on average LLRU must win.
    rng = np.random.default_rng(2024)
    ratios = []
    for _ in range(40):
        layers, n = int(rng.integers(2, 17)), int(rng.integers(2, 9))
        a, r = float(rng.uniform(0.0, 1.5)), float(rng.uniform(0.0, 0.9))
        pages = zipf_trace(layers, n, 200, a, 1.0, r, seed=int(rng.integers(1 << 30)))
        k = int(rng.integers(1, layers * n + 1))
        llru, lru = (sim(pages, layers, n, k, p).num_faults for p in ("llru", "lru"))
        ratios.append(llru / lru)
    assert max(ratios) <= 1.10, max(ratios)
    assert float(np.mean(ratios)) <= 0.95, float(np.mean(ratios))


@pytest.mark.parametrize(("model", "n", "top_k"), [("llama-moe", 16, 4), ("mixtral", 8, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_llru_against_lru_and_lru_dist_on_moe_like_traces(
    model: str, n: int, top_k: int, seed: int
) -> None:
    # The paper's shapes (Sec. 5.1): l = 32 layers; Llama-MoE 16 experts top-4, Mixtral 8
    # top-2 (k rounds per token, one per rank); k = 200, 2000 tokens, classic Zipf (a = 1,
    # b = 0) with temporal reuse r = 0.5. Measured over seeds 0-3: LLRU / LRU 0.970-0.971
    # (llama-moe) and 0.979-0.982 (mixtral); LLRU / LRU-dist 0.999-1.002 (llama-moe: a tie
    # on this symmetric routing, where the paper's real traces gave about 7% fewer faults)
    # and 0.972-0.993 (mixtral).
    layers = 32
    trace = generate(
        "zipf",
        num_layers=layers,
        num_experts=n,
        num_tokens=2000,
        a=1.0,
        b=0.0,
        r=0.5,
        top_k=top_k,
        seed=seed,
    )
    pages = trace.pages
    f = {
        p: sim(pages, layers, n, 200, p).num_faults
        for p in ("llru", "lru", "lru-dist", "opt", "opt-dist")
    }
    assert f["llru"] < 0.99 * f["lru"], f
    if model == "mixtral":
        assert f["llru"] < f["lru-dist"], f
    else:
        assert abs(f["llru"] / f["lru-dist"] - 1) < 0.01, f
    assert f["opt"] < f["opt-dist"] < f["llru"], f
