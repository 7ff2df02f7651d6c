"""LPC's continuation predictor: embedding + turn count -> P(the conversation continues).

Training (scikit-learn, the ``learn`` extra): a 3-layer MLP (two hidden layers of 128 ReLU
units, a sigmoid output), Adam at lr 5e-4, minibatches of 64, up to 20 epochs, binary
cross-entropy with the minority class weighted up to balance the classes; the weights of
the epoch with the lowest validation loss are kept. Conversations are split in halves by
a seeded hash: one half trains (10% of it validates), the other evaluates, so no
conversation is on both sides.

Inference needs only numpy: the weights are exported (``.npz`` + JSON) and the forward
pass is a few matrix products, so the simulator's ``lpc`` policy does not import sklearn.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.learn.embedders import cached_embed, get_embedder
from prefixlab.learn.features import FeatureConfig, Features, build_features, window_texts
from prefixlab.types import B1, F32, F64, I64, JSON
from prefixlab.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class TrainConfig:
    embedder: str = "hashed"
    tokenizer: str = "llama3"
    history: int = 4
    token_budget: int = 512
    #: also embed the model's replies (``reply_text``), not only the user prompts
    replies: bool = False
    hidden: int = 128
    lr: float = 5e-4
    epochs: int = 20
    batch_size: int = 64
    validation: float = 0.1
    seed: int = 0

    def features(self) -> FeatureConfig:
        return FeatureConfig(self.history, self.token_budget, self.replies)


def split_conversations(sessions: list[str], seed: int, fraction: float = 0.5) -> B1:
    """True for the rows whose conversation falls in the first part (a seeded hash)."""
    out = np.zeros(len(sessions), dtype=bool)
    memo: dict[str, bool] = {}
    for i, s in enumerate(sessions):
        if s not in memo:
            h = hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest()
            memo[s] = int.from_bytes(h, "little") / 2**64 < fraction
        out[i] = memo[s]
    return out


def inputs(x: F32, turns: I64) -> F32:
    """The classifier's input: the embedding and log(1 + turn count)."""
    t = np.log1p(turns.astype(np.float32))[:, None]
    out: F32 = np.hstack([x, t]).astype(np.float32)
    return out


