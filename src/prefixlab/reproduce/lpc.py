"""LPC (Yang et al., NeurIPS 2025; ``../shared/papers/lpc-summary-zh.md``): the predictor's
MCC / F1 (Appendix A.3, Table 3) and the cache LPC saves over LRU (Sec. 4.3, Fig. 4; the
gap to the oracle it closes, B.4, Fig. 9; the cost of its own memory, A.2, Fig. 8).

The paper's setup, and what stands in for what is not available offline:

- **Workload** (A4, experimental setup: workload generation): conversations start so that at
  most ``N_conv = 200`` are active; a turn follows the previous reply after an exponential gap
  of mean ``lambda_chat = 100`` s; the run lasts 20 minutes. The paper's LMSys, ShareGPT and
  Chatbot-Arena conversations are not available offline: the ``lpc`` generator's synthetic
  conversations stand in, with a hidden per-conversation engagement that the prompts reflect
  noisily (its docstring), and open-loop turns (the replay runner).
- **Predictor** (Sec. 3.2-3.3): the user prompts of the turn and the 4 before, 512 tokens
  split evenly, embedded into 384 dimensions, plus the turn count, into an MLP with hidden
  layers of 128, trained on half of the conversations (class-weighted cross-entropy, Adam
  5e-4, up to 20 epochs). The paper's embedder, multilingual-e5-small, is not available
  offline. Two stand-ins are trained: the hashed n-gram embedder, and at paper scale
  all-MiniLM-L6-v2 (a 384-dimensional sentence embedding, the ``st`` extra). The savings
  are measured with the predictor whose MCC falls in the paper's range (hashed, about 0.3;
  MiniLM reaches less on these conversations, whose cue is a short clause in a five-prompt
  window) and, at paper scale, with MiniLM's as well.
- **Cache** (A4, cache configuration; Sec. 4.3): Qwen3-32B (256 KiB of KV per token), 16-token
  blocks, total capacities of 64K to 160K tokens (16 to 40 GiB); LPC's predictor takes 1 GiB of
  it ("for a fair comparison with LRU, LPC's available prefix-cache size is reduced by this 1
  GB"): 256 blocks. The oracle is not charged (the paper does not say).
"""

from __future__ import annotations

import functools
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from prefixlab.reproduce.base import Claim, Outcome, Reproduction, Row, Scale, num, register

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MODEL = "qwen3-32b"
BLOCK = 16


@dataclass(frozen=True, slots=True)
class Setup:
    train_conversations: int
    embedders: tuple[str, ...]
    epochs: int
    replay_conversations: int
    minutes: float
    capacity_tokens: tuple[int, ...]


SETUPS = {
    "ci": Setup(600, ("hashed",), 5, 1500, 10.0, (32_000, 48_000, 64_000, 96_000)),
    "paper": Setup(
        2000,
        ("hashed", "minilm"),
        20,
        3000,
        20.0,
        (48_000, 64_000, 85_000, 110_000, 135_000, 160_000),
    ),
}


@functools.lru_cache(maxsize=4)
def _trained(scale: Scale, embedder: str) -> tuple[str, dict[str, float]]:
    """Train the predictor on half of a workload's conversations; its path and evaluation
    (MCC, macro-F1, turns-only MCC, the MCC of the generator's own probabilities, and the
    5th and 95th percentiles of the probabilities it predicts)."""
    from prefixlab.learn.features import continuation_labels
    from prefixlab.learn.predictor import TrainConfig, evaluate, mcc, train
    from prefixlab.workload.generators import GENERATORS
    from prefixlab.workload.generators.lpc import LPCParams, conversation_texts

    s = SETUPS[scale]
    trace = GENERATORS["lpc"].fn(num_conversations=s.train_conversations, seed=0)
    pred, mask = train(trace, TrainConfig(embedder=embedder, epochs=s.epochs))
    ev = evaluate(pred, trace, mask)
    # the ceiling: each turn's true probability of going on, thresholded at 0.5
    rng = np.random.default_rng(0)
    probs = [
        q for _ in range(s.train_conversations) for q in conversation_texts(LPCParams(), rng)[1]
    ]
    conv = np.array([int(str(x)[1:]) for x in trace.session_id], dtype=np.int64)
    order = np.lexsort((trace.turn, conv))
    truth = np.empty(len(trace))
    truth[order] = probs
    ceiling = mcc(continuation_labels(trace)[~mask], truth[~mask] > 0.5)
    predicted = pred.predict_trace(trace)[~mask]
    folder = Path(tempfile.mkdtemp(prefix="prefixlab-lpc-"))
    path = str(pred.save(folder / "lpc").with_suffix(""))
    out = {
        **{k: float(v) for k, v in ev.as_dict().items()},
        "ceiling_mcc": ceiling,
        "p5": float(np.percentile(predicted, 5)),
        "p95": float(np.percentile(predicted, 95)),
    }
    return path, out


