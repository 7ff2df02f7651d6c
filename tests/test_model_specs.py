"""Current models' specs: MLA, sliding-window and linear-attention / SSM hybrids, read
from their published config.json; bytes, FLOPs and weights by hand; tensor parallelism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.model.deploy import kv_budget
from prefixlab.model.hf import from_hf_config, load_model_file
from prefixlab.model.presets import CONFIG_DIR, MODEL_PRESETS
from prefixlab.model.spec import ModelSpec, get_model
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import _kernel as K
from prefixlab.runner.engine import simulator as sim

FROM_CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def test_every_shipped_config_is_a_preset() -> None:
    assert FROM_CONFIGS == [
        "deepseek-v3",
        "gemma-3-12b",
        "gemma-3-27b",
        "gpt-oss-120b",
        "gpt-oss-20b",
        "jamba-1.5-mini",
        "kimi-k2",
        "nemotron-h-8b",
        "qwen3-next-80b-a3b",
    ]
    for name in FROM_CONFIGS:
        loaded = load_model_file(str(CONFIG_DIR / f"{name}.json"))
        assert MODEL_PRESETS[name] == ModelSpec(**{**_fields(loaded), "name": name})


def _fields(m: ModelSpec) -> dict[str, object]:
    return {f: getattr(m, f) for f in m.__slots__}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("deepseek-v3", 61 * (512 + 64) * 2),  # one latent + rotary key per layer: 70,272
        ("kimi-k2", 61 * (512 + 64) * 2),
        ("gemma-3-27b", 62 * 2 * 16 * 128 * 2),  # every layer kept: 507,904
        ("gpt-oss-120b", 36 * 2 * 8 * 64 * 2),  # 73,728
        ("qwen3-next-80b-a3b", 12 * 2 * 2 * 256 * 2),  # the 12 full-attention layers: 24,576
        ("nemotron-h-8b", 4 * 2 * 8 * 128 * 2),  # 16,384
    ],
)
def test_kv_bytes_per_token_by_hand(name: str, expected: int) -> None:
    assert MODEL_PRESETS[name].kv_bytes_per_token == expected


def test_layer_counts_from_the_layouts() -> None:
    m = MODEL_PRESETS
    # Gemma 3: global when (i + 1) % 6 == 0: 62 // 6 = 10 global, 52 sliding
    assert (m["gemma-3-27b"].num_attention_layers, m["gemma-3-27b"].num_sliding_layers) == (62, 52)
    assert (m["gemma-3-12b"].num_sliding_layers, m["gemma-3-12b"].sliding_window) == (40, 1024)
    assert (m["gpt-oss-120b"].num_sliding_layers, m["gpt-oss-120b"].sliding_window) == (18, 128)
    # DeepSeek-V3: first_k_dense_replace = 3 of 61; Kimi K2: 1
    assert (m["deepseek-v3"].num_mlp_layers, m["deepseek-v3"].num_moe_layers) == (3, 58)
    assert (m["kimi-k2"].num_mlp_layers, m["kimi-k2"].num_moe_layers) == (1, 60)
    # Qwen3-Next: full attention every 4th of 48 layers, Gated DeltaNet elsewhere, all MoE
    q = m["qwen3-next-80b-a3b"]
    assert (q.num_attention_layers, q.num_ssm_layers, q.num_moe_layers) == (12, 36, 48)
    n = m["nemotron-h-8b"]  # M 24, * 4, - 24
    assert (n.num_ssm_layers, n.num_attention_layers, n.num_mlp_layers, n.mlp_matrices) == (
        24,
        4,
        24,
        2,
    )
    j = m["jamba-1.5-mini"]  # attention at 4, 12, 20, 28; MoE at odd layers
    assert (j.num_attention_layers, j.num_ssm_layers, j.num_moe_layers, j.num_mlp_layers) == (
        4,
        28,
        16,
        16,
    )


def test_recurrent_state_bytes_by_hand() -> None:
    # Qwen3-Next, per DeltaNet layer: 32 value heads x 128 x 128 recurrent state + conv of
    # (2 x 16 x 128 + 32 x 128) = 8192 channels x (4 - 1) columns, bf16:
    # (524,288 + 24,576) x 2 = 1,097,728 bytes; 36 layers: 39,518,208
    assert MODEL_PRESETS["qwen3-next-80b-a3b"].state_bytes_per_checkpoint == 39_518_208
    # Nemotron-H 8B, per Mamba-2 layer: 128 heads x 64 x 128 state in float32 (vLLM's
    # default for it) + (8192 + 2 x 8 x 128) = 10,240 conv channels x 3 in bf16:
    # 1,048,576 x 4 + 30,720 x 2 = 4,255,744; 24 layers: 102,137,856
    assert MODEL_PRESETS["nemotron-h-8b"].state_bytes_per_checkpoint == 102_137_856


@pytest.mark.parametrize(
    ("name", "published", "rel"),
    [
        ("deepseek-v3", 671e9, 0.005),  # the paper's 671B (without the MTP module)
        ("kimi-k2", 1.04e12, 0.02),  # "1 trillion total parameters" (1.04T on the model card)
        ("gpt-oss-120b", 116.83e9, 0.005),  # the model card's table
        ("gpt-oss-20b", 20.91e9, 0.005),
        ("gemma-3-27b", 27.0e9, 0.02),  # without the 0.4B vision encoder
        ("jamba-1.5-mini", 52e9, 0.02),
        ("nemotron-h-8b", 8.1e9, 0.02),
    ],
)
def test_parameter_counts_match_the_published_totals(name: str, published: float, rel: float):
    assert MODEL_PRESETS[name].num_parameters == pytest.approx(published, rel=rel)


def test_quantized_weight_bytes_by_hand() -> None:
    oss = MODEL_PRESETS["gpt-oss-120b"]
    expert = 3 * 2880 * 2880
    experts = 36 * 128 * expert
    embeddings = 2 * 201_088 * 2880
    rest = oss.num_parameters - experts - embeddings
    # MXFP4 experts at 4.25 bits; attention, router and embeddings at bf16
    assert oss.weight_bytes == int((experts * 4.25 + (rest + embeddings) * 16) / 8)
    assert oss.weight_bytes / 2**30 == pytest.approx(60.7, abs=0.1)  # the checkpoint's ~61 GiB
    ds = MODEL_PRESETS["deepseek-v3"]  # FP8 weights, bf16 embeddings
    emb = 2 * 129_280 * 7168
    assert ds.weight_bytes == int(((ds.num_parameters - emb) * 8 + emb * 16) / 8)
    # unquantized: parameters x dtype bytes
    assert (
        MODEL_PRESETS["llama-3.1-8b"].weight_bytes
        == MODEL_PRESETS["llama-3.1-8b"].num_parameters * 2
    )


def test_mla_flops_by_hand() -> None:
    m = MODEL_PRESETS["deepseek-v3"]
    d, h = 7168, 128
    proj = d * 1536 + 1536 * h * 192 + d * (512 + 64) + 512 * h * (128 + 128) + h * 128 * d
    assert proj == 187_105_280
    # one token after none, non-causal: projections 2 x proj, one (query, key) pair
    # costing 2 h (qk + v) = 2 x 128 x 320 = 81,920
    f = m.prefill_flops(1)
    assert f["attention"] == pytest.approx(61 * (2 * proj + 81_920), rel=1e-12)
    # each cached token adds one pair per new token per layer, and its latent's
    # up-projection to keys and values: 2 x 512 x 128 x (128 + 128) = 33,554,432
    assert m.mla_context_flops == 33_554_432
    extra = m.prefill_flops(1, 100)["attention"] - f["attention"]
    assert extra == pytest.approx(61 * 100 * (81_920 + 33_554_432), rel=1e-9)
    # (none of it when nothing new is prefilled, in arrays too)
    none = m.prefill_flops_array(np.array([0.0, 1.0]), np.array([100.0, 100.0]))
    assert none["attention"][0] == 0.0 and none["attention"][1] == pytest.approx(
        m.prefill_flops(1, 100)["attention"]
    )
    # decode attends over the latents (vLLM's absorbed form): 2 h (512 + 64) + 2 h 512 =
    # 278,528 a pair, the projections as in prefill; 101 keys for one token after 100
    others = m.total_prefill_flops(1, 100) - m.prefill_flops(1, 100)["attention"]
    decode_attention = m.decode_flops(100) - others  # (no up-projection of the context)
    assert decode_attention == pytest.approx(61 * (2 * proj + 101 * 278_528), rel=1e-9)


def _sliding(window: int) -> ModelSpec:
    return ModelSpec(
        "swa",
        4,
        num_attention_layers=2,
        num_heads=1,
        num_kv_heads=1,
        head_dim=4,
        num_sliding_layers=1,
        sliding_window=window,
    )


def test_sliding_window_flops_by_hand() -> None:
    m = _sliding(4)
    proj = 2 * 6 * 4 * (2 * 4 + 2 * 4)  # 768 per layer for 6 tokens
    # causal pairs for 6 tokens after none: global 6^2 / 2 = 18; sliding G(6) - G(0) with
    # G(x) = 4x - 8 past the window: 16. 4 D_q = 16 FLOPs a pair.
    assert m.prefill_flops(6, 0, causal=True)["attention"] == 2 * proj + 16 * (18 + 16)
    # non-causal: global 6 x 6 = 36 pairs, sliding 6 x min(6, 4) = 24
    assert m.prefill_flops(6)["attention"] == 2 * proj + 16 * (36 + 24)
    # one decode token far past the window: W pairs in the sliding layer, p + 1/2 in the global
    one = m.prefill_flops(1, 100, causal=True)["attention"]
    assert one == 2 * (2 * 4 * 16) + 16 * (100.5 + 4)


def test_sliding_window_flops_arrays_match_scalars() -> None:
    m = MODEL_PRESETS["gpt-oss-20b"]
    n = np.array([1.0, 50.0, 300.0, 2000.0])
    p = np.array([0.0, 100.0, 0.0, 64.0])
    arr = m.prefill_flops_array(n, p, causal=True)
    for i in range(len(n)):
        one = m.prefill_flops(int(n[i]), int(p[i]), causal=True)
        assert arr["attention"][i] == one["attention"]


def test_kv_bytes_read_stops_at_the_window() -> None:
    m = MODEL_PRESETS["gpt-oss-120b"]
    per = 2 * 8 * 64 * 2
    assert m.kv_bytes_read(100) == 100 * 36 * per
    assert m.kv_bytes_read(2000) == 2000 * 18 * per + 128 * 18 * per


def test_kv_per_rank_under_tensor_parallelism() -> None:
    llama = MODEL_PRESETS["llama-3.1-8b"]  # 8 KV heads
    assert llama.kv_bytes_per_token_per_rank(1) == 131_072
    assert llama.kv_bytes_per_token_per_rank(2) == 65_536
    assert llama.kv_bytes_per_token_per_rank(16) == 131_072 // 8  # one head kept per rank
    ds = MODEL_PRESETS["deepseek-v3"]  # the MLA latent is replicated
    assert ds.kv_bytes_per_token_per_rank(8) == ds.kv_bytes_per_token


def test_kv_read_under_tensor_parallelism() -> None:
    # every GPU reads the whole MLA latent; GQA heads split until one a GPU
    ds = MODEL_PRESETS["deepseek-v3"]
    assert ds.kv_bytes_read(1000, 8) == 8 * ds.kv_bytes_read(1000)
    llama = MODEL_PRESETS["llama-3.1-8b"]
    assert llama.kv_bytes_read(1000, 8) == llama.kv_bytes_read(1000)
    assert llama.kv_bytes_read(1000, 16) == 2 * llama.kv_bytes_read(1000)


@pytest.mark.parametrize(
    ("name", "tp"),
    [*((n, 1) for n in sorted(MODEL_PRESETS)), ("deepseek-v3", 8), ("llama-3.1-8b", 16)],
)
def test_kernel_roofline_matches_the_reference_to_the_bit(name: str, tp: int) -> None:
    """The compiled engine's roofline (runner/engine/_kernel.py) against Roofline.step_s
    for every preset: MLA, sliding windows, shared experts, quantized weights, and the KV
    tensor-parallel GPUs read."""
    t = make_timing("roofline", model=name, gpu="h100", tp=tp)
    codes = sim.timing_codes(t)
    assert codes is not None
    tcode, tpar, tt, ts = codes
    cn, cc = np.array([300, 200, 7]), np.array([0, 1000, 130])
    dctx = np.array([50, 4000, 7, 127, 128, 129])
    chunks = [(300, 0, 0), (200, 1000, 1000), (7, 130, 130)]
    contexts = [int(c) for c in dctx]
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 3, 6, dctx) == t.step_s(chunks, contexts)
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 0, 6, dctx) == t.step_s([], contexts)
    assert K.step_seconds(tcode, tpar, tt, ts, cn, cc, cc, 3, 0, dctx) == t.step_s(chunks, [])


# ---------------------------------------------------------------------- config files
def _write(tmp_path: Path, data: object, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_a_llama_config_json_is_the_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA)
    m = get_model(path)
    assert m.name == path
    assert ModelSpec(**{**_fields(m), "name": "llama-3.1-8b"}) == MODEL_PRESETS["llama-3.1-8b"]
    assert get_model(path) is m  # read once


def test_prefixlab_fields_as_json(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "hidden_size": 8,
            "num_attention_layers": 2,
            "num_kv_heads": 1,
            "head_dim": 4,
            "num_heads": 2,
        },
    )
    assert get_model(path).kv_bytes_per_token == 2 * 2 * 1 * 4 * 2
    bad = _write(tmp_path, {"hidden_size": 8, "num_attention_layers": 1, "layers": 3}, "b.json")
    with pytest.raises(ConfigError, match=r"b\.json: unknown ModelSpec field\(s\) layers"):
        get_model(bad)


def test_text_config_and_defaults(tmp_path: Path) -> None:
    # a Gemma 3 file that leaves out the pattern and the tying, as the 27B's does
    text = json.loads((CONFIG_DIR / "gemma-3-27b.json").read_text())["text_config"]
    del text["sliding_window_pattern"], text["tie_word_embeddings"]
    m = get_model(_write(tmp_path, {"model_type": "gemma3", "text_config": text}))
    assert (m.num_sliding_layers, m.tie_embeddings) == (52, True)


def test_mistral_windows_every_layer(tmp_path: Path) -> None:
    m = get_model(_write(tmp_path, {**LLAMA, "model_type": "mistral", "sliding_window": 4096}))
    assert (m.num_attention_layers, m.num_sliding_layers, m.sliding_window) == (32, 32, 4096)
    q = get_model(
        _write(tmp_path, {**LLAMA, "model_type": "qwen2", "sliding_window": 4096}, "q.json")
    )
    assert q.num_sliding_layers == 0  # Qwen2 carries the key unused


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, r"config\.json: field 'hidden_size' is missing"),
        ({"num_hidden_layers": "32"}, r"field 'num_hidden_layers' must be an integer, got '32'"),
        ({"layer_types": ["full_attention"]}, r"field 'layer_types' must list 32 of"),
        ({"torch_dtype": "int3"}, r"field 'torch_dtype': unknown dtype 'int3'"),
        ({"quantization_config": {"quant_method": "awq"}}, r"'awq' is not priced"),
        ({"sliding_window_pattern": 0}, r"field 'sliding_window_pattern' must be positive"),
    ],
)
def test_bad_config_files_name_the_field(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    data = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        get_model(_write(tmp_path, data))


def test_unreadable_model_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model file .*missing\.json"):
        get_model(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(ConfigError, match=r"broken\.json: line 3: not valid JSON"):
        get_model(str(broken))
    with pytest.raises(ConfigError, match=r"unknown model 'nope'.*config\.json"):
        get_model("nope")


def test_nemotron_pattern_errors() -> None:
    cfg = json.loads((CONFIG_DIR / "nemotron-h-8b.json").read_text())
    cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"][:-1] + "X"
    with pytest.raises(ConfigError, match="must have 52 characters of M"):
        from_hf_config(cfg, "nemotron")


# ---------------------------------------------------------------------- deployment
GIB = 2**30


def test_kv_budget_by_hand() -> None:
    llama = MODEL_PRESETS["llama-3.1-8b"]
    weights = llama.num_parameters * 2
    one = kv_budget("llama-3.1-8b", "h100")  # vLLM's 0.9 of 80 GiB
    assert one.free_per_gpu == int(0.9 * 80 * GIB - weights)
    assert one.tokens == one.free_per_gpu // 131_072
    assert one.kv_bytes == one.tokens * 131_072
    two = kv_budget("llama-3.1-8b", "h100", tp=2)  # half the weights, half the heads a GPU
    assert two.free_per_gpu == int(0.9 * 80 * GIB - weights / 2)
    assert two.tokens == two.free_per_gpu // 65_536
    assert two.kv_bytes == two.tokens * 131_072
    # MLA on 8 x H200: each GPU keeps the whole latent (70,272 B a token)
    ds = kv_budget("deepseek-v3", "h200", tp=8)
    per_gpu = int(0.9 * 141 * GIB - MODEL_PRESETS["deepseek-v3"].weight_bytes / 8)
    assert (ds.free_per_gpu, ds.tokens) == (per_gpu, per_gpu // 70_272)
    assert "8 x h200" in ds.describe()


def test_kv_budget_refuses_what_cannot_run() -> None:
    with pytest.raises(ConfigError, match="3 does not divide the 32 attention heads"):
        kv_budget("llama-3.1-8b", "h100", tp=3)
    with pytest.raises(ConfigError, match=r"deepseek-v3 on 1 x h100: 626\.7 GiB of weights"):
        kv_budget("deepseek-v3", "h100")
    with pytest.raises(ConfigError, match="no attention KV"):
        kv_budget("mamba2-2.7b", "h100")


def test_available_kv_bytes_follows_tp() -> None:
    from prefixlab.experiments.config import available_kv_bytes

    weights = MODEL_PRESETS["llama-3.2-3b"].num_parameters * 2
    assert available_kv_bytes("llama-3.2-3b", "a100", 0.9, 2.5) == int(
        0.9 * 80 * GIB - weights - 2.5 * GIB
    )
    two = available_kv_bytes("llama-3.2-3b", "a100", 0.9, 0.0, tp=2)
    assert two == kv_budget("llama-3.2-3b", "a100", 2, 0.9).kv_bytes


def test_tensor_parallel_roofline_is_tp_gpus() -> None:
    from prefixlab.model.timing import GPU, Roofline, get_gpu

    h100 = get_gpu("h100")
    t2 = make_timing("roofline", "llama-3.1-8b", "h100", tp=2)
    by_hand = Roofline(
        MODEL_PRESETS["llama-3.1-8b"],
        GPU("2xh100", 2 * h100.peak_flops, 2 * h100.mem_bandwidth, 2 * h100.mem_bytes),
        tp=2,
    )
    assert t2.spec() == "roofline:mfu=0.5,mbu=0.7,tp=2"
    chunks = [(1000, 0, 0)]
    assert t2.step_s(chunks, [500]) == by_hand.step_s(chunks, [500])
    t1 = make_timing("roofline", "llama-3.1-8b", "h100")
    assert t2.prefill_s(chunks) == pytest.approx(t1.prefill_s(chunks) / 2)
    with pytest.raises(ConfigError, match="does not divide"):
        make_timing("roofline", "llama-3.1-8b", "h100", tp=5)


def _simulate(*args: str) -> Any:
    return CliRunner().invoke(
        app,
        [
            "simulate",
            "gen:sessions:num_sessions=20,seed=1",
            "--block-tokens",
            "16",
            "-p",
            "lru",
            "--model",
            "gpt-oss-20b",
            "--gpu",
            "a6000",
            "--json",
            *args,
        ],
    )


def _rows(res: Any) -> list[dict[str, object]]:
    assert res.exit_code == 0, res.output
    rows: list[dict[str, object]] = json.loads(res.stdout)
    for r in rows:
        del r["elapsed_s"]  # wall clock
    return rows


def test_simulate_without_a_capacity_takes_the_kv_budget() -> None:
    budget = kv_budget("gpt-oss-20b", "a6000", 1, 0.5)
    rows = _rows(_simulate("--gpu-memory-utilization", "0.5"))
    assert rows == _rows(_simulate("--capacity-bytes", str(budget.kv_bytes)))
    # the pool is the budget's whole blocks
    blocks = budget.kv_bytes // MODEL_PRESETS["gpt-oss-20b"].kv_bytes_per_block(16)
    assert rows[0]["capacity_blocks"] == blocks
    shown = CliRunner().invoke(app, ["models", "gpt-oss-20b", "--gpu", "a6000"])
    assert "KV budget of gpt-oss-20b on a6000 at 0.9 of memory" in shown.output


def test_simulate_on_a_config_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text((CONFIG_DIR / "gpt-oss-20b.json").read_text())
    res = _rows(_simulate("--capacity-bytes", "2GB", "--model", str(path), "--tp", "2"))
    assert res == _rows(_simulate("--capacity-bytes", "2GB", "--tp", "2"))
    bad = _simulate("--tp", "3")
    assert bad.exit_code != 0
    assert "tensor parallelism 3 does not divide the 64 attention heads" in bad.output


def test_models_command_json() -> None:
    res = CliRunner().invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["name"] for r in json.loads(res.stdout)] == list(MODEL_PRESETS)
    one = CliRunner().invoke(app, ["models", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--json"])
    doc = json.loads(one.stdout)
    assert doc["kv_bytes_per_token"] == 70_272
    assert doc["kv_budget"]["tokens"] == kv_budget("deepseek-v3", "h200", 8).tokens
    assert doc["layers"] == "61 attention (MLA), 3 MLP, 58 MoE (256 experts, top 8 + shared)"


def test_experiment_model_tp() -> None:
    from prefixlab.experiments.config import config_from_text
    from prefixlab.experiments.run import fingerprint

    base = """
policies = ["lru"]
[workload]
source = "gen:sessions"
[cache]
capacities = ["0.5A"]
[model]
name = "llama-3.1-8b"
gpu = "h100"
"""
    one = config_from_text(base)
    assert "tp" not in fingerprint(one)["model"]  # older stores keep their cell ids
    two = config_from_text(base + "tp = 2\n")
    assert fingerprint(two)["model"]["tp"] == 2  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"model\.tp: tensor parallelism 3 does not divide"):
        config_from_text(base + "tp = 3\n")
