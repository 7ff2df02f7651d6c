"""Model specs (bytes, FLOPs, parameters), timing models and the power-law fit.

Expected values are computed by hand from the models' fields; the arithmetic is in comments.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.model.fit import PowerFit, fit_csv, fit_power_law
from prefixlab.model.presets import MODEL_PRESETS
from prefixlab.model.spec import (
    LAYER_TYPES,
    ModelSpec,
    capacity_blocks_for_bytes,
    get_model,
)
from prefixlab.model.timing import (
    GPU,
    GPU_PRESETS,
    POWER_PRESETS,
    Composite,
    ConstantTPOT,
    PowerLaw,
    Roofline,
    TableTiming,
    make_timing,
)

runner = CliRunner()

HYBRID = MODEL_PRESETS["marconi-hybrid-7b"]


def tiny() -> ModelSpec:
    """D = 4; 1 MHA layer (2 heads x 2 = D_kv = D); 1 plain MLP (F = 16 = 4D, m = 2);
    1 SSM layer (d_inner = 8 = 2D, N = 3, conv kernel 4); vocab 10, untied (input embedding
    and lm_head counted separately)."""
    return ModelSpec(
        "tiny",
        4,
        num_attention_layers=1,
        num_heads=2,
        num_kv_heads=2,
        head_dim=2,
        num_mlp_layers=1,
        intermediate_size=16,
        mlp_matrices=2,
        num_ssm_layers=1,
        ssm_d_inner=8,
        ssm_d_state=3,
        vocab_size=10,
    )


# ====================================================================== memory: Marconi's figures
def test_marconi_hybrid_checkpoint_is_26_8_mb() -> None:
    # 24 SSM layers x (4096 channels x N=128 + conv (8192 + 256) x 4) x 2 bytes
    # = 24 x (524288 + 33792) x 2 = 24 x 558080 x 2 = 26,787,840 bytes
    assert HYBRID.state_bytes_per_checkpoint == 26_787_840
    assert round(HYBRID.state_bytes_per_checkpoint / 1e6, 1) == 26.8


def test_marconi_hybrid_checkpoint_equals_kv_of_409_tokens() -> None:
    # KV/token = 2 x 4 attention layers x 32 KV heads x 128 x 2 bytes = 65,536
    assert HYBRID.kv_bytes_per_token == 65_536
    # 26,787,840 / 65,536 = 408.75 -> 409
    assert round(HYBRID.state_bytes_per_checkpoint / HYBRID.kv_bytes_per_token) == 409


def test_marconi_hybrid_10k_sequence_every_16_tokens_is_17_4_gb() -> None:
    # 10,000 x 65,536 + (10,000 // 16 = 625) x 26,787,840 = 655,360,000 + 16,742,400,000
    assert HYBRID.sequence_bytes(10_000, 16) == 17_397_760_000
    assert round(HYBRID.sequence_bytes(10_000, 16) / 1e9, 1) == 17.4


def test_sequence_bytes_default_one_checkpoint_and_none_without_ssm() -> None:
    # one checkpoint at the end: 100 x 65,536 + 26,787,840
    assert HYBRID.sequence_bytes(100) == 6_553_600 + 26_787_840
    # a pure transformer holds no checkpoint: 100 x 131,072
    assert MODEL_PRESETS["llama-3.1-8b"].sequence_bytes(100, 16) == 13_107_200
    # a pure SSM holds no KV: 100 // 10 = 10 checkpoints
    mamba = MODEL_PRESETS["mamba2-2.7b"]
    assert mamba.sequence_bytes(100, 10) == 10 * mamba.state_bytes_per_checkpoint


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama-3.2-1b", 2 * 16 * 8 * 64 * 2),  # 32,768
        ("llama-3.2-3b", 2 * 28 * 8 * 128 * 2),  # 114,688
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),  # 131,072
        ("qwen3-32b", 2 * 64 * 8 * 128 * 2),  # 262,144
        ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),  # 131,072
        ("marconi-hybrid-7b", 2 * 4 * 32 * 128 * 2),  # 65,536
        ("jamba-1.5-mini", 2 * 4 * 8 * 128 * 2),  # 16,384
        ("mamba2-2.7b", 0),  # no attention
    ],
)
def test_kv_bytes_per_token_by_hand(name: str, expected: int) -> None:
    assert MODEL_PRESETS[name].kv_bytes_per_token == expected
    assert MODEL_PRESETS[name].kv_bytes_per_block(16) == 16 * expected


def test_kv_bytes_literals() -> None:
    assert MODEL_PRESETS["llama-3.1-8b"].kv_bytes_per_token == 131_072
    assert MODEL_PRESETS["llama-3.2-1b"].kv_bytes_per_token == 32_768


def test_state_bytes_of_mamba2_and_jamba_by_hand() -> None:
    # Mamba2-2.7B: 64 layers x (5120 x 128 + (5120 + 256) x 3) x 2 (engines keep kernel - 1
    # conv columns) = 64 x (655,360 + 16,128) x 2 = 64 x 671,488 x 2 = 85,950,464
    assert MODEL_PRESETS["mamba2-2.7b"].state_bytes_per_checkpoint == 85_950_464
    # Jamba (Mamba-1, channels and conv default to d_inner): 28 x (8192 x 16 + 8192 x 3) x 2
    # = 28 x (131,072 + 24,576) x 2 = 28 x 155,648 x 2 = 8,716,288
    assert MODEL_PRESETS["jamba-1.5-mini"].state_bytes_per_checkpoint == 8_716_288
    # transformers carry no state
    assert MODEL_PRESETS["llama-3.1-8b"].state_bytes_per_checkpoint == 0


def test_tiny_bytes_by_hand() -> None:
    m = tiny()
    # KV: 2 x 1 layer x 2 heads x 2 x 2 bytes = 16
    assert m.kv_bytes_per_token == 16
    # state: 1 x (8 x 3 + 8 x 4) x 2 = 112
    assert m.state_bytes_per_checkpoint == 112


def test_capacity_blocks_for_bytes() -> None:
    # llama-3.1-8b, 16-token blocks: 16 x 131,072 = 2,097,152 bytes; 10 MiB + 1 holds 5
    assert capacity_blocks_for_bytes(10 * 2**20 + 1, "llama-3.1-8b", 16) == 5
    with pytest.raises(ConfigError, match=r"2097152 bytes"):
        capacity_blocks_for_bytes(2_097_151, "llama-3.1-8b", 16)
    with pytest.raises(ConfigError, match=r"mamba2-2\.7b has no attention KV"):
        capacity_blocks_for_bytes(10**9, "mamba2-2.7b", 16)


def test_get_model_case_insensitive_and_unknown() -> None:
    assert get_model("LLAMA-3.1-8B") is MODEL_PRESETS["llama-3.1-8b"]
    m = tiny()
    assert get_model(m) is m
    with pytest.raises(ConfigError, match=r"unknown model 'gpt-9'.*llama-3\.1-8b"):
        get_model("gpt-9")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"hidden_size": 0}, "hidden_size must be positive"),
        ({"hidden_size": -4}, "hidden_size must be an integer >= 0, got -4"),
        ({"hidden_size": 4, "num_heads": True}, "num_heads must be an integer >= 0, got True"),
        ({"hidden_size": 4, "head_dim": 2.0}, "head_dim must be an integer >= 0, got 2.0"),
        ({"hidden_size": 4, "num_attention_layers": 1}, "need num_kv_heads, head_dim"),
        ({"hidden_size": 4, "num_ssm_layers": 1, "ssm_d_inner": 8}, "need ssm_d_inner"),
        ({"hidden_size": 4, "tie_embeddings": 1}, "tie_embeddings must be true or false"),
    ],
)
def test_model_spec_validation(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=r"model bad: ") as exc:
        ModelSpec("bad", **kwargs)
    assert needle in str(exc.value)


def test_sequence_bytes_zero_checkpoint_interval_is_config_error() -> None:
    with pytest.raises(ConfigError, match="checkpoint_every"):
        HYBRID.sequence_bytes(10, 0)


# ====================================================================== FLOPs
def test_tiny_prefill_flops_by_hand() -> None:
    m = tiny()
    # n = 3 new after p = 2 cached; D = D_q = D_kv = 4
    # attention: 2 x 3 x 4 x (2 x 4 + 2 x 4) + 4 x 3 x (2 + 3) x 4 = 384 + 240 = 624
    # MLP: 2 x 3 x 4 x 16 x 2 = 768
    # SSM: 2x3x4x(2x8) + 2x3x8x4 + 8x3x8x3 + 5x3x8 = 384 + 192 + 576 + 120 = 1272
    assert m.prefill_flops(3, 2) == {"attention": 624.0, "mlp": 768.0, "moe": 0.0, "ssm": 1272.0}
    assert m.total_prefill_flops(3, 2) == 624 + 768 + 1272
    # p = 0: attention 384 + 4 x 3 x 3 x 4 = 384 + 144 = 528
    assert m.prefill_flops(3)["attention"] == 528.0
    # nothing new: all zero
    assert m.prefill_flops(0, 5) == dict.fromkeys(LAYER_TYPES, 0.0)
    assert m.prefill_flops(0, 5, causal=True) == dict.fromkeys(LAYER_TYPES, 0.0)


def test_tiny_causal_prefill_flops_by_hand() -> None:
    m = tiny()
    # causal counts half the new tokens' square: 2 n^2 D_q instead of 4 n^2 D_q
    # n = 3, p = 2: attention 384 + 4 x 3 x 2 x 4 + 2 x 3 x 3 x 4 = 384 + 96 + 72 = 552
    # (non-causal: 384 + 96 + 144 = 624); MLP and SSM do not change
    f = m.prefill_flops(3, 2, causal=True)
    assert f == {"attention": 552.0, "mlp": 768.0, "moe": 0.0, "ssm": 1272.0}
    assert m.total_prefill_flops(3, 2, True) == 552 + 768 + 1272  # 2592
    # default stays non-causal (Marconi's 4 L^2 D)
    assert m.total_prefill_flops(3, 2) == 624 + 768 + 1272
    # decode: 1 token after 5, attention 128 + 4 x 1 x 5 x 4 + 2 x 1 x 1 x 4 = 128 + 80 + 8
    # = 216 (non-causal 224); + MLP 256 + SSM 424 = 896
    assert m.decode_flops(5, causal=True) == 896.0
    assert m.decode_flops(5) == 904.0


def test_causal_flops_are_additive_over_chunks_by_hand() -> None:
    m = tiny()
    # (1 new after 0) + (2 new after 1) = 3 new after 0, causal:
    # total(1, 0): attention 2x1x4x16 + 2x1x1x4 = 128 + 8 = 136; MLP 256; SSM 424 -> 816
    # total(2, 1): attention 2x2x4x16 + 4x2x1x4 + 2x2x2x4 = 256 + 32 + 32 = 320;
    #              MLP 512; SSM 848 -> 1680
    # total(3, 0): attention 384 + 2x3x3x4 = 384 + 72 = 456; MLP 768; SSM 1272 -> 2496
    assert m.total_prefill_flops(1, 0, True) == 816.0
    assert m.total_prefill_flops(2, 1, True) == 1680.0
    assert m.total_prefill_flops(3, 0, True) == 2496.0 == 816.0 + 1680.0
    # non-causal counts the full square of each chunk, so chunking drops 4 a b D_q per
    # attention layer: whole 4 x 9 x 4 = 144 vs chunks 4x1x4 + 4x2x1x4 + 4x4x4 = 16+32+64
    # = 112 -> 32 = 4 x 1 x 2 x 4
    chunked = m.total_prefill_flops(1, 0) + m.total_prefill_flops(2, 1)
    assert m.total_prefill_flops(3, 0) - chunked == 32.0


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.1-8b",
        "mixtral-8x7b",
        "marconi-hybrid-7b",
        "deepseek-v3",
        "gemma-3-27b",
        "gpt-oss-20b",
    ],
)
@pytest.mark.parametrize(("a", "b", "p"), [(1, 1, 0), (300, 700, 0), (512, 64, 1000)])
def test_causal_flops_are_additive_over_chunks(name: str, a: int, b: int, p: int) -> None:
    # attention: 4 a p D + 2 a^2 D + 4 b (p + a) D + 2 b^2 D = 4 (a + b) p D + 2 (a + b)^2 D;
    # every other term is linear in the new tokens
    m = MODEL_PRESETS[name]
    split = m.total_prefill_flops(a, p, True) + m.total_prefill_flops(b, p + a, True)
    # (MLA's second chunk up-projects the p + a cached latents again, a layer)
    again = m.num_attention_layers * m.mla_context_flops * (p + a)
    assert split - again == pytest.approx(m.total_prefill_flops(a + b, p, True), rel=1e-12)
    # non-causal is not additive (it double-counts): it drops 4 a b D_q per full attention
    # layer (a sliding one's count depends on where the window cuts)
    if m.num_sliding_layers:
        return
    split_nc = m.total_prefill_flops(a, p) + m.total_prefill_flops(b, p + a) - again
    d_q = m.attention_dims()[0]
    whole_nc = m.total_prefill_flops(a + b, p)
    assert whole_nc - split_nc == pytest.approx(m.num_attention_layers * 4 * a * b * d_q)


def test_tiny_matches_marconi_formulas() -> None:
    m, L, D, N = tiny(), 3, 4, 3
    f = m.prefill_flops(L)
    assert f["attention"] == 8 * L * D**2 + 4 * L**2 * D  # 384 + 144 = 528
    assert f["mlp"] == 16 * L * D**2  # 768
    assert f["ssm"] == 12 * L * D**2 + 16 * L * D * N + 10 * L * D  # 576 + 576 + 120 = 1272


@pytest.mark.parametrize("L", [1, 100, 2048])
def test_marconi_hybrid_matches_marconi_formulas(L: int) -> None:
    # D_kv = 32 x 128 = D = 4096, F = 16384 = 4D with 2 matrices, d_inner = 2D, N = 128
    D, N = 4096, 128
    f = HYBRID.prefill_flops(L)
    assert f["attention"] == 4 * (8 * L * D**2 + 4 * L**2 * D)
    assert f["mlp"] == 28 * 16 * L * D**2
    assert f["ssm"] == 24 * (12 * L * D**2 + 16 * L * D * N + 10 * L * D)
    assert f["moe"] == 0


@pytest.mark.parametrize("p", [1, 7, 1000])
def test_cached_prefix_adds_only_attention_4LpD(p: int) -> None:
    L, D = 50, 4096
    base, cached = HYBRID.prefill_flops(L, 0), HYBRID.prefill_flops(L, p)
    # 4 attention layers, each + 4 x L x p x D
    assert cached["attention"] - base["attention"] == 4 * (4 * L * p * D)
    for kind in ("mlp", "moe", "ssm"):
        assert cached[kind] == base[kind]


def test_gqa_attention_flops() -> None:
    # llama-3.1-8b: D = D_q = 4096, D_kv = 8 x 128 = 1024; per layer, L = 10, p = 0:
    # 2 x 10 x 4096 x (2 x 4096 + 2 x 1024) + 4 x 10 x 10 x 4096 = 838,860,800 + 1,638,400
    f = MODEL_PRESETS["llama-3.1-8b"].prefill_flops(10)
    assert f["attention"] == 32 * (838_860_800 + 1_638_400)
    # gated MLP: 2 x 10 x 4096 x 14336 x 3 per layer
    assert f["mlp"] == 32 * 2 * 10 * 4096 * 14336 * 3


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("c", [0, 1, 999])
def test_decode_flops_is_one_token_prefill(name: str, c: int) -> None:
    m = MODEL_PRESETS[name]
    if not m.kv_lora_rank:  # (MLA decodes in its absorbed form: test_model_specs.py)
        assert m.decode_flops(c) == m.total_prefill_flops(1, c)
        assert m.decode_flops(c, True) == m.total_prefill_flops(1, c, True)
    assert m.decode_flops(c) > 0
    # one new token: causal counts 2 x 1 x 1 x D_q per attention layer instead of 4 (D_q
    # = heads x (qk + v) / 2 for MLA); a sliding layer past its window attends to the same
    # W keys either way
    d_q = m.attention_dims(decode=True)[0]
    layers = m.num_attention_layers
    if c + 1 > m.sliding_window:
        layers -= m.num_sliding_layers
    diff = m.decode_flops(c) - m.decode_flops(c, True)
    assert diff == pytest.approx(2 * d_q * layers, rel=1e-9)


def test_tiny_decode_flops_by_hand() -> None:
    # 1 token after 5: attention 2x1x4x16 + 4x1x6x4 = 128 + 96 = 224; MLP 2x4x16x2 = 256;
    # SSM 2x4x16 + 2x8x4 + 8x8x3 + 5x8 = 128 + 64 + 192 + 40 = 424; total 904
    assert tiny().decode_flops(5) == 904.0


def test_moe_flops_count_active_experts_plus_router() -> None:
    m = ModelSpec(
        "moe",
        4,
        num_moe_layers=1,
        num_experts=4,
        experts_per_token=2,
        moe_intermediate_size=8,
        mlp_matrices=3,
        vocab_size=10,
    )
    # n = 2: experts 2 x 2 x 4 x 8 x 3 x 2 = 768; router 2 x 2 x 4 x 4 = 64
    assert m.prefill_flops(2) == {"attention": 0.0, "mlp": 0.0, "moe": 832.0, "ssm": 0.0}
    # no attention: causal changes nothing
    assert m.prefill_flops(2, 7, causal=True) == m.prefill_flops(2)
    # params: 4 experts x 3 x 4 x 8 + router 4 x 4 + untied embeddings 2 x 10 x 4
    # = 384 + 16 + 80
    assert m.num_parameters == 480
    # active: 4 x (1 - (1 - 2/4)^1) = 2 experts touched; minus (4 - 2) x 96 = 192
    assert m.active_parameters == 288


def moe_toy() -> ModelSpec:
    """D = 4; 1 MoE layer, 4 experts (3 x 4 x 8 = 96 weights each), top 2; vocab 10."""
    return ModelSpec(
        "moe",
        4,
        num_moe_layers=1,
        num_experts=4,
        experts_per_token=2,
        moe_intermediate_size=8,
        mlp_matrices=3,
        vocab_size=10,
    )


def test_moe_parameters_read_by_hand() -> None:
    m = moe_toy()
    # 480 parameters, 96 per expert; experts touched by T tokens: 4 x (1 - (1/2)^T)
    # T = 1: 2 touched, 2 idle -> 480 - 192 = 288 (= active_parameters)
    assert m.parameters_read(1) == m.active_parameters == 288
    # T = 2: 4 x (1 - 1/4) = 3 touched, 1 idle -> 480 - 96 = 384
    assert m.parameters_read(2) == 384
    # T = 3: 4 x (1 - 1/8) = 3.5 touched, 0.5 idle -> 480 - 48 = 432
    assert m.parameters_read(3) == 432
    # T = 4: 4 x (1 - 1/16) = 3.75 touched, 0.25 idle -> 480 - 24 = 456
    assert m.parameters_read(4) == 456
    # many tokens touch all experts
    assert m.parameters_read(10_000) == m.num_parameters == 480


def test_mixtral_parameters_read_grows_to_all_experts() -> None:
    m = MODEL_PRESETS["mixtral-8x7b"]
    # T = 2: 8 x (1 - (6/8)^2) = 8 x 0.4375 = 3.5 experts touched, 4.5 idle per layer:
    # 4.5 x 176,160,768 x 32 layers = 25,367,150,592 -> 46,702,526,464 - that = 21,335,375,872
    assert m.parameters_read(2) == 21_335_375_872
    read = [m.parameters_read(t) for t in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a < b for a, b in itertools.pairwise(read))
    assert read[0] == m.active_parameters
    assert read[-1] < m.num_parameters
    # T = 64: 8 x 0.75^64 = 8.1e-8 experts idle per layer, x 176,160,768 x 32 = ~456 weights
    assert m.num_parameters - read[-1] == pytest.approx(8 * 0.75**64 * 176_160_768 * 32, abs=1)
    assert 400 < m.num_parameters - read[-1] < 500
    assert m.parameters_read(10_000) == m.num_parameters


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b", "marconi-hybrid-7b"])
@pytest.mark.parametrize("t", [1, 7, 4096])
def test_dense_parameters_read_is_all_parameters(name: str, t: int) -> None:
    m = MODEL_PRESETS[name]
    assert m.parameters_read(t) == m.num_parameters == m.active_parameters


def test_mixtral_moe_flops_by_hand() -> None:
    m = MODEL_PRESETS["mixtral-8x7b"]
    # per layer, n = 1: 2 x 4096 x 14336 x 3 x 2 experts + router 2 x 4096 x 8
    assert m.prefill_flops(1)["moe"] == 32 * (2 * 4096 * 14336 * 3 * 2 + 2 * 4096 * 8)


def test_tiny_parameters_by_hand() -> None:
    # attention: 4x4 (Q) + 4x4 (O) + 2 x 4x4 (K, V) = 64; MLP 2 x 4 x 16 = 128;
    # SSM 4 x 2 x 8 + 8 x 4 = 96; untied embeddings 2 x 10 x 4 = 80 -> 368
    assert tiny().num_parameters == 368
    assert tiny().active_parameters == 368
    # tied: the embedding counted once, 368 - 40 = 328
    assert dataclasses.replace(tiny(), tie_embeddings=True).num_parameters == 328


def test_tied_embedding_presets() -> None:
    tied = {name for name, m in MODEL_PRESETS.items() if m.tie_embeddings}
    assert tied == {"llama-3.2-1b", "llama-3.2-3b", "gemma-3-12b", "gemma-3-27b"}
    assert ModelSpec("x", 4).tie_embeddings is False


def test_flop_efficiency_by_hand() -> None:
    m = tiny()
    # entry covers tokens [1, 3): credited with prefilling 3 tokens minus its parent's 1
    # (non-causal, Marconi's accounting): total(3) = 528 + 768 + 1272 = 2568;
    # total(1) = (2x1x4x16 + 4x1x1x4 = 144) + 256 + 424 = 824 -> 2568 - 824 = 1744 FLOPs;
    # holds 2 tokens of KV (2 x 16) + one checkpoint (112) = 144 bytes
    assert m.total_prefill_flops(1) == 824.0
    assert m.flop_efficiency(3, 1) == pytest.approx(1744 / 144, rel=1e-12)  # 12.11
    # the whole prefix as one entry (no parent): 2568 over 3 x 16 + 112 = 160 bytes
    assert m.flop_efficiency(3) == pytest.approx(2568 / 160, rel=1e-12)  # 16.05
    assert m.flop_efficiency(0) == 0.0
    # an empty edge adds no FLOPs over its parent: a hybrid's still holds a checkpoint
    assert m.flop_efficiency(3, 3) == 0.0
    # a transformer entry with an empty edge holds nothing
    assert MODEL_PRESETS["llama-3.2-1b"].flop_efficiency(5, 5) == math.inf


def test_flop_efficiency_grows_with_length_for_hybrid() -> None:
    lengths = [16, 128, 1024, 8192, 65536]
    whole = [HYBRID.flop_efficiency(n) for n in lengths]
    assert all(a < b for a, b in itertools.pairwise(whole))
    # fixed 16-token edges deeper in a longer prefix are worth more: attention grows
    edges = [HYBRID.flop_efficiency(n, n - 16) for n in lengths[1:]]
    assert all(a < b for a, b in itertools.pairwise(edges))
    # by hand: the edge [n - 16, n) adds a linear part (the same for every n) plus
    # 4 layers x 4 D (n^2 - (n - 16)^2) = 16 D (32 n - 256); from n = 128 to n = 1024 that
    # grows by 16 x 4096 x 32 x 896 = 1,879,048,192 FLOPs over the same bytes:
    # 16 x 65,536 + 26,787,840 = 27,836,416
    held = 16 * 65_536 + 26_787_840
    assert held == 27_836_416
    gain = (edges[1] - edges[0]) * held
    assert gain == pytest.approx(1_879_048_192, rel=1e-9)


def test_flop_efficiency_of_fixed_edge_is_flat_without_attention() -> None:
    # a pure SSM's FLOPs are linear in the tokens: a 16-token edge adds the same FLOPs at
    # any depth, and holds one checkpoint, so its efficiency does not grow with the parent
    mamba = MODEL_PRESETS["mamba2-2.7b"]
    edges = [mamba.flop_efficiency(n, n - 16) for n in (16, 128, 1024, 8192)]
    assert edges == pytest.approx([edges[0]] * 4, rel=1e-12)
    ckpt = mamba.state_bytes_per_checkpoint
    assert edges[0] == pytest.approx(mamba.total_prefill_flops(16) / ckpt, rel=1e-12)


def test_num_parameters_near_published() -> None:
    # llama-3.2-1b (tied): 16 x (2 x 2048^2 + 2 x 2048 x 512 + 3 x 2048 x 8192)
    # + 128256 x 2048 once = 16 x 60,817,408 + 262,668,288 = 1,235,746,816
    p1 = MODEL_PRESETS["llama-3.2-1b"].num_parameters
    assert p1 == 1_235_746_816
    assert abs(p1 / 1.24e9 - 1) < 0.03
    # untied it would count the embedding twice: + 262,668,288
    untied = dataclasses.replace(MODEL_PRESETS["llama-3.2-1b"], tie_embeddings=False)
    assert untied.num_parameters == 1_235_746_816 + 262_668_288
    # llama-3.2-3b (tied): 28 x (2 x 3072^2 + 2 x 3072 x 1024 + 3 x 3072 x 8192)
    # + 128256 x 3072 = 28 x 100,663,296 + 394,002,432 = 3,212,574,720 (published 3.21B)
    p3 = MODEL_PRESETS["llama-3.2-3b"].num_parameters
    assert p3 == 3_212_574_720
    assert abs(p3 / 3.21e9 - 1) < 0.03
    # llama-3.1-8b (untied): 32 x 218,103,808 + 2 x 525,336,576 (embedding and lm_head)
    # = 6,979,321,856 + 1,050,673,152 = 8,029,995,008
    p8 = MODEL_PRESETS["llama-3.1-8b"].num_parameters
    assert p8 == 8_029_995_008
    assert abs(p8 / 8.03e9 - 1) < 0.03


def test_mixtral_active_parameters() -> None:
    m = MODEL_PRESETS["mixtral-8x7b"]
    # active per layer: attention 41,943,040 + 2 experts x 3 x 4096 x 14336 (352,321,536)
    # + router 32,768 = 394,297,344; x 32 = 12,617,515,008 + untied embeddings
    # 2 x 32000 x 4096 = 262,144,000 -> 12,879,659,008
    assert m.active_parameters == 12_879_659_008
    assert abs(m.active_parameters / 12.9e9 - 1) < 0.03
    # all 8 experts: per layer 41,943,040 + 8 x 176,160,768 + 32,768 = 1,451,261,952;
    # x 32 = 46,440,382,464 + 262,144,000 = 46,702,526,464
    assert m.num_parameters == 46_702_526_464
    assert abs(m.num_parameters / 46.7e9 - 1) < 0.03


# ====================================================================== timing: power / tpot
def test_power_presets_1000_tokens() -> None:
    t1 = make_timing("power:preset=llama-3.2-1b-a100")
    # 5.56e-5 x 1000^1.034 = 5.56e-5 x 1264.7 = 0.07032 s
    assert t1.prefill_s([(1000, 0)]) == pytest.approx(0.0703, abs=0.0005)
    t8 = make_timing("power:preset=llama-3.1-8b-h100")
    # 3.59e-5 x 1000^1.018 = 0.04065 s
    assert t8.prefill_s([(1000, 0)]) == pytest.approx(0.0407, abs=0.0005)
    assert set(POWER_PRESETS) == {"llama-3.2-1b-a100", "llama-3.1-8b-h100"}


def test_power_law_batch_formula() -> None:
    a, b, c = 5.56e-5, 0.992, 1.034
    pl = PowerLaw(a, b, c)
    chunks = [(100, 0), (300, 50), (200, 7)]
    # BS = 3 chunks, L = (100 + 300 + 200) / 3 = 200; cached tokens do not matter
    assert pl.prefill_s(chunks) == pytest.approx(a * 3**b * 200**c, rel=1e-12)
    # simple numbers: 1e-4 x 2^0.5 x 200^1 = 0.0282842...
    assert PowerLaw(1e-4, 0.5, 1.0).prefill_s([(100, 0), (300, 0)]) == pytest.approx(
        1e-4 * math.sqrt(2) * 200, rel=1e-12
    )
    assert pl.prefill_s([]) == 0.0
    assert pl.decode_s([100]) == 0.0
    assert pl.spec() == f"power:a={a},b={b},c={c}"


def test_power_law_prices_a_later_chunk_as_its_increment() -> None:
    pl = PowerLaw(1e-4, 1.0, 2.0)
    # one prompt of 1000 in three steps; a chunk of L after d of its own tokens costs
    # a ((d + L)^2 - d^2): 1e-4 x 300^2 = 9; 1e-4 x (800^2 - 300^2) = 55;
    # 1e-4 x (1000^2 - 800^2) = 36 -> 100 = 1e-4 x 1000^2, the one-pass cost
    # (the middle part has 50 cache hits too: cached 350 = 50 hits + 300 done)
    parts = [[(300, 0)], [(500, 350, 300)], [(200, 850, 800)]]
    costs = [pl.prefill_s(c) for c in parts]
    assert costs == pytest.approx([9.0, 55.0, 36.0], rel=1e-12)
    assert sum(costs) == pytest.approx(pl.prefill_s([(1000, 0)]), rel=1e-9)
    assert pl.prefill_s([(1000, 0)]) == pytest.approx(100.0, rel=1e-12)
    # without `done` the last chunk would be priced as fresh: 1e-4 x 200^2 = 4
    assert pl.prefill_s([(200, 850)]) == pytest.approx(4.0, rel=1e-12)
    # in a batch its equivalent fresh length enters the formula: (200 after 300) ->
    # sqrt(500^2 - 300^2) = 400; with a fresh 100: BS = 2, mean (400 + 100) / 2 = 250
    # -> 1e-4 x 2 x 250^2 = 12.5
    assert pl.prefill_s([(200, 300, 300), (100, 0)]) == pytest.approx(12.5, rel=1e-12)
    # c = 1 is linear: the increment is L whatever came before
    lin = PowerLaw(1e-4, 1.0, 1.0)
    assert lin.prefill_s([(200, 300, 300)]) == pytest.approx(0.02, rel=1e-12)


@pytest.mark.parametrize("preset", sorted(POWER_PRESETS))
def test_power_law_chunked_prompt_costs_one_pass(preset: str) -> None:
    pl = PowerLaw(*POWER_PRESETS[preset])
    # 4096 tokens in chunks of 1000, 1000, 1000, 1096 (the first after 96 cache hits)
    pieces, hits, done, total = [1000, 1000, 1000, 1096], 96, 0, 0.0
    for n in pieces:
        total += pl.prefill_s([(n, hits + done, done)])
        done += n
    assert total == pytest.approx(pl.prefill_s([(4096, hits)]), rel=1e-9)


def test_constant_tpot() -> None:
    t = ConstantTPOT(0.02)
    assert t.decode_s([5, 100, 1000]) == 0.02  # one step, whatever the batch
    assert t.decode_s([]) == 0.0
    assert t.prefill_s([(100, 0)]) == 0.0
    assert t.step_s([(100, 0)], [5]) == 0.02
    assert make_timing("tpot").decode_s([1]) == 0.02  # default s
    assert make_timing("tpot:s=0.005").decode_s([1]) == 0.005


def test_composite_power_plus_tpot_sums() -> None:
    tm = make_timing("power:a=1e-4,b=1,c=1+tpot:s=0.02")
    assert isinstance(tm, Composite)
    assert isinstance(tm.prefill, PowerLaw) and isinstance(tm.decode, ConstantTPOT)
    # prefill 1e-4 x 2 x 150 = 0.03, decode 0.02
    assert tm.prefill_s([(100, 0), (200, 0)]) == pytest.approx(0.03, rel=1e-12)
    assert tm.step_s([(100, 0), (200, 0)], [10, 20]) == pytest.approx(0.05, rel=1e-12)
    assert tm.step_s([], [10]) == pytest.approx(0.02)
    assert tm.step_s([(100, 0)], []) == pytest.approx(0.01)
    assert tm.step_s([], []) == 0.0
    assert tm.spec() == "power:a=0.0001,b=1.0,c=1.0+tpot:s=0.02"


def test_make_timing_list_form_equals_plus_form() -> None:
    a = make_timing(["power:preset=llama-3.2-1b-a100", "tpot:s=0.03"])
    b = make_timing("power:preset=llama-3.2-1b-a100+tpot:s=0.03")
    assert a.spec() == b.spec() == "power:a=5.56e-05,b=0.992,c=1.034+tpot:s=0.03"
    assert a.step_s([(500, 0)], [9]) == b.step_s([(500, 0)], [9])
    # the spec string round-trips
    assert make_timing(a.spec()).spec() == a.spec()


def test_make_timing_prefill_only_and_decode_only() -> None:
    p = make_timing("power:preset=llama-3.1-8b-h100")
    assert p.times_prefill and not p.times_decode
    assert p.decode_s([100]) == 0.0
    d = make_timing("tpot:s=0.01")
    assert d.times_decode and not d.times_prefill
    assert d.prefill_s([(100, 0)]) == 0.0


# ====================================================================== timing: table
def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def table(tmp_path: Path) -> TableTiming:
    # written unsorted on purpose
    csv_text = "input_tokens,ttft_s\n400,0.05\n100,0.01\n200,0.03\n"
    return TableTiming(write(tmp_path / "t.csv", csv_text))


def test_table_interpolates_inside(table: TableTiming) -> None:
    assert table.prefill_s([(150, 0)]) == pytest.approx(0.02, rel=1e-12)  # mid of 0.01, 0.03
    assert table.prefill_s([(300, 0)]) == pytest.approx(0.04, rel=1e-12)  # mid of 0.03, 0.05
    assert table.prefill_s([(200, 0)]) == pytest.approx(0.03, rel=1e-12)  # a row itself


def test_table_extrapolates_from_end_segments(table: TableTiming) -> None:
    # above: slope (0.05 - 0.03) / 200 = 1e-4 -> 0.05 + 100 x 1e-4 = 0.06
    assert table.prefill_s([(500, 0)]) == pytest.approx(0.06, rel=1e-12)
    # below: slope (0.03 - 0.01) / 100 = 2e-4 -> 0.01 - 20 x 2e-4 = 0.006
    assert table.prefill_s([(80, 0)]) == pytest.approx(0.006, rel=1e-12)
    # far below would go negative (0.01 - 90 x 2e-4 = -0.008): clamped at 0
    assert table.prefill_s([(10, 0)]) == 0.0


def test_table_sums_chunks_and_ignores_cached(table: TableTiming) -> None:
    # 0.02 + 0.04 + (no new tokens: 0)
    assert table.prefill_s([(150, 0), (300, 999), (0, 5)]) == pytest.approx(0.06, rel=1e-12)
    assert table.prefill_s([]) == 0.0
    assert table.decode_s([100]) == 0.0


def test_table_prices_a_later_chunk_as_its_increment(table: TableTiming) -> None:
    # t(L): 100 -> 0.01, 200 -> 0.03, 400 -> 0.05 (slope 1e-4 between 200 and 400)
    # a 300-token prompt in chunks 100, 150, 50: t(100) = 0.01;
    # t(250) - t(100) = 0.035 - 0.01 = 0.025; t(300) - t(250) = 0.04 - 0.035 = 0.005
    parts = [[(100, 0)], [(150, 100, 100)], [(50, 250, 250)]]
    costs = [table.prefill_s(c) for c in parts]
    assert costs == pytest.approx([0.01, 0.025, 0.005], rel=1e-12)
    assert sum(costs) == pytest.approx(table.prefill_s([(300, 0)]), rel=1e-9)
    assert table.prefill_s([(300, 0)]) == pytest.approx(0.04, rel=1e-12)
    # the same chunk fresh costs t(150) = 0.02, not 0.025
    assert table.prefill_s([(150, 100)]) == pytest.approx(0.02, rel=1e-12)
    # a batch sums its chunks' increments: 0.025 + t(150) = 0.045
    assert table.prefill_s([(150, 100, 100), (150, 0)]) == pytest.approx(0.045, rel=1e-12)


def test_table_chunked_prompt_costs_one_pass_with_extrapolation(table: TableTiming) -> None:
    # chunks crossing the rows and running past the last one (extrapolated above 400)
    pieces, done, total = [60, 90, 170, 230, 150], 0, 0.0
    for n in pieces:
        total += table.prefill_s([(n, done, done)])
        done += n
    # t(700) = 0.05 + 300 x 1e-4 = 0.08
    assert total == pytest.approx(table.prefill_s([(700, 0)]), rel=1e-9)
    assert total == pytest.approx(0.08, rel=1e-9)


def test_table_single_row_is_proportional(tmp_path: Path) -> None:
    t = TableTiming(write(tmp_path / "one.csv", "input_tokens,ttft_s\n100,0.02\n"))
    # 0.02 x 250 / 100 = 0.05
    assert t.prefill_s([(250, 0)]) == pytest.approx(0.05, rel=1e-12)
    assert t.prefill_s([(50, 0)]) == pytest.approx(0.01, rel=1e-12)


def test_table_via_make_timing(tmp_path: Path) -> None:
    p = write(tmp_path / "t.csv", "input_tokens,ttft_s\n100,0.01\n200,0.03\n")
    tm = make_timing(f"table:path={p}+tpot:s=0.02")
    assert isinstance(tm.prefill, TableTiming)
    assert tm.step_s([(150, 0)], [1]) == pytest.approx(0.02 + 0.02, rel=1e-12)
    assert tm.spec() == f"table:path={p}+tpot:s=0.02"


@pytest.mark.parametrize(
    ("text", "line", "field", "needle"),
    [
        ("input_tokens,seconds\n100,0.01\n", 1, "ttft_s", "column missing"),
        ("tokens,ttft_s\n100,0.01\n", 1, "input_tokens", "column missing"),
        ("input_tokens,ttft_s\n100,0.01\n200,abc\n", 3, "ttft_s", "got 'abc'"),
        ("input_tokens,ttft_s\n-5,0.01\n200,0.02\n", 2, "input_tokens", "got -5.0"),
        ("input_tokens,ttft_s\n100,0.01\n200,inf\n", 3, "ttft_s", "got inf"),
        ("input_tokens,ttft_s\n100,0.01\n200\n", 3, "ttft_s", "got None"),
    ],
)
def test_table_bad_csv_names_file_line_column(
    tmp_path: Path, text: str, line: int, field: str, needle: str
) -> None:
    p = write(tmp_path / "bad.csv", text)
    with pytest.raises(TraceFormatError) as exc:
        TableTiming(p)
    assert exc.value.path == str(p)
    assert exc.value.line == line
    assert exc.value.field == field
    msg = str(exc.value)
    assert msg.startswith(f"{p}:{line}: field '{field}'")
    assert needle in msg


def test_table_duplicate_lengths(tmp_path: Path) -> None:
    p = write(tmp_path / "dup.csv", "input_tokens,ttft_s\n100,0.01\n100,0.02\n")
    with pytest.raises(TraceFormatError, match="appears twice") as exc:
        TableTiming(p)
    assert exc.value.field == "input_tokens"
    assert str(p) in str(exc.value)


def test_table_duplicate_lengths_names_line_and_value(tmp_path: Path) -> None:
    p = write(tmp_path / "dup.csv", "input_tokens,ttft_s\n100,0.01\n100,0.02\n")
    with pytest.raises(TraceFormatError) as exc:
        TableTiming(p)
    assert exc.value.line == 3
    assert "100" in str(exc.value).replace(str(p), "")


def test_table_no_rows_and_missing_file(tmp_path: Path) -> None:
    p = write(tmp_path / "empty.csv", "input_tokens,ttft_s\n")
    with pytest.raises(TraceFormatError, match="no rows") as exc:
        TableTiming(p)
    assert str(p) in str(exc.value)
    missing = tmp_path / "nope.csv"
    with pytest.raises(ConfigError, match=re.escape(f"timing table not found: {missing}")):
        TableTiming(missing)
    with pytest.raises(ConfigError, match="not found"):
        make_timing(f"table:path={missing}")


# ====================================================================== timing: roofline
TOY_GPU_MEM = GPU("toy-mem", peak_flops=1000.0, mem_bandwidth=100.0, mem_bytes=0)
TOY_GPU_FLOP = GPU("toy-flop", peak_flops=100.0, mem_bandwidth=1000.0, mem_bytes=0)


def test_roofline_prefill_by_hand_compute_bound() -> None:
    r = Roofline(tiny(), TOY_GPU_FLOP, mfu=0.5, mbu=0.5)
    # causal FLOPs of (3 new, 2 cached) = 552 + 768 + 1272 = 2592 -> 2592 / (100 x 0.5)
    # = 51.84 s (the non-causal 2664 would give 53.28)
    # bytes: weights 368 x 2 = 736 + KV (3 + 2) x 16 = 80 -> 816 / (1000 x 0.5) = 1.632 s
    assert r.prefill_s([(3, 2)]) == pytest.approx(max(2592 / 50, 816 / 500), rel=1e-12)
    assert r.prefill_s([(3, 2)]) == pytest.approx(51.84, rel=1e-12)


def test_roofline_prefill_and_decode_by_hand_memory_bound() -> None:
    r = Roofline(tiny(), TOY_GPU_MEM, mfu=0.5, mbu=0.5)
    # prefill: compute 2592 / 500 = 5.184; memory 816 / 50 = 16.32
    assert r.prefill_s([(3, 2)]) == pytest.approx(max(2592 / 500, 816 / 50), rel=1e-12)
    assert r.prefill_s([(3, 2)]) == pytest.approx(16.32, rel=1e-12)
    # decode of contexts [5, 5]: causal FLOPs 2 x 896 = 1792 -> 1792 / 500 = 3.584
    # bytes 736 + KV 2 x 5 x 16 = 160 + states 2 x 112 = 224 -> 1120 / 50 = 22.4
    assert r.decode_s([5, 5]) == pytest.approx(max(1792 / 500, 1120 / 50), rel=1e-12)
    assert r.decode_s([5, 5]) == pytest.approx(22.4, rel=1e-12)


def test_roofline_moe_reads_the_experts_the_step_touches() -> None:
    # moe_toy: no attention (no KV, no state); 416 FLOPs per token (experts 2 x 4 x 8 x 3
    # x 2 = 384 + router 2 x 4 x 4 = 32); parameters read by T tokens: 288, 384, 432, 456
    # for T = 1..4 (test_moe_parameters_read_by_hand). Memory-bound: bytes / 50, FLOPs / 500
    r = Roofline(moe_toy(), TOY_GPU_MEM, mfu=0.5, mbu=0.5)
    # one token: 288 x 2 = 576 bytes -> 11.52 s (compute 416 / 500 = 0.832)
    assert r.prefill_s([(1, 0)]) == pytest.approx(max(416 / 500, 576 / 50), rel=1e-12)
    assert r.prefill_s([(1, 0)]) == pytest.approx(11.52, rel=1e-12)
    # two chunks, 1 + 2 = 3 new tokens: 432 x 2 = 864 bytes -> 17.28 s; cached tokens add
    # no bytes without attention
    assert r.prefill_s([(1, 0), (2, 5)]) == pytest.approx(17.28, rel=1e-12)
    # decode of 2 sequences: 2 tokens, 384 x 2 = 768 -> 15.36 s; of 4: 456 x 2 = 912 -> 18.24
    assert r.decode_s([5, 5]) == pytest.approx(15.36, rel=1e-12)
    assert r.decode_s([5, 9, 1, 3]) == pytest.approx(18.24, rel=1e-12)
    # a mixed step counts both: 1 prefill token + 2 decode tokens = 3 -> 864 bytes -> 17.28
    # (priced separately: 11.52 + 15.36 = 26.88)
    assert r.step_s([(1, 0)], [5, 5]) == pytest.approx(17.28, rel=1e-12)


def test_roofline_chunked_prompt_costs_one_pass_when_compute_bound() -> None:
    r = Roofline(tiny(), TOY_GPU_FLOP, mfu=0.5, mbu=0.5)
    # causal FLOPs add up over chunks: 816 (1 after 0) + 1680 (2 after 1) = 2496 (3 after 0),
    # each step compute-bound (bytes at most (736 + 48) / 500 = 1.568 s):
    # 816 / 50 + 1680 / 50 = 16.32 + 33.6 = 49.92 = 2496 / 50
    first, second = r.prefill_s([(1, 0)]), r.prefill_s([(2, 1, 1)])
    assert (first, second) == pytest.approx((16.32, 33.6), rel=1e-12)
    assert first + second == pytest.approx(r.prefill_s([(3, 0)]), rel=1e-9)
    assert r.prefill_s([(3, 0)]) == pytest.approx(49.92, rel=1e-12)
    # memory-bound, every step reads the weights again, so chunking costs more:
    # (736 + 16) / 50 + (736 + 48) / 50 = 15.04 + 15.68 = 30.72 vs (736 + 48) / 50 = 15.68
    m = Roofline(tiny(), TOY_GPU_MEM, mfu=0.5, mbu=0.5)
    assert m.prefill_s([(1, 0)]) + m.prefill_s([(2, 1, 1)]) == pytest.approx(30.72)
    assert m.prefill_s([(3, 0)]) == pytest.approx(15.68, rel=1e-12)


def test_roofline_chunked_8b_prompt_costs_one_pass() -> None:
    m = MODEL_PRESETS["llama-3.1-8b"]
    r = Roofline(m, GPU_PRESETS["h100"])
    # 8192 tokens after 100 hits in four 2048-token steps: each compute-bound (2048 tokens
    # x ~2 x 8e9 FLOPs = 3.3e13 / (989e12 x 0.5) = 66 ms vs 16 GB / (3.35e12 x 0.7) = 7 ms)
    done, total = 0, 0.0
    for _ in range(4):
        total += r.prefill_s([(2048, 100 + done, done)])
        done += 2048
    assert total == pytest.approx(r.prefill_s([(8192, 100)]), rel=1e-9)


def test_roofline_llama_decode_by_hand() -> None:
    m = MODEL_PRESETS["llama-3.2-1b"]
    r = Roofline(m, GPU_PRESETS["a100"], mfu=0.5, mbu=0.7)
    # one sequence, 1000 tokens of context, per layer (causal):
    # attention 2 x 2048 x (2 x 2048 + 2 x 512) + 4 x 1000 x 2048 + 2 x 1 x 2048
    # = 20,971,520 + 8,192,000 + 4,096 = 29,167,616
    # MLP 2 x 2048 x 8192 x 3 = 100,663,296; x 16 layers -> 2,077,294,592 FLOPs
    flops = 16 * (29_167_616 + 100_663_296)
    assert flops == 2_077_294_592 == m.decode_flops(1000, True)
    # bytes: weights 1,235,746,816 x 2 = 2,471,493,632 + KV 1000 x 32,768 = 32,768,000
    num_bytes = 2_471_493_632 + 32_768_000
    compute = flops / (312e12 * 0.5)  # 1.33e-5 s
    memory = num_bytes / (2.039e12 * 0.7)  # 1.75e-3 s
    assert r.decode_s([1000]) == pytest.approx(max(compute, memory), rel=1e-12)
    assert memory > 100 * compute  # decode of one sequence is memory-bound


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b", "llama-3.2-1b", "marconi-hybrid-7b", "mixtral-8x7b"]
)
def test_roofline_regimes(name: str) -> None:
    m = MODEL_PRESETS[name]
    gpu = GPU_PRESETS["h100"]
    r = Roofline(m, gpu, mfu=0.5, mbu=0.7)

    def memory_s(tokens: int, extra: float) -> float:
        # the weights a step over `tokens` tokens reads (all of them unless MoE) + extra
        return (m.parameters_read(tokens) * m.dtype_bytes + extra) / (gpu.mem_bandwidth * 0.7)

    # small decode batch: the bytes term decides (4 sequences = 4 tokens' weights)
    ctx = [500] * 4
    extra = sum(ctx) * m.kv_bytes_per_token + 4 * m.state_bytes_per_checkpoint
    dec_flops = sum(m.decode_flops(c, True) for c in ctx) / (gpu.peak_flops * 0.5)
    assert memory_s(4, extra) > dec_flops
    assert r.decode_s(ctx) == pytest.approx(memory_s(4, extra), rel=1e-12)
    # big prefill: the (causal) FLOPs term decides
    big = [(8192, 0)]
    pre_flops = m.total_prefill_flops(8192, 0, True) / (gpu.peak_flops * 0.5)
    assert pre_flops > memory_s(8192, 8192 * m.kv_bytes_per_token)
    assert r.prefill_s(big) == pytest.approx(pre_flops, rel=1e-12)
    assert r.prefill_s(big) < m.total_prefill_flops(8192) / (gpu.peak_flops * 0.5)


def test_lone_roofline_prices_mixed_step_as_a_whole() -> None:
    tm = make_timing("roofline:mfu=0.5,mbu=0.5", tiny(), TOY_GPU_MEM)
    assert isinstance(tm, Composite) and tm.prefill is tm.decode
    assert isinstance(tm.prefill, Roofline)
    chunks, contexts = [(3, 2)], [5, 5]
    # causal FLOPs 2592 + 1792 = 4384 -> 8.768 s; bytes (weights read once) 736 + 80 + 160
    # + 224 = 1200 -> 24.0 s; separately 16.32 + 22.4 = 38.72
    assert tm.step_s(chunks, contexts) == pytest.approx(max(4384 / 500, 1200 / 50), rel=1e-12)
    assert tm.step_s(chunks, contexts) == pytest.approx(24.0, rel=1e-12)
    assert tm.prefill_s(chunks) + tm.decode_s(contexts) == pytest.approx(38.72, rel=1e-12)
    assert tm.prefill_s(chunks) > 0 and tm.decode_s(contexts) > 0
    assert tm.step_s(chunks, contexts) != pytest.approx(
        tm.prefill_s(chunks) + tm.decode_s(contexts)
    )
    assert tm.step_s([], []) == 0.0
    assert tm.spec() == "roofline:mfu=0.5,mbu=0.5"


def test_roofline_plus_tpot_sums_roofline_prefill_and_tpot() -> None:
    tm = make_timing("roofline:mfu=0.5,mbu=0.5+tpot:s=2", tiny(), TOY_GPU_MEM)
    assert isinstance(tm.prefill, Roofline) and isinstance(tm.decode, ConstantTPOT)
    # roofline prefill 16.32 (memory-bound, 816 / 50) + tpot 2
    assert tm.step_s([(3, 2)], [5, 5]) == pytest.approx(18.32, rel=1e-12)
    assert tm.step_s([], [5]) == 2.0


def test_roofline_defaults_and_presets_by_name() -> None:
    tm = make_timing("roofline", "llama-3.1-8b", "H100")
    r = tm.prefill
    assert isinstance(r, Roofline)
    assert (r.mfu, r.mbu) == (0.5, 0.7)
    assert r.gpu is GPU_PRESETS["h100"]
    assert r.model is MODEL_PRESETS["llama-3.1-8b"]


def test_roofline_empty_parts_cost_nothing() -> None:
    r = Roofline(MODEL_PRESETS["llama-3.2-1b"], GPU_PRESETS["a100"])
    assert r.prefill_s([]) == 0.0
    assert r.decode_s([]) == 0.0


# ====================================================================== make_timing errors
@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "no timing model given"),
        ("+", "no timing model given"),
        ("magic:x=1", "unknown timing model 'magic'; known: power, tpot, table, roofline"),
        ("power:a=1,b=1,c=1,d=2", "timing 'power' has no parameter 'd'; it takes a, b, c, preset"),
        ("tpot:ms=20", "timing 'tpot' has no parameter 'ms'; it takes s"),
        ("power:a=1,b=1", "missing {'c'}"),
        ("power:preset=gpt-9-tpu", "power preset 'gpt-9-tpu' unknown"),
        ("power:preset=llama-3.2-1b-a100,a=1", "combined with a, b, c"),
        ("power:a=nan,b=1,c=1", "timing 'power': a must be a finite number, got nan"),
        ("power:a=1,b=inf,c=1", "timing 'power': b must be a finite number, got inf"),
        ("power:a=1,b=1,c=-inf", "c must be a finite number, got -inf"),
        ("power:a=0,b=1,c=1", "timing 'power': a must be > 0.0, got 0"),
        ("power:a=fast,b=1,c=1", "a must be a finite number, got 'fast'"),
        ("power:a=true,b=1,c=1", "a must be a finite number, got True"),
        ("tpot:s=nan", "timing 'tpot': s must be a finite number, got nan"),
        ("tpot:s=-1", "timing 'tpot': s must be > "),
        ("table", "timing 'table' needs path=CSV"),
        ("power:a", "expected key=value, got 'a'"),
        (
            "power:preset=llama-3.2-1b-a100+power:a=1,b=1,c=1",
            "more than one prefill timing model: power:a=5.56e-05",
        ),
        ("tpot:s=0.01+tpot:s=0.02", "more than one tpot timing model"),
    ],
)
def test_make_timing_errors(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_timing(spec)
    assert needle in str(exc.value)


def test_make_timing_two_prefill_models_with_table(tmp_path: Path) -> None:
    p = write(tmp_path / "t.csv", "input_tokens,ttft_s\n100,0.01\n200,0.03\n")
    with pytest.raises(ConfigError, match=r"more than one prefill timing model: power.*table"):
        make_timing(["power:preset=llama-3.2-1b-a100", f"table:path={p}"])


@pytest.mark.parametrize(("model", "gpu"), [(None, None), ("llama-3.1-8b", None), (None, "a100")])
def test_roofline_needs_model_and_gpu(model: str | None, gpu: str | None) -> None:
    with pytest.raises(ConfigError, match=r"'roofline' needs a model and a GPU \(--model, --gpu\)"):
        make_timing("roofline", model, gpu)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("roofline:mfu=1.5", "at most 1"),
        ("roofline:mbu=2", "at most 1"),
        ("roofline:mfu=0", "mfu must be > 0.0, got 0"),
        ("roofline:mbu=nan", "mbu must be a finite number, got nan"),
        ("roofline:peak=1", "timing 'roofline' has no parameter 'peak'; it takes mbu, mfu"),
    ],
)
def test_roofline_parameter_errors(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_timing(spec, "llama-3.1-8b", "a100")
    assert needle in str(exc.value)


def test_make_timing_unknown_model_and_gpu() -> None:
    with pytest.raises(ConfigError, match=r"unknown model 'gpt-9'"):
        make_timing("roofline", "gpt-9", "a100")
    with pytest.raises(ConfigError, match=r"unknown GPU 'tpu9'; known: a100, h100, h200, a6000"):
        make_timing("roofline", "llama-3.1-8b", "tpu9")


@pytest.mark.parametrize(
    ("spec", "bad"), [("roofline:mfu=1.5", "1.5"), ("power:preset=gpt-9-tpu", "gpt-9-tpu")]
)
def test_timing_errors_name_the_bad_value(spec: str, bad: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_timing(spec, "llama-3.1-8b", "a100")
    assert bad in str(exc.value)


def test_exponent_plus_sign_is_not_a_separator() -> None:
    tm = make_timing("power:a=1e+3,b=1,c=1")
    assert isinstance(tm.prefill, PowerLaw)
    assert tm.prefill.a == 1000.0


# ====================================================================== fit
def synthetic(noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t = 5e-5 x BS^0.9 x L^1.05 x exp(N(0, noise)) on a 4 x 7 grid."""
    rng = np.random.default_rng(seed)
    bs, n = np.meshgrid([1.0, 2.0, 4.0, 8.0], [128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0])
    bs, n = bs.ravel(), n.ravel()
    t = 5e-5 * bs**0.9 * n**1.05 * np.exp(rng.normal(0.0, noise, bs.size))
    return bs, n, t


