"""Model specifications: bytes and FLOPs per layer type, and presets.

A :class:`ModelSpec` lists how many layers of each type a model has and their dimensions.
It answers what the caches and the timing models need::

    KV bytes per token       = 2 (K, V) x attention layers x KV heads x head dim x dtype bytes
    state bytes (checkpoint) = SSM layers x (state channels x d_state + conv dim x kernel)
                               x state dtype bytes
    prefill FLOPs            = per layer type, for n new tokens after p cached ones

FLOPs follow Marconi's appendix (2 FLOPs per multiply-add), generalised. For L = n new tokens
with p cached, per layer:

* attention: projections ``2 L D (2 D + 2 D_kv)`` (Q and O are D x D, K and V are
  D x D_kv with D_kv = KV heads x head dim; with D_kv = D this is Marconi's 8 L D^2) plus
  scores and values ``4 L p D + 4 L^2 D`` (each new token attends to the p cached ones and
  to the new square, counted in full as Marconi's 4 L^2 D does); ``causal=True`` counts
  half the square (``2 L^2 D``), which is additive over chunks and what timing uses;
* MLP: ``2 L D F x m`` with F the intermediate size and m = 2 matrices (3 when gated); with
  F = 4 D, m = 2 this is Marconi's 16 L D^2;
* MoE: as MLP, times ``experts_per_token`` (plus the router, 2 L D E);
* SSM (Mamba): ``12 L D^2 + 16 L D N + 10 L D`` for expand 2 (in/out projections, scan,
  convolution and gating), in general ``2 L D (2 d_inner) + 2 L d_inner D + 8 L d_inner N +
  5 L d_inner``; the state is carried, so p does not matter.

Marconi's 7B hybrid (4 attention, 24 SSM, 28 MLP layers, D = 4096, N = 128) gives one SSM
checkpoint of 26.8 MB = the KV of 409 tokens, and 17.4 GB for a 10K-token sequence
checkpointed every 16 tokens (tests/test_model_timing.py), as the paper reports.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from prefixlab.errors import ConfigError
from prefixlab.types import F64

LAYER_TYPES = ("attention", "mlp", "moe", "ssm")
#: what the FLOPs formula takes and gives: floats, or arrays of them element-wise
Floats = TypeVar("Floats", float, F64)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """Layer counts and dimensions per layer type (names follow Hugging Face configs)."""

    name: str
    hidden_size: int
    num_attention_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    num_mlp_layers: int = 0
    intermediate_size: int = 0
    mlp_matrices: int = 3  # gated (SwiGLU) MLPs have 3 matrices, plain ones 2
    num_moe_layers: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_ssm_layers: int = 0
    ssm_d_inner: int = 0  # expand x hidden size
    ssm_d_state: int = 0  # N
    ssm_state_channels: int = 0  # channels that carry an N-dim state (Mamba2: heads x head dim)
    ssm_conv_dim: int = 0  # channels of the convolution state (Mamba2: d_inner + 2 groups N)
    ssm_conv_kernel: int = 4
    vocab_size: int = 32_000
    tie_embeddings: bool = False  # the output layer reuses the input embeddings
    dtype_bytes: int = 2
    state_dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "tie_embeddings":
                if not isinstance(v, bool):
                    raise ConfigError(f"model {self.name}: tie_embeddings must be true or false")
                continue
            if f.name != "name" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"model {self.name}: {f.name} must be an integer >= 0, got {v!r}")
        if self.hidden_size <= 0:
            raise ConfigError(f"model {self.name}: hidden_size must be positive")
        if self.num_attention_layers and not (self.num_kv_heads and self.head_dim):
            raise ConfigError(f"model {self.name}: attention layers need num_kv_heads, head_dim")
        if self.num_ssm_layers and not (self.ssm_d_inner and self.ssm_d_state):
            raise ConfigError(f"model {self.name}: SSM layers need ssm_d_inner and ssm_d_state")

    # ------------------------------------------------------------------ memory
    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_block(self, block_tokens: int) -> int:
        return self.kv_bytes_per_token * block_tokens

    @property
    def state_bytes_per_checkpoint(self) -> int:
        """Bytes of one recurrent-state checkpoint: every SSM layer's state and conv state."""
        channels = self.ssm_state_channels or self.ssm_d_inner
        conv_dim = self.ssm_conv_dim or self.ssm_d_inner
        per_layer = channels * self.ssm_d_state + conv_dim * self.ssm_conv_kernel
        return self.num_ssm_layers * per_layer * self.state_dtype_bytes

    def sequence_bytes(self, num_tokens: int, checkpoint_every: int | None = None) -> int:
        """KV of a sequence plus its state checkpoints (one every ``checkpoint_every`` tokens,
        or one at the end when None)."""
        if checkpoint_every is not None and checkpoint_every <= 0:
            raise ConfigError(f"checkpoint_every must be positive, got {checkpoint_every}")
        checkpoints = 1 if checkpoint_every is None else num_tokens // checkpoint_every
        if not self.num_ssm_layers:
            checkpoints = 0
        return num_tokens * self.kv_bytes_per_token + checkpoints * self.state_bytes_per_checkpoint

    @property
    def num_parameters(self) -> int:
        """Weights: all experts, the input embeddings, and the output layer unless tied."""
        d = self.hidden_size
        kv = self.num_kv_heads * self.head_dim
        q = (self.num_heads * self.head_dim) or d
        attn = d * q + q * d + 2 * d * kv
        mlp = self.mlp_matrices * d * self.intermediate_size
        moe = self.num_experts * self.mlp_matrices * d * self.moe_intermediate_size
        moe += d * self.num_experts
        ssm = d * 2 * self.ssm_d_inner + self.ssm_d_inner * d
        return (
            self.num_attention_layers * attn
            + self.num_mlp_layers * mlp
            + self.num_moe_layers * moe
            + self.num_ssm_layers * ssm
            + self.vocab_size * d * (1 if self.tie_embeddings else 2)
        )

    @property
    def active_parameters(self) -> int:
        """Weights one token uses (MoE: only ``experts_per_token`` experts)."""
        return self.parameters_read(1)

    def parameters_read(self, num_tokens: int) -> int:
        """Weights a step over ``num_tokens`` tokens reads: the dense part once, and per MoE
        layer the experts the tokens touch, E (1 - (1 - k/E)^T) in expectation under
        uniform routing (all of them for large batches)."""
        if not self.num_experts:
            return self.num_parameters
        e, k = self.num_experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** max(num_tokens, 1))
        expert = self.mlp_matrices * self.hidden_size * self.moe_intermediate_size
        idle = (e - touched) * expert * self.num_moe_layers
        return round(self.num_parameters - idle)

    # ------------------------------------------------------------------ compute
    def prefill_flops(
        self, num_new_tokens: int, num_cached_tokens: int = 0, causal: bool = False
    ) -> dict[str, float]:
        """FLOPs to prefill ``num_new_tokens`` after ``num_cached_tokens``, per layer type.

        ``causal=False`` counts the new tokens' attention square in full, as Marconi's
        4L^2D does (the FLOPs-saved accounting). ``causal=True`` counts half of it, as a
        causal kernel computes; only then is the cost additive over chunks (prefilling
        L1 then L2 costs what L1 + L2 costs at once), which the timing models rely on.
        """
        if num_new_tokens <= 0:
            return dict.fromkeys(LAYER_TYPES, 0.0)
        return {
            k: float(v)
            for k, v in self._flops(float(num_new_tokens), float(num_cached_tokens), causal).items()
        }

    def prefill_flops_array(
        self,
        num_new_tokens: F64,
        num_cached_tokens: F64,
        causal: bool = False,
    ) -> dict[str, F64]:
        """:meth:`prefill_flops` of many requests at once (same formula, element-wise)."""
        n = np.maximum(np.asarray(num_new_tokens, dtype=np.float64), 0.0)
        p = np.asarray(num_cached_tokens, dtype=np.float64)
        return {
            k: np.broadcast_to(np.asarray(v, dtype=np.float64), n.shape)
            for k, v in self._flops(n, p, causal).items()
        }

    def flops_saved(self, inputs: npt.ArrayLike, hits: npt.ArrayLike) -> dict[str, float]:
        """Prefill FLOPs of the prompts without a cache (``flops_total``) and what the hit
        prefixes saved, in total and per layer type (``flops_saved_<type>``);
        ``flops_saved_ratio`` is 0 with no input.

        A hit of ``h`` tokens is credited with the FLOPs of prefilling those ``h`` tokens
        alone (attention ``8hD^2 + 4h^2 D`` per layer), as Marconi's simulator credits it
        (``get_cache_stats``) and as the paper's Eq. 1 counts "the redundant compute ...
        circumvented by reusing the prefix entry". (The prefill of the remaining ``n - h``
        tokens still attends to the ``h`` cached ones; that cost is not credited.)
        """
        n = np.asarray(inputs, dtype=np.float64)
        h = np.asarray(hits, dtype=np.float64)
        zeros = np.zeros_like(n)
        full = self.prefill_flops_array(n, zeros)
        reused = self.prefill_flops_array(h, zeros)
        out: dict[str, float] = {}
        total = saved = 0.0
        for t in LAYER_TYPES:
            a, b = float(full[t].sum()), float(reused[t].sum())
            out[f"flops_saved_{t}"] = b
            total += a
            saved += b
        out.update(
            flops_total=total, flops_saved=saved, flops_saved_ratio=saved / total if total else 0.0
        )
        return out

    def _flops(self, n: Floats, p: Floats, causal: bool) -> dict[str, Floats]:
        """The per-layer-type formula on floats or arrays (every term has a factor n)."""
        d = float(self.hidden_size)
        d_kv = float(self.num_kv_heads * self.head_dim)
        d_q = float(self.num_heads * self.head_dim) or d
        square = 2 * n * n * d_q if causal else 4 * n * n * d_q
        attn = 2 * n * d * (2 * d_q + 2 * d_kv) + 4 * n * p * d_q + square
        mlp = 2 * n * d * self.intermediate_size * self.mlp_matrices
        moe = 2 * n * d * self.moe_intermediate_size * self.mlp_matrices * self.experts_per_token
        moe += 2 * n * d * self.num_experts
        di, ns = float(self.ssm_d_inner), float(self.ssm_d_state)
        ssm = 2 * n * d * 2 * di + 2 * n * di * d + 8 * n * di * ns + 5 * n * di
        return {
            "attention": self.num_attention_layers * attn,
            "mlp": self.num_mlp_layers * mlp,
            "moe": self.num_moe_layers * moe,
            "ssm": self.num_ssm_layers * ssm,
        }

    def total_prefill_flops(
        self, num_new_tokens: int, num_cached_tokens: int = 0, causal: bool = False
    ) -> float:
        """All layer types' FLOPs, added left to right in LAYER_TYPES order (not ``sum``,
        which compensates on Python 3.12+: :meth:`prefill_flops_table` adds the same way)."""
        total = 0.0
        for v in self.prefill_flops(num_new_tokens, num_cached_tokens, causal).values():
            total += v
        return total

    def prefill_flops_table(self, max_tokens: int) -> F64:
        """``total_prefill_flops(n)`` for n = 0 .. max_tokens, bit for bit (the same
        element-wise formula, added in the same order): what the compiled hybrid replay and
        Marconi's efficiency read."""
        n = np.arange(max_tokens + 1, dtype=np.float64)
        parts = self._flops(n, np.zeros_like(n), False)
        total = np.zeros_like(n)
        for t in LAYER_TYPES:
            total = total + np.broadcast_to(np.asarray(parts[t], dtype=np.float64), n.shape)
        return total

    def decode_flops(self, context_tokens: int, causal: bool = False) -> float:
        """FLOPs of one decode step of one sequence with ``context_tokens`` before it."""
        return self.total_prefill_flops(1, context_tokens, causal)

    def flop_efficiency(self, num_tokens: int, num_parent_tokens: int = 0) -> float:
        """Marconi's FLOP efficiency of a cache entry: FLOPs its hit saves per byte it holds.

        The entry covers tokens ``[num_parent_tokens, num_tokens)`` of a prefix (a radix
        node's edge) plus one state checkpoint at its end. As in Marconi's eviction code, it
        is credited with what it adds over its parent: the FLOPs of prefilling its whole
        prefix minus those of the parent's. It holds the KV of its edge and the checkpoint.
        """
        if num_tokens <= 0:
            return 0.0
        parent = min(max(num_parent_tokens, 0), num_tokens)
        saved = self.total_prefill_flops(num_tokens, 0) - self.total_prefill_flops(parent, 0)
        edge = num_tokens - parent
        held = edge * self.kv_bytes_per_token
        held += self.state_bytes_per_checkpoint if self.num_ssm_layers else 0
        return saved / held if held else float("inf")


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
        # AI21 Jamba-1.5-Mini: 32 layers, attention in 1 of 8 (GQA 32/8), Mamba-1 elsewhere
        # (d_state 16, expand 2, conv 4), MoE (16 experts, top 2) every other layer.
        ModelSpec(
            "jamba-1.5-mini",
            4096,
            num_attention_layers=4,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            num_mlp_layers=16,
            intermediate_size=14_336,
            num_moe_layers=16,
            num_experts=16,
            experts_per_token=2,
            moe_intermediate_size=14_336,
            num_ssm_layers=28,
            ssm_d_inner=8192,
            ssm_d_state=16,
            ssm_conv_kernel=4,
            vocab_size=65_536,
        ),
        # A pure Mamba2 (2.7B): 64 layers, D = 2560, expand 2, N = 128, 1 group, conv 4.
        ModelSpec(
            "mamba2-2.7b",
            2560,
            num_ssm_layers=64,
            ssm_d_inner=5120,
            ssm_d_state=128,
            ssm_conv_dim=5120 + 2 * 128,
            ssm_conv_kernel=4,
            vocab_size=50_288,
        ),
    )
}


#: other names users write for a preset
MODEL_ALIASES = {"marconi-7b-hybrid": "marconi-hybrid-7b", "marconi-7b": "marconi-hybrid-7b"}


def get_model(name: str | ModelSpec) -> ModelSpec:
    if isinstance(name, ModelSpec):
        return name
    key = MODEL_ALIASES.get(name.lower(), name.lower())
    if key not in MODEL_PRESETS:
        raise ConfigError(f"unknown model '{name}'; known: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[key]


def capacity_blocks_for_bytes(
    capacity_bytes: int, model: str | ModelSpec, block_tokens: int
) -> int:
    """How many whole KV blocks of ``block_tokens`` tokens fit in ``capacity_bytes``."""
    spec = get_model(model)
    per_block = spec.kv_bytes_per_block(block_tokens)
    if per_block <= 0:
        raise ConfigError(f"model {spec.name} has no attention KV: capacity in blocks is undefined")
    blocks = capacity_bytes // per_block
    if blocks <= 0:
        raise ConfigError(
            f"capacity of {capacity_bytes} bytes holds no block: one {block_tokens}-token block "
            f"of {spec.name} takes {per_block} bytes"
        )
    return blocks