@dataclass(slots=True)
class ContinuationPredictor:
    """The exported MLP: ``(W, b)`` per layer, ReLU between, a sigmoid at the end."""

    weights: list[F64]
    biases: list[F64]
    config: TrainConfig
    threshold: float = 0.5
    history: dict[str, JSON] = field(default_factory=dict)

    def predict_proba(self, x: F32) -> F64:
        h: F32 | F64 = x  # float32 rows times float64 weights: float64 activations, no copy
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w
            h += b
            if i < len(self.weights) - 1:
                np.maximum(h, 0.0, out=h)
        z = h[:, 0]
        out: F64 = 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic, without exp overflow
        return out

    def predict_trace(self, trace: Trace, embed_cache: str | Path | None = None) -> F64:
        """P(continue) for every request of a text-bearing trace (``embed_cache``: a folder
        keeping the embeddings on disk, see :func:`cached_embed`)."""
        feats = build_features(trace, self.config.tokenizer, self.config.features())
        return self.predict_features(feats, embed_cache)

    def predict_features(self, feats: Features, embed_cache: str | Path | None = None) -> F64:
        """P(continue) for features already built with this model's configuration."""
        x = embed_features(self.config, feats, embed_cache)
        return self.predict_proba(inputs(x, feats.turns))

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """``PATH.npz`` (weights) and ``PATH.json`` (config, training history)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"w{i}": w for i, w in enumerate(self.weights)}
        arrays.update({f"b{i}": b for i, b in enumerate(self.biases)})
        np.savez(p.with_suffix(".npz"), **arrays)  # type: ignore[arg-type]
        meta = {
            "config": asdict(self.config),
            "threshold": self.threshold,
            "layers": len(self.weights),
            "history": self.history,
        }
        p.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return p.with_suffix(".npz")

    @classmethod
    def load(cls, path: str | Path) -> ContinuationPredictor:
        p = Path(path)
        meta_path, npz_path = p.with_suffix(".json"), p.with_suffix(".npz")
        if not meta_path.is_file() or not npz_path.is_file():
            raise ConfigError(
                f"{p}: no LPC model here (expected {npz_path.name} and {meta_path.name})"
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            data = np.load(npz_path)
            n = int(meta["layers"])
            weights = [data[f"w{i}"].astype(np.float64) for i in range(n)]
            biases = [data[f"b{i}"].astype(np.float64) for i in range(n)]
            config = TrainConfig(**meta["config"])
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise ConfigError(f"{p}: not a valid LPC model ({exc})") from None
        return cls(
            weights,
            biases,
            config,
            float(meta.get("threshold", 0.5)),
            dict(meta.get("history", {})),
        )


def embed_features(cfg: TrainConfig, feats: Features, embed_cache: str | Path | None) -> F32:
    """The windows' embeddings under ``cfg``'s embedder (memoised; on disk with a folder)."""
    emb = get_embedder(cfg.embedder)
    texts = (lambda: window_texts(feats, cfg.tokenizer)) if emb.needs_text else None
    return cached_embed(emb, feats, texts, embed_cache)


def _bce(p: F64, y: B1, w: F64) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    yf = y.astype(np.float64)
    loss = -(yf * np.log(p) + (1.0 - yf) * np.log(1 - p))
    return float((loss * w).sum() / w.sum())


def class_weights(y: B1) -> F64:
    """Per-row weights that balance the classes (the minority class weighs more)."""
    pos = int(y.sum())
    neg = int(y.shape[0] - pos)
    if pos == 0 or neg == 0:
        return np.ones(y.shape[0])
    w_pos, w_neg = y.shape[0] / (2 * pos), y.shape[0] / (2 * neg)
    out: F64 = np.where(y, w_pos, w_neg).astype(np.float64)
    return out


def train(
    trace: Trace, config: TrainConfig | None = None, embed_cache: str | Path | None = None
) -> tuple[ContinuationPredictor, B1]:
    """Train on one half of the conversations; returns the predictor and the train mask
    (evaluate on ``~mask``). The embeddings are computed once for all epochs."""
    cfg = config or TrainConfig()
    try:  # before the features are built: _fit_best uses it
        from sklearn.neural_network import MLPClassifier  # noqa: F401
    except ImportError:
        raise ConfigError(
            "training LPC needs scikit-learn: pip install 'prefixlab[learn]'"
        ) from None
    feats = build_features(trace, cfg.tokenizer, cfg.features())
    x = inputs(embed_features(cfg, feats, embed_cache), feats.turns)
    y = feats.labels
    train_mask = split_conversations(feats.sessions, cfg.seed)
    val_mask = train_mask & split_conversations(feats.sessions, cfg.seed + 1, cfg.validation)
    fit_mask = train_mask & ~val_mask
    if fit_mask.sum() < 10 or val_mask.sum() < 2 or len(set(y[fit_mask].tolist())) < 2:
        raise ConfigError(
            f"{trace.name}: too few conversations to train on ({int(fit_mask.sum())} training "
            "rows with both labels needed)"
        )
    best, losses = _fit_best(cfg, x[fit_mask], y[fit_mask], x[val_mask], y[val_mask])
    history: dict[str, JSON] = {
        "val_loss": losses,
        "best_epoch": best[3],
        "train_rows": int(fit_mask.sum()),
        "val_rows": int(val_mask.sum()),
    }
    pred = ContinuationPredictor(best[1], best[2], cfg, 0.5, history)
    return pred, train_mask


def _fit_best(
    cfg: TrainConfig, xf: F32, yf: B1, xv: F32, yv: B1
) -> tuple[tuple[float, list[F64], list[F64], int], list[JSON]]:
    """Fit the MLP epoch by epoch on ``(xf, yf)``: the epoch with the lowest validation loss
    on ``(xv, yv)`` (its loss, weights, biases, 1-based epoch), and every epoch's loss."""
    from sklearn.neural_network import MLPClassifier

    wf = class_weights(yf)
    wv = class_weights(yv)
    clf = MLPClassifier(
        hidden_layer_sizes=(cfg.hidden, cfg.hidden),
        activation="relu",
        solver="adam",
        learning_rate_init=cfg.lr,
        batch_size=cfg.batch_size,
        random_state=cfg.seed,
        shuffle=True,
    )
    best: tuple[float, list[F64], list[F64], int] | None = None
    losses: list[JSON] = []
    for epoch in range(cfg.epochs):
        clf.partial_fit(xf, yf, classes=np.array([False, True]), sample_weight=wf)
        pv = clf.predict_proba(xv)[:, 1]
        loss = _bce(pv, yv, wv)
        losses.append(loss)
        if best is None or loss < best[0]:
            # float64 copies: the same numbers a saved and reloaded model computes with
            best = (
                loss,
                [w.astype(np.float64) for w in clf.coefs_],
                [b.astype(np.float64) for b in clf.intercepts_],
                epoch + 1,
            )
    assert best is not None
    return best, losses