def test_fit_recovers_parameters_with_noise() -> None:
    fit = fit_power_law(*synthetic(0.01))
    assert fit.a == pytest.approx(5e-5, rel=0.02)
    assert fit.b == pytest.approx(0.9, rel=0.02)
    assert fit.c == pytest.approx(1.05, rel=0.02)
    assert fit.r2 > 0.99 and fit.r2_log > 0.99
    assert fit.num_points == 28
    assert fit.b_fixed is False
    # the noise is visible: not a perfect fit
    assert fit.r2 < 1.0


def test_fit_exact_data_r2_one() -> None:
    fit = fit_power_law(*synthetic(0.0))
    assert (fit.a, fit.b, fit.c) == pytest.approx((5e-5, 0.9, 1.05), rel=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.r2_log == pytest.approx(1.0, abs=1e-12)


def test_fit_two_points_exact_by_hand() -> None:
    # t = 0.001 x L: L = 100 -> 0.1, L = 1000 -> 1.0; b fixed (one batch size)
    fit = fit_power_law(np.array([1, 1]), np.array([100, 1000]), np.array([0.1, 1.0]))
    assert fit.a == pytest.approx(0.001, rel=1e-9)
    assert fit.c == pytest.approx(1.0, rel=1e-9)
    assert fit.b == 1.0 and fit.b_fixed


def test_fit_single_batch_size_fixes_b_at_one() -> None:
    # all batches of 4: t = a x 4^1 x L^c with a = 2e-5, c = 1.1
    n = np.array([100.0, 200.0, 400.0, 800.0])
    bs = np.full(4, 4.0)
    t = 2e-5 * 4 * n**1.1
    fit = fit_power_law(bs, n, t)
    assert fit.b_fixed is True
    assert fit.b == 1.0
    assert fit.a == pytest.approx(2e-5, rel=1e-9)
    assert fit.c == pytest.approx(1.1, rel=1e-9)


@pytest.mark.parametrize(
    ("bs", "n", "t", "needle"),
    [
        ([1], [100], [0.1], "at least 2 points"),
        ([1, 1], [100, 200], [0.1], "at least 2 points"),
        ([1, 1], [100, 200], [0.1, 0.0], "positive"),
        ([1, 1], [100, -200], [0.1, 0.2], "positive"),
        ([0, 1], [100, 200], [0.1, 0.2], "positive"),
        ([1, 2], [100, 100], [0.1, 0.2], "at least 2 distinct input lengths"),
    ],
)
def test_fit_bad_inputs(bs: list, n: list, t: list, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        fit_power_law(np.array(bs), np.array(n), np.array(t))


def test_fit_non_finite_is_config_error() -> None:
    with pytest.raises(ConfigError):
        fit_power_law(np.array([1.0, 1.0]), np.array([100.0, np.inf]), np.array([0.1, 0.2]))


def write_fit_csv(path: Path, with_bs: bool) -> Path:
    bs, n, t = synthetic(0.0) if with_bs else (np.ones(4), np.array([100, 200, 400, 800]), None)
    if t is None:
        t = 1e-4 * n**1.02
    header = "batch_size,input_tokens,ttft_s" if with_bs else "input_tokens,ttft_s"
    lines = [header]
    for b, k, s in zip(bs, n, t, strict=True):
        cells = ([f"{int(b)}"] if with_bs else []) + [f"{int(k)}", repr(float(s))]
        lines.append(",".join(cells))
    return write(path, "\n".join(lines) + "\n")


def test_fit_csv_with_batch_size(tmp_path: Path) -> None:
    fit = fit_csv(write_fit_csv(tmp_path / "m.csv", with_bs=True))
    assert isinstance(fit, PowerFit)
    assert (fit.a, fit.b, fit.c) == pytest.approx((5e-5, 0.9, 1.05), rel=1e-6)
    assert fit.num_points == 28 and not fit.b_fixed


def test_fit_csv_without_batch_size(tmp_path: Path) -> None:
    fit = fit_csv(write_fit_csv(tmp_path / "m.csv", with_bs=False))
    assert fit.b_fixed and fit.b == 1.0
    assert (fit.a, fit.c) == pytest.approx((1e-4, 1.02), rel=1e-6)
    assert fit.num_points == 4


@pytest.mark.parametrize(
    ("text", "line", "field", "needle"),
    [
        ("input_tokens,time\n100,0.1\n", 1, "ttft_s", "column missing"),
        ("input_tokens,ttft_s\n100,0.1\n200,x\n", 3, "ttft_s", "expected a number, got 'x'"),
        ("input_tokens,ttft_s\n100,0.1\n0,0.2\n", 3, "input_tokens", "must be > 0, got '0'"),
        ("batch_size,input_tokens,ttft_s\n-1,100,0.1\n1,200,0.2\n", 2, "batch_size", "'-1'"),
        ("input_tokens,ttft_s\n100,nan\n200,0.2\n", 2, "ttft_s", "must be > 0, got 'nan'"),
        ("input_tokens,ttft_s\n100,\n200,0.2\n", 2, "ttft_s", "expected a number, got ''"),
    ],
)
def test_fit_csv_errors_name_line_and_column(
    tmp_path: Path, text: str, line: int, field: str, needle: str
) -> None:
    p = write(tmp_path / "bad.csv", text)
    with pytest.raises(TraceFormatError) as exc:
        fit_csv(p)
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(p), line, field)
    assert str(exc.value).startswith(f"{p}:{line}: field '{field}'")
    assert needle in str(exc.value)


def test_fit_csv_too_few_rows_and_missing_file(tmp_path: Path) -> None:
    p = write(tmp_path / "one.csv", "input_tokens,ttft_s\n100,0.1\n")
    with pytest.raises(TraceFormatError, match="need at least 2 rows to fit") as exc:
        fit_csv(p)
    assert str(p) in str(exc.value)
    with pytest.raises(ConfigError, match="timing CSV not found"):
        fit_csv(tmp_path / "absent.csv")


def test_fit_timing_cli_json(tmp_path: Path) -> None:
    p = write_fit_csv(tmp_path / "m.csv", with_bs=True)
    result = runner.invoke(app, ["fit-timing", str(p), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"a", "b", "c", "r2", "r2_log", "num_points", "b_fixed", "spec"}
    assert (out["a"], out["b"], out["c"]) == pytest.approx((5e-5, 0.9, 1.05), rel=1e-6)
    assert out["r2"] == pytest.approx(1.0, abs=1e-9)
    assert out["num_points"] == 28 and out["b_fixed"] is False
    assert out["spec"] == fit_csv(p).spec()
    assert out["spec"].startswith("power:a=5e-05,b=0.9,c=1.05")


def test_fit_timing_cli_human(tmp_path: Path) -> None:
    p = write_fit_csv(tmp_path / "m.csv", with_bs=False)
    result = runner.invoke(app, ["fit-timing", str(p)])
    assert result.exit_code == 0, result.output
    assert "t = 0.0001 * BS^1 * L^1.02 (b fixed: one batch size in the data)" in result.stdout
    assert "R^2 = 1.0000 (log scale 1.0000) over 4 points" in result.stdout
    assert "timing spec: power:a=0.0001,b=1,c=1.02" in result.stdout


def test_fit_timing_cli_error(tmp_path: Path) -> None:
    p = write(tmp_path / "bad.csv", "input_tokens,ttft_s\n100,0.1\n200,oops\n")
    result = runner.invoke(app, ["fit-timing", str(p), "--json"])
    assert result.exit_code == 2
    assert "error:" in result.stderr
    assert ":3: field 'ttft_s'" in result.stderr
    assert "oops" in result.stderr
    assert result.stdout == ""


def test_fitted_spec_round_trips_and_reproduces_data() -> None:
    bs, n, t = synthetic(0.01, seed=3)
    fit = fit_power_law(bs, n, t)
    tm = make_timing(fit.spec())
    assert isinstance(tm.prefill, PowerLaw)
    assert tm.spec() == make_timing(tm.spec()).spec()
    # the 6-digit spec gives the fit's own predictions: rounding a, b, c to 6 significant
    # digits moves log t by at most ~5e-6 x (1 + log 8 + log 8192) ~ 6e-5
    worst_noise = 0.0
    for b, k, s in zip(bs, n, t, strict=True):
        pred = tm.prefill_s([(int(k), 0)] * int(b))
        assert pred == pytest.approx(fit.a * b**fit.b * k**fit.c, rel=1e-4)
        worst_noise = max(worst_noise, abs(pred / s - 1))
    # multiplicative noise of sigma 1%: every point within 4%
    assert worst_noise < 0.04
    # with exact data the round-tripped spec reproduces the data to 6 digits
    bs0, n0, t0 = synthetic(0.0)
    tm0 = make_timing(fit_power_law(bs0, n0, t0).spec())
    for b, k, s in zip(bs0, n0, t0, strict=True):
        assert tm0.prefill_s([(int(k), 0)] * int(b)) == pytest.approx(s, rel=1e-4)
