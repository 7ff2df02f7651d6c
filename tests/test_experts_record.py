"""Recording expert routing from tiny randomly initialised transformers MoE models.

The expected experts come from forward hooks on each layer's router module, which returns the
experts the model itself dispatched to; the recorder only sees ``outputs.router_logits``, so a
mislabelled layer, token or prompt makes these tests fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

try:
    import torch
    import transformers
except ImportError as exc:  # CI installs the moe extra and sets PREFIXLAB_REQUIRE_ST: fail there
    if os.environ.get("PREFIXLAB_REQUIRE_ST"):
        raise AssertionError(f"PREFIXLAB_REQUIRE_ST is set but {exc}") from None
    pytest.skip(f"needs torch and transformers ({exc})", allow_module_level=True)

from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.experts import prompts, record
from prefixlab.experts.record import RoutingRow

VOCAB = 300
TINY = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    # Wide weights make routing decisive, so float noise between batch shapes cannot flip
    # an expert choice.
    "initializer_range": 0.3,
    "eos_token_id": None,
    "bos_token_id": None,
    "pad_token_id": None,
}
PROMPTS = [[5, 17, 42, 99, 250, 7, 3], [11, 12], [200, 201, 202, 203], [9]]


def _save(tmp_path: Path, name: str, config: Any, cls: Any) -> Path:
    torch.manual_seed(0)
    path = tmp_path / name
    cls(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **TINY)
    return _save(tmp_path_factory.mktemp("m"), "mixtral", cfg, transformers.MixtralForCausalLM)


@pytest.fixture(scope="module")
def mixtral(mixtral_dir: Path) -> Any:
    return record.load_model(str(mixtral_dir))


def _hooked_routing(model: Any, prompt: list[int], new_tokens: int) -> tuple[Any, Any, list[int]]:
    """Experts and weights the model's own routers chose, ``[tokens, moe_layers, k]`` each,
    for ``prompt`` and ``new_tokens`` greedy tokens (run by ``generate``), and the token ids."""
    gates = [ly.mlp.gate for ly in model.model.layers if hasattr(ly.mlp, "gate")]
    calls: list[list[tuple[Any, Any]]] = [[] for _ in gates]

    def hook(i: int) -> Any:
        def fn(_mod: Any, _inp: Any, out: Any) -> None:
            calls[i].append((out[2], out[1]))  # (router_indices, router_scores)

        return fn

    handles = [g.register_forward_hook(hook(i)) for i, g in enumerate(gates)]
    try:
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            if new_tokens:
                # generate feeds the prompt and then new_tokens - 1 tokens: ask for one more.
                ids = model.generate(ids, max_new_tokens=new_tokens + 1, do_sample=False)
                ids = ids[:, :-1]
            else:
                model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    experts = torch.stack([torch.cat([c[0] for c in layer]) for layer in calls], dim=1)
    weights = torch.stack([torch.cat([c[1] for c in layer]) for layer in calls], dim=1)
    return experts, weights, ids[0].tolist()


def _check_against_hooks(
    model: Any, rows: list[RoutingRow], prompts: list[list[int]], new_tokens: int
) -> None:
    by_key = {(r.prompt_idx, r.position, r.layer): r for r in rows}
    for p_idx, prompt in enumerate(prompts):
        experts, weights, token_ids = _hooked_routing(model, prompt, new_tokens)
        assert experts.shape[0] == len(prompt) + new_tokens
        for pos in range(experts.shape[0]):
            for layer in range(experts.shape[1]):
                row = by_key[(p_idx, pos, layer)]
                assert row.experts == experts[pos, layer].tolist()
                assert row.gating_probs == pytest.approx(weights[pos, layer].tolist(), abs=1e-5)
                assert row.token_id == token_ids[pos]


def _check_rows(
    rows: list[RoutingRow], lengths: list[int], num_layers: int, k: int, n: int
) -> None:
    """One row per (token, layer), token-major; token_idx continuous across prompts."""
    expected = [
        (layer, p_idx, pos)
        for p_idx, length in enumerate(lengths)
        for pos in range(length)
        for layer in range(num_layers)
    ]
    assert [(r.layer, r.prompt_idx, r.position) for r in rows] == expected
    assert [r.token_idx for r in rows] == [i // num_layers for i in range(len(rows))]
    for r in rows:
        assert len(r.experts) == k == len(set(r.experts))
        assert all(0 <= e < n for e in r.experts)
        assert all(0.0 <= p <= 1.0 for p in r.gating_probs)
        assert r.gating_probs == sorted(r.gating_probs, reverse=True)


def test_prefill_rows_cover_every_token_and_match_the_routers(mixtral: Any) -> None:
    rows = record.record_routing(mixtral, PROMPTS, batch_size=3)
    _check_rows(rows, [len(p) for p in PROMPTS], num_layers=3, k=2, n=4)
    # Mixtral renormalises its top-k weights.
    assert all(sum(r.gating_probs) == pytest.approx(1.0, abs=1e-6) for r in rows)
    assert [r.token_id for r in rows[::3]] == [t for p in PROMPTS for t in p]
    _check_against_hooks(mixtral, rows, PROMPTS, new_tokens=0)
    # Not all routing is the same expert pair (the check above is not vacuous).
    assert len({tuple(r.experts) for r in rows}) > 3


def test_decode_tokens_are_recorded_and_match_generate(mixtral: Any) -> None:
    prompts = PROMPTS[:2]
    rows = record.record_routing(mixtral, prompts, max_new_tokens=3)
    _check_rows(rows, [len(p) + 3 for p in prompts], num_layers=3, k=2, n=4)
    _check_against_hooks(mixtral, rows, prompts, new_tokens=3)


def test_batched_equals_one_at_a_time_and_is_deterministic(mixtral: Any) -> None:
    one = record.record_routing(mixtral, PROMPTS, batch_size=1)
    for batch in (2, 4, 8):
        other = record.record_routing(mixtral, PROMPTS, batch_size=batch)
        assert [(r.layer, r.token_idx, r.experts, r.token_id) for r in other] == [
            (r.layer, r.token_idx, r.experts, r.token_id) for r in one
        ]
        for a, b in zip(one, other, strict=True):
            assert a.gating_probs == pytest.approx(b.gating_probs, abs=1e-5)
    assert record.record_routing(mixtral, PROMPTS, batch_size=1) == one
    # Decode rows start with the prefill rows of the same prompt.
    decoded = record.record_routing(mixtral, PROMPTS[:1], max_new_tokens=2)
    prefill = [r for r in one if r.prompt_idx == 0]
    assert [r.experts for r in decoded[: len(prefill)]] == [r.experts for r in prefill]


def test_top_k_and_renormalize_options(mixtral: Any) -> None:
    full = record.record_routing(mixtral, PROMPTS[:2], top_k=4)
    for r in full:
        assert sorted(r.experts) == [0, 1, 2, 3]
        assert sum(r.gating_probs) == pytest.approx(1.0, abs=1e-6)
    raw = record.record_routing(mixtral, PROMPTS[:2], renormalize=False)
    for r, f in zip(raw, full[: len(raw)], strict=True):
        # Without renormalising, the top-2 are the full softmax's first two probabilities.
        assert r.experts == f.experts[:2]
        assert r.gating_probs == pytest.approx(f.gating_probs[:2], abs=1e-6)
        assert sum(r.gating_probs) < 1.0
    with pytest.raises(ConfigError, match="top_k=5"):
        record.record_routing(mixtral, PROMPTS, top_k=5)


def test_bad_inputs_raise_config_errors(mixtral: Any) -> None:
    with pytest.raises(ConfigError, match=r"prompt 1 has token id 300 .*vocab_size 300"):
        record.record_routing(mixtral, [[1, 2], [3, 300]])
    with pytest.raises(ConfigError, match="prompt 0 has no tokens"):
        record.record_routing(mixtral, [[]])
    with pytest.raises(ConfigError, match="max_position_embeddings 128"):
        record.record_routing(mixtral, [[1] * 120], max_new_tokens=9)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        record.record_routing(mixtral, PROMPTS, max_new_tokens=-1)
    with pytest.raises(ConfigError, match="batch_size"):
        record.record_routing(mixtral, PROMPTS, batch_size=0)
    with pytest.raises(ConfigError, match="top_k must be >= 1, got 0"):
        record.record_routing(mixtral, PROMPTS, top_k=0)
    with pytest.raises(ConfigError, match="dtype"):
        record.load_model("anything", dtype="int8")
    assert record.record_routing(mixtral, []) == []


@pytest.mark.parametrize("arch", ["qwen2_moe", "olmoe"])
def test_other_architectures(tmp_path: Path, arch: str) -> None:
    if arch == "qwen2_moe":
        # Layer 0 is dense: recorded layers are the 2 MoE layers, and full-softmax weights.
        cfg = transformers.Qwen2MoeConfig(
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            mlp_only_layers=[0],
            norm_topk_prob=False,
            **TINY,
        )
        cls, num_layers, n, k = transformers.Qwen2MoeForCausalLM, 2, 6, 2
    else:
        cfg = transformers.OlmoeConfig(
            num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, **TINY
        )
        cls, num_layers, n, k = transformers.OlmoeForCausalLM, 3, 8, 3
    model = record.load_model(str(_save(tmp_path, arch, cfg, cls)))
    assert record.probe_router(model) == record.RouterInfo(num_layers, n, k)
    rows = record.record_routing(model, PROMPTS, batch_size=2, max_new_tokens=0)
    _check_rows(rows, [len(p) for p in PROMPTS], num_layers=num_layers, k=k, n=n)
    _check_against_hooks(model, rows, PROMPTS, new_tokens=0)
    sums = [sum(r.gating_probs) for r in rows]
    if arch == "qwen2_moe":
        assert max(sums) < 1.0 - 1e-3
    else:
        assert sums == pytest.approx([1.0] * len(sums), abs=1e-6)


def test_non_moe_model_is_refused(tmp_path: Path) -> None:
    cfg = transformers.LlamaConfig(**TINY)
    path = _save(tmp_path, "llama", cfg, transformers.LlamaForCausalLM)
    with pytest.raises(ConfigError, match=r"exposes no router logits"):
        record.load_model(str(path))
    model = transformers.LlamaForCausalLM(cfg)
    with pytest.raises(ConfigError, match=r"exposes no router logits"):
        record.record_routing(model, PROMPTS)


def test_biased_router_is_refused() -> None:
    cfg = transformers.DeepseekV3Config(
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=0,
        moe_intermediate_size=16,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        **TINY,
    )
    model = transformers.DeepseekV3ForCausalLM(cfg)
    with pytest.raises(ConfigError, match=r"topk_group=1\); bias-corrected"):
        record.probe_router(model)
    with pytest.raises(ConfigError, match="does not route by softmax top-k"):
        record.record_routing(model, PROMPTS)


def test_missing_model_and_offline_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The constant is read at import time; patch it so no request (and no retry wait) happens.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"could not load model 'nobody/no-such-moe' \(hub id\)"):
        record.load_model("nobody/no-such-moe")
    with pytest.raises(ConfigError, match=r"could not load model .* \(local folder\)"):
        record.load_model(str(tmp_path))


def test_read_prompts(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\n  second one  \n", encoding="utf-8")
    assert prompts.read_prompts(text) == ["first prompt", "  second one  "]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n\n{"text": "b", "id": 3}\n', encoding="utf-8")
    assert prompts.read_prompts(jsonl) == ["a", "b"]
    bad = {
        '{"prompt": "a"}\n{oops\n': (2, None, "not valid JSON"),
        '{"prompt": "a"}\n[1]\n': (2, None, "JSON object"),
        '{"q": "a"}\n': (1, "prompt", "missing"),
        '{"text": 5}\n': (1, "text", "must be a string"),
    }
    for content, (line, field, message) in bad.items():
        jsonl.write_text(content, encoding="utf-8")
        with pytest.raises(TraceFormatError, match=message) as info:
            prompts.read_prompts(jsonl)
        assert (info.value.path, info.value.line, info.value.field) == (str(jsonl), line, field)
    with pytest.raises(ConfigError, match="not found"):
        prompts.read_prompts(tmp_path / "none.txt")
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no prompt"):
        prompts.read_prompts(tmp_path / "empty.txt")


def test_tokenizers(mixtral_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tokenizer AutoTokenizer can load"):
        prompts.load_tokenizer(str(mixtral_dir))
    ids = prompts.tokenize_prompts(["ab", "~"], prompts.load_tokenizer(str(mixtral_dir), "bytes"))
    assert ids == [[97, 98], [126]]
    with pytest.raises(ConfigError, match=r"prompt 1: tokenizer bytes gave id 126 .* 100 ids"):
        prompts.tokenize_prompts(["ab", "~"], "bytes", vocab_size=100)
    # A model folder with its own tokenizer: it is used, with its special tokens (BOS).
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<s>": 0, "<unk>": 1, "hello": 2, "world": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", unk_token="<unk>"
    )
    fast.save_pretrained(tmp_path / "tok")
    own = prompts.load_tokenizer(str(tmp_path / "tok"))
    assert isinstance(own, prompts.ModelTokenizer)
    assert prompts.tokenize_prompts(["hello world", "world x"], own) == [[0, 2, 3], [0, 3, 1]]


def test_write_rows_and_record_file(mixtral_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\nexpert caching\n", encoding="utf-8")
    out = tmp_path / "new" / "deeper" / "routing.jsonl"  # the folders are created
    summary = record.record_file(
        str(mixtral_dir), prompts, out, tokenizer="bytes", max_new_tokens=2, batch_size=2
    )
    num_tokens = len("hi") + len("expert caching") + 2 * 2
    assert summary == record.RecordSummary(
        model=str(mixtral_dir),
        num_prompts=2,
        num_tokens=num_tokens,
        num_layers=3,
        num_experts=4,
        top_k=2,
        num_rows=num_tokens * 3,
    )
    head, *lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert (head["num_layers"], head["num_experts"]) == (3, 4)
    assert len(lines) == num_tokens * 3
    keys = ["layer", "token_idx", "experts", "gating_probs", "prompt_idx", "position", "token_id"]
    assert all(list(x) == keys for x in lines)
    model = record.load_model(str(mixtral_dir))
    rows = record.record_routing(model, [list(b"hi"), list(b"expert caching")], max_new_tokens=2)
    assert [RoutingRow(**x) for x in lines] == rows
    # the trace loader reads the file back: top-2 routing becomes 2 rounds per token
    from prefixlab.experts.trace_io import load_expert_trace

    trace = load_expert_trace(out)
    assert (trace.num_layers, trace.num_experts, trace.num_tokens) == (3, 4, num_tokens)
    first = [r.experts[0] for r in rows[:3]]
    second = [r.experts[1] for r in rows[:3]]
    assert trace.expert[:6].tolist() == first + second


@pytest.fixture
def model_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models ``AutoModelForCausalLM`` was asked for; every load fails (as if the hub id
    were a multi-GB download that never finishes)."""
    calls: list[str] = []

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        raise OSError("no download in tests")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    return calls


