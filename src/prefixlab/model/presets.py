"""Model presets: dense and MoE transformers, Marconi's hybrid, and current models whose
published ``config.json`` ships with prefixlab (``model/configs``, the keys it reads).

The models from configs, and what their layers cost (docs/models.md has the table)::

    deepseek-v3, kimi-k2     MLA: one 576-element latent per token and layer, FP8 weights
    gemma-3-27b, -12b        5 sliding-window (1024) layers to 1 global
    gpt-oss-120b, -20b       sliding (128) and global layers alternating, MXFP4 experts
    qwen3-next-80b-a3b       Gated DeltaNet linear attention, full attention every 4th layer
    nemotron-h-8b            Mamba-2 with 4 attention layers
    jamba-1.5-mini           Mamba-1 with attention 1 layer in 8, MoE every other layer
"""

from __future__ import annotations

from pathlib import Path

from prefixlab.model.architecture import ModelSpec
from prefixlab.model.hf import load_model_file

#: the published configs prefixlab ships, by preset name
CONFIG_DIR = Path(__file__).with_name("configs")


def _from_config(name: str) -> ModelSpec:
    spec = load_model_file(str(CONFIG_DIR / f"{name}.json"))
    return ModelSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "name": name})


def _llama(
    name: str,
    layers: int,
    d: int,
    heads: int,
    kv: int,
    hd: int,
    ff: int,
    v: int,
    tie: bool = False,
) -> ModelSpec:
    return ModelSpec(
        name,
        d,
        num_attention_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        num_mlp_layers=layers,
        intermediate_size=ff,
        vocab_size=v,
        tie_embeddings=tie,
    )


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128_256, tie=True),
        _llama("llama-3.2-3b", 28, 3072, 24, 8, 128, 8192, 128_256, tie=True),
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 128, 14_336, 128_256),
        _llama("qwen3-32b", 64, 5120, 64, 8, 128, 25_600, 151_936),
        ModelSpec(
            "mixtral-8x7b",
            4096,
            num_attention_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            num_moe_layers=32,
            num_experts=8,
            experts_per_token=2,
            moe_intermediate_size=14_336,
            vocab_size=32_000,
        ),
        # Marconi's 7B hybrid: MHA attention (32 heads x 128), plain 4D MLPs, Mamba layers
        # with expand 2 and N = 128. The state accounting (D channels x N, conv over
        # d_inner + 2N with kernel 4) reproduces all three of the paper's figures.
        ModelSpec(
            "marconi-hybrid-7b",
            4096,
            num_attention_layers=4,
            num_heads=32,
            num_kv_heads=32,
            head_dim=128,
            num_mlp_layers=28,
            intermediate_size=16_384,
            mlp_matrices=2,
            num_ssm_layers=24,
            ssm_d_inner=8192,
            ssm_d_state=128,
            ssm_state_channels=4096,
            ssm_conv_dim=8192 + 2 * 128,
            ssm_conv_kernel=4,
            vocab_size=32_000,
        ),
        *(_from_config(p.stem) for p in sorted(CONFIG_DIR.glob("*.json"))),
        # A pure Mamba2 (2.7B): 64 layers, D = 2560, expand 2, N = 128, 1 group, conv 4 (of
        # which engines keep kernel - 1 = 3 columns as state).
        ModelSpec(
            "mamba2-2.7b",
            2560,
            num_ssm_layers=64,
            ssm_d_inner=5120,
            ssm_d_state=128,
            ssm_conv_dim=5120 + 2 * 128,
            ssm_conv_kernel=3,
            vocab_size=50_288,
        ),
    )
}


#: other names users write for a preset
MODEL_ALIASES = {"marconi-7b-hybrid": "marconi-hybrid-7b", "marconi-7b": "marconi-hybrid-7b"}