@register("lpc-predictor")
class LPCPredictor(Reproduction):
    paper = "LPC (lpc-summary-zh.md)"
    target = "Appendix A.3, Table 3"
    title = "LPC's continuation predictor: MCC and macro-F1 against the turn count alone"

    def run(self, scale: Scale) -> Outcome:
        s = SETUPS[scale]
        evs = {e: _trained(scale, e)[1] for e in s.embedders}
        table: list[Row] = []
        for emb, ev in evs.items():
            row: Row = {"predictor": f"LPC, {emb} embedder", "mcc": ev["mcc"]}
            table.append({**row, "f1_macro": ev["f1_macro"], "p5": ev["p5"], "p95": ev["p95"]})
        ev = evs["hashed"]
        table.append({"predictor": "turns only", "mcc": ev["turns_only_mcc"]})
        table.append({"predictor": "true probability > 0.5 (ceiling)", "mcc": ev["ceiling_mcc"]})
        return Outcome(table, _predictor_claims(evs, s), _draw_predictor, _predictor_notes(s))


def _predictor_claims(evs: dict[str, dict[str, float]], s: Setup) -> list[Claim]:
    """The predictor claims: one MCC claim per embedder, then the hashed predictor's
    turns-only MCC, LPC against turns only, and macro-F1."""
    hashed = evs["hashed"]
    claims = [_mcc_claim(emb, ev["mcc"], s) for emb, ev in evs.items()]
    claims += [
        Claim(
            "turns-only MCC",
            "A.3, Table 3",
            "Chatbot-Arena 0.0775; ShareGPT below 0; LMSys comparable to LPC",
            f"{hashed['turns_only_mcc']:.3f}",
            "n/a",
            "the generator makes long conversations slightly less likely to go on "
            "(turn_slope -0.05), so the turn count carries a little information",
        ),
        Claim(
            "LPC better than turns only",
            "A.3",
            "always",
            ", ".join(
                f"{e}: {'yes' if v['mcc'] > v['turns_only_mcc'] else 'no'}" for e, v in evs.items()
            ),
            "agree" if all(v["mcc"] > v["turns_only_mcc"] for v in evs.values()) else "differ",
            "MiniLM's sentence embedding of the five-prompt window dilutes the short cue "
            "clause that carries the signal here",
        ),
        Claim(
            "macro-F1",
            "A.3, Table 3",
            "Chatbot-Arena 0.6837",
            ", ".join(f"{e}: {v['f1_macro']:.3f}" for e, v in evs.items()),
            "n/a",
            "one dataset's number; ours is a synthetic one",
        ),
    ]
    return claims


def _predictor_notes(s: Setup) -> list[str]:
    return [
        f"{s.train_conversations:,} synthetic conversations (the `lpc` generator, latent "
        "engagement), half for training, half evaluated; synthetic, not the paper's data.",
        "embedders: `hashed` (token n-grams, 384-d)"
        + (
            ", `minilm` (all-MiniLM-L6-v2, 384-d; the paper's multilingual-e5-small is "
            "not available offline)"
            if "minilm" in s.embedders
            else ""
        )
        + f"; MLP 128-128, {s.epochs} epochs at most. p5 / p95: the spread of the "
        "probabilities a predictor gives the held-out requests.",
        "the ceiling thresholds each turn's true probability of going on (known to the "
        "generator): no predictor of the text can do better on average.",
    ]


def _mcc_claim(embedder: str, value: float, s: Setup) -> Claim:
    in_range = 0.28 <= value <= 0.37
    why = (
        "synthetic conversations with a noisy, hidden continuation signal stand in for the datasets"
    )
    if not in_range and embedder == "minilm":
        why += (
            "; MiniLM's sentence embedding of the five-prompt window dilutes the short cue "
            "clause that carries the signal (the hashed n-grams keep it)"
        )
    elif not in_range:
        why += f"; {s.train_conversations // 2:,} training conversations only"
    return Claim(
        f"predictor MCC ({embedder} embedder)",
        "A.3, Table 3",
        "0.28 to 0.36 (Chatbot-Arena 0.3689)",
        f"{value:.3f}",
        "agree" if in_range else "differ",
        why,
    )