@dataclass(frozen=True, slots=True)
class Evaluation:
    mcc: float
    f1_macro: float
    turns_only_mcc: float
    num_examples: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"MCC {self.mcc:.3f}, macro-F1 {self.f1_macro:.3f}, turns-only MCC "
            f"{self.turns_only_mcc:.3f} ({self.num_examples:,} requests)"
        )


def mcc(y: B1, p: B1) -> float:
    tp = float(np.count_nonzero(y & p))
    tn = float(np.count_nonzero(~y & ~p))
    fp = float(np.count_nonzero(~y & p))
    fn = float(np.count_nonzero(y & ~p))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / den if den else 0.0


def f1_macro(y: B1, p: B1) -> float:
    scores = []
    for cls in (True, False):
        tp = float(np.count_nonzero((y == cls) & (p == cls)))
        fp = float(np.count_nonzero((y != cls) & (p == cls)))
        fn = float(np.count_nonzero((y == cls) & (p != cls)))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / 2


def turns_only(train_turns: I64, train_y: B1, test_turns: I64) -> B1:
    """The ablation: the majority label of the training rows with the same turn count (the
    overall majority for turn counts never seen)."""
    overall = bool(train_y.mean() >= 0.5) if train_y.shape[0] else False
    table: dict[int, bool] = {}
    for t in np.unique(train_turns).tolist():
        table[t] = bool(train_y[train_turns == t].mean() >= 0.5)
    return np.array([table.get(t, overall) for t in test_turns.tolist()], dtype=bool)


def evaluate(
    pred: ContinuationPredictor,
    trace: Trace,
    train_mask: B1 | None = None,
    all_rows: bool = False,
    embed_cache: str | Path | None = None,
) -> Evaluation:
    """MCC and macro-F1 on the rows outside ``train_mask`` (default: the seeded split's
    held-out half), and the turns-only ablation fitted on the training rows. ``all_rows``
    scores every request (a trace the model never saw); the ablation is then fitted on
    all of them too, in sample, which flatters it."""
    feats = build_features(trace, pred.config.tokenizer, pred.config.features())
    if train_mask is None:
        train_mask = split_conversations(feats.sessions, pred.config.seed)
    test = np.ones(len(feats), dtype=bool) if all_rows else ~train_mask
    fit = test if all_rows else train_mask
    prob = pred.predict_features(feats, embed_cache)  # the features are built once
    y = feats.labels
    guess = prob[test] >= pred.threshold
    base = turns_only(feats.turns[fit], y[fit], feats.turns[test])
    return Evaluation(
        mcc(y[test], guess), f1_macro(y[test], guess), mcc(y[test], base), int(test.sum())
    )