BAD_ARGUMENTS = {
    "missing prompts": ({"prompts": "none.txt"}, ConfigError, "prompts file not found"),
    "empty prompts": ({"prompts": "empty.txt"}, ConfigError, "holds no prompt"),
    "bad JSONL prompts": ({"prompts": "bad.jsonl"}, TraceFormatError, "not valid JSON"),
    "batch_size 0": ({"batch_size": 0}, ConfigError, "batch_size must be >= 1, got 0"),
    "max_new_tokens -1": ({"max_new_tokens": -1}, ConfigError, "max_new_tokens must be >= 0"),
    "top_k 0": ({"top_k": 0}, ConfigError, "top_k must be >= 1, got 0"),
    "dtype int8": ({"dtype": "int8"}, ConfigError, "dtype 'int8' is not one of"),
    "tokenizer spec": ({"tokenizer": "no-such-tok"}, ConfigError, "unknown tokenizer"),
    "out under a file": ({"out": "a_file/r.jsonl"}, ConfigError, "cannot create the output"),
    "out is a folder": ({"out": "a_folder"}, ConfigError, r"a_folder is a folder"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_record_file_checks_arguments_before_loading_the_model(
    tmp_path: Path, model_loads: list[str], case: str
) -> None:
    (tmp_path / "p.txt").write_text("hi\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    (tmp_path / "bad.jsonl").write_text("{oops\n", encoding="utf-8")
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    (tmp_path / "a_folder").mkdir()
    changes, error, message = BAD_ARGUMENTS[case]
    args: dict[str, Any] = {"prompts": "p.txt", "out": "r.jsonl", "tokenizer": "bytes"}
    args.update(changes)
    prompts_path, out = tmp_path / args.pop("prompts"), tmp_path / args.pop("out")
    with pytest.raises(error, match=message):
        record.record_file("nobody/huge-moe", prompts_path, out, **args)
    assert model_loads == []
    assert not out.is_file()


def test_record_file_loads_the_model_after_the_checks(
    tmp_path: Path, model_loads: list[str]
) -> None:
    # The spy is not vacuous: good arguments reach the model load, after the output folder.
    good = tmp_path / "p.txt"
    good.write_text("hi\n", encoding="utf-8")
    out = tmp_path / "new" / "r.jsonl"
    with pytest.raises(ConfigError, match="could not load model 'nobody/huge-moe'"):
        record.record_file("nobody/huge-moe", good, out, tokenizer="bytes")
    assert model_loads == ["nobody/huge-moe"]
    assert out.parent.is_dir() and not out.exists()


def test_record_file_checks_top_k_before_the_inference_pass(
    mixtral_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[int] = []

    def no_pass(model: Any, token_ids: Any, **kwargs: Any) -> Any:
        passes.append(len(token_ids))
        raise AssertionError("inference pass")

    monkeypatch.setattr(record, "record_routing", no_pass)
    good = tmp_path / "p.txt"
    good.write_text("hi\n", encoding="utf-8")
    out = tmp_path / "r.jsonl"
    # No tokenizer spec either: the folder has no tokenizer, so top_k is checked before it.
    with pytest.raises(ConfigError, match="top_k=5 must be between 1 and the 4 experts"):
        record.record_file(str(mixtral_dir), good, out, top_k=5)
    assert passes == []
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [([], "prompts file not found"), (["--batch-size", "0"], "batch_size must be >= 1")],
)
def test_record_command_fails_early_with_one_line(
    tmp_path: Path, model_loads: list[str], option: list[str], message: str
) -> None:
    prompts_path = tmp_path / ("p.txt" if option else "none.txt")
    if option:
        prompts_path.write_text("hi\n", encoding="utf-8")
    args = [
        "experts",
        "record",
        "--model",
        "nobody/huge-moe",
        "--prompts",
        str(prompts_path),
        "-o",
        str(tmp_path / "r.jsonl"),
        "--tokenizer",
        "bytes",
        *option,
    ]
    result = CliRunner().invoke(app, args)
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1, out
    assert out.startswith("error:") and message in out, out
    assert model_loads == []