def _draw_predictor(fig: Figure, rows: list[Row]) -> None:
    ax = fig.subplots()
    names = [str(r["predictor"]).replace(", ", "\n") for r in rows]
    vals = [float(r["mcc"] or 0.0) for r in rows]
    ax.bar(range(len(rows)), vals, color="#1f77b4")
    ax.axhspan(0.28, 0.37, color="#ff7f0e", alpha=0.2, label="paper: 0.28-0.37 (Table 3)")
    ax.set_xticks(range(len(rows)), names, fontsize="small")
    ax.set_ylabel("MCC (held-out conversations)")
    ax.set_title("Continuation predictor")
    ax.legend(loc="upper left", fontsize="small")


def _size_for(hit: float, sizes: list[int], hits: list[float]) -> float:
    """Capacity a policy needs for ``hit``, by linear interpolation on its curve (nan when
    the hit is outside the curve)."""
    curve = np.maximum.accumulate(np.array(hits))
    if hit < curve[0] or hit > curve[-1]:
        return math.nan
    return float(np.interp(hit, curve, np.array(sizes, dtype=float)))


@register("lpc-savings")
class LPCSavings(Reproduction):
    paper = "LPC (lpc-summary-zh.md)"
    target = "Sec. 4.3, Fig. 4 (with B.4, Fig. 9 and A.2, Fig. 8)"
    title = "Cache LPC saves over LRU at equal hit ratio, and the gap to the oracle it closes"

    def run(self, scale: Scale) -> Outcome:
        from prefixlab.runner.replay import ReplayConfig, replay
        from prefixlab.workload.generators import GENERATORS

        s = SETUPS[scale]
        models = {e: _trained(scale, e)[0] for e in s.embedders}
        full = GENERATORS["lpc"].fn(
            num_conversations=s.replay_conversations, seed=11, lambda_chat=100.0, n_conv=200
        )
        trace = full.take(np.flatnonzero(full.arrival_s < s.minutes * 60.0))
        sizes = [t // BLOCK for t in s.capacity_tokens]
        specs = {
            "lru": "lru",
            "lpc": f"lpc:model={models['hashed']}",
            "lpc_no_memory": f"lpc:model={models['hashed']},predictor_bytes=0",
            "oracle": "lpc-oracle",
        }
        if "minilm" in models:
            specs["lpc_minilm"] = f"lpc:model={models['minilm']}"
        curves: dict[str, list[float]] = {k: [] for k in specs}
        for blocks in sizes:
            cfg = ReplayConfig(capacity_blocks=blocks, block_tokens=BLOCK, model=MODEL)
            for key, spec in specs.items():
                curves[key].append(float(replay(trace, spec, cfg).metrics["token_hit_ratio"]))
        table: list[Row] = []
        for i, blocks in enumerate(sizes):
            lru, lpc, orc = curves["lru"][i], curves["lpc"][i], curves["oracle"][i]
            need = _size_for(lru, sizes, curves["lpc"])
            table.append(
                {
                    "capacity_tokens": s.capacity_tokens[i],
                    "capacity_gib": blocks * BLOCK * 2**18 / 2**30,
                    "lru": lru,
                    "lpc": lpc,
                    "lpc_without_its_memory": curves["lpc_no_memory"][i],
                    **({"lpc_minilm": curves["lpc_minilm"][i]} if "lpc_minilm" in curves else {}),
                    "oracle": orc,
                    "lpc_tokens_for_lru_hit": need * BLOCK if not math.isnan(need) else None,
                    "cache_saved": 1 - need / blocks if not math.isnan(need) else None,
                    "hit_gain_over_lru": lpc / lru - 1 if lru else None,
                    "gap_closed": (lpc - lru) / (orc - lru) if orc > lru else None,
                }
            )
        return Outcome(table, _savings_claims(table), _draw_savings, _savings_notes(s, trace))


def _span(rows: list[Row], key: str) -> tuple[float, float] | None:
    vals = [float(v) for r in rows if isinstance(v := r[key], float) and not math.isnan(v)]
    return (min(vals), max(vals)) if vals else None


def _pct(span: tuple[float, float] | None) -> str:
    return "none measured" if span is None else f"{span[0]:.1%} to {span[1]:.1%}"


_SAVINGS_WHY = (
    "the conversations are synthetic (the paper's LMSys, ShareGPT and Chatbot-Arena "
    "traces are not available offline). Measured here: the predictor is of the paper's "
    "quality (MCC about 0.3, lpc-predictor), the oracle has the headroom (its hit "
    "ratio is 1.3-2.2x LRU's), and the 1 GiB costs what A.2 reports; yet a predictor of "
    "that MCC turns a smaller share of the headroom into hits than the paper's. Which "
    "requests a predictor gets right, and how many blocks ride on them, MCC does not "
    "say, and only the real conversations could; the turns also arrive open loop (the "
    "paper's next turn waits for the reply)"
)


def _overlap_verdict(span: tuple[float, float] | None, lo: float, hi: float) -> str:
    """agree: our range overlaps the paper's."""
    return "agree" if span and span[1] >= lo and span[0] <= hi else "differ"


def _savings_claims(rows: list[Row]) -> list[Claim]:
    saved, gain, gap = (
        _span(rows, "cache_saved"),
        _span(rows, "hit_gain_over_lru"),
        _span(rows, "gap_closed"),
    )
    cost = [num(r["lpc_without_its_memory"]) / num(r["lpc"]) - 1 for r in rows if r["lpc"]]
    return [
        Claim(
            "cache saved at LRU's hit ratio",
            "Sec. 4.3, Fig. 4 caption (A1)",
            "18% to 47% (7.2-18.8 GB of 40 GB)",
            _pct(saved),
            _overlap_verdict(saved, 0.18, 0.47),
            _SAVINGS_WHY,
        ),
        Claim(
            "hit-ratio gain over LRU",
            "Sec. 4.3",
            "LMSys 13-38%, ShareGPT 14-98%, Chatbot-Arena 15-30%",
            _pct(gain),
            _overlap_verdict(gain, 0.13, 0.98),
            _SAVINGS_WHY,
        ),
        Claim(
            "share of the LRU-to-oracle gap closed",
            "B.4, Fig. 9",
            "LMSys 22-30%, ShareGPT 28-64%, Chatbot-Arena 25-28%",
            _pct(gap),
            _overlap_verdict(gap, 0.22, 0.64),
            _SAVINGS_WHY,
        ),
        Claim(
            "hit ratio lost to the predictor's 1 GB",
            "A.2, Fig. 8",
            "0.6-2.4% at 160K tokens, 2.3-8.1% at 64K tokens",
            f"{min(cost):.1%} to {max(cost):.1%}" if cost else "none measured",
            "n/a",
            "the smaller the cache, the larger the share its 256 blocks take",
        ),
    ]


def _savings_notes(s: Setup, trace: object) -> list[str]:
    from prefixlab.workload.trace import Trace

    assert isinstance(trace, Trace)
    return [
        f"{len(trace):,} requests: the first {s.minutes:g} minutes of {s.replay_conversations:,} "
        "synthetic conversations (`lpc` generator, seed 11, lambda_chat 100 s, N_conv 200), "
        f"{int(trace.input_length.sum()):,} input tokens; replay runner.",
        "Qwen3-32B, 16-token blocks; `lpc` (the hashed embedder's predictor, MCC about 0.3) "
        "gives 1 GiB (256 blocks) to its predictor, `lpc_without_its_memory` does not (A.2's "
        "x0); `lpc_minilm` uses MiniLM's predictor (paper scale); the oracle knows which "
        "conversations go on and is not charged.",
        "cache_saved: 1 - (capacity LPC needs for LRU's hit ratio, interpolated on its "
        "curve) / capacity; empty where LRU's hit ratio is off LPC's curve.",
    ]


def _draw_savings(fig: Figure, rows: list[Row]) -> None:
    ax = fig.subplots()
    x = [num(r["capacity_tokens"]) / 1000 for r in rows]
    for key, label, style in (
        ("lru", "LRU", "o-"),
        ("lpc", "LPC", "s-"),
        ("oracle", "Oracle", "^--"),
    ):
        ax.plot(x, [num(r[key]) for r in rows], style, label=label)
    ax.set_xlabel("cache capacity (K tokens, Qwen3-32B)")
    ax.set_ylabel("token hit ratio")
    ax.set_title("Hit ratio vs cache size (lambda_chat = 100 s; the paper's Fig. 4)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
