"""Model specifications: bytes and FLOPs per layer type.

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
#: the fields that may be fractional: bits per weight with the quantization scales
_BITS = ("weight_bits", "expert_weight_bits")
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
    dtype_bytes: int = 2  # of activations, the KV cache and conv states (and weights)
    state_dtype_bytes: int = 2  # of the recurrent (SSM) state
    # multi-head latent attention (DeepSeek-V3, Kimi K2): kv_lora_rank > 0 makes every
    # attention layer MLA, caching one latent of kv_lora_rank + qk_rope_head_dim per token
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention (Gemma 3, gpt-oss): this many of the attention layers see
    # only the last sliding_window tokens
    num_sliding_layers: int = 0
    sliding_window: int = 0
    shared_expert_intermediate_size: int = 0  # the always-active experts of an MoE layer
    ssm_in_proj_dim: int = 0  # the SSM's input projection width (0: 2 x ssm_d_inner)
    weight_bits: float = 0  # bits per stored weight (0: 8 x dtype_bytes), scales included
    expert_weight_bits: float = 0  # bits per expert weight (0: weight_bits): MXFP4 is 4.25

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "tie_embeddings":
                if not isinstance(v, bool):
                    raise ConfigError(f"model {self.name}: tie_embeddings must be true or false")
                continue
            if f.name in _BITS:
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 64:
                    raise ConfigError(f"model {self.name}: {f.name} must be 0 to 64, got {v!r}")
                continue
            if f.name != "name" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"model {self.name}: {f.name} must be an integer >= 0, got {v!r}")
        if self.hidden_size <= 0:
            raise ConfigError(f"model {self.name}: hidden_size must be positive")
        mla = self.kv_lora_rank > 0
        if self.num_attention_layers and not mla and not (self.num_kv_heads and self.head_dim):
            raise ConfigError(f"model {self.name}: attention layers need num_kv_heads, head_dim")
        if self.num_ssm_layers and not (self.ssm_d_inner and self.ssm_d_state):
            raise ConfigError(f"model {self.name}: SSM layers need ssm_d_inner and ssm_d_state")
        self._check_attention_kinds()

    def _check_attention_kinds(self) -> None:
        if self.kv_lora_rank and not (self.num_heads and self.qk_rope_head_dim and self.v_head_dim):
            raise ConfigError(
                f"model {self.name}: MLA (kv_lora_rank > 0) needs num_heads, "
                "qk_rope_head_dim and v_head_dim"
            )
        if self.num_sliding_layers > self.num_attention_layers:
            raise ConfigError(
                f"model {self.name}: num_sliding_layers ({self.num_sliding_layers}) is more "
                f"than num_attention_layers ({self.num_attention_layers})"
            )
        if self.num_sliding_layers and not self.sliding_window:
            raise ConfigError(f"model {self.name}: sliding layers need sliding_window > 0")

    # ------------------------------------------------------------------ memory
    @property
    def kv_bytes_per_layer_token(self) -> int:
        """One attention layer's KV of one token: K and V of every KV head, or (MLA) the
        latent and the rotary key, shared by all heads."""
        if self.kv_lora_rank:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Every attention layer's KV of one token, sliding-window layers included: what a
        cached block holds when the engine keeps all layers of it (see docs/models.md)."""
        return self.num_attention_layers * self.kv_bytes_per_layer_token

    def kv_bytes_per_layer_token_per_rank(self, tp: int = 1) -> int:
        """One layer's KV of one token on one of ``tp`` GPUs: its share of the KV heads,
        at least one (vLLM replicates them when tp exceeds their number); an MLA latent
        whole (replicated on every GPU)."""
        if self.kv_lora_rank or tp <= 1:
            return self.kv_bytes_per_layer_token
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * self.dtype_bytes

    def kv_bytes_per_layer_token_read(self, tp: int = 1) -> int:
        """One layer's KV of one token as ``tp`` GPUs read it together, replicas counted."""
        per_rank = self.kv_bytes_per_layer_token_per_rank(tp)
        return tp * per_rank if tp > 1 else per_rank

    def kv_bytes_read(self, context_tokens: int, tp: int = 1) -> int:
        """KV bytes attention reads over a context (on ``tp`` GPUs, replicas counted): a
        sliding layer only the last window."""
        per = self.kv_bytes_per_layer_token_read(tp)
        full = (self.num_attention_layers - self.num_sliding_layers) * per
        window = min(context_tokens, self.sliding_window)
        return context_tokens * full + window * self.num_sliding_layers * per

    def kv_bytes_per_token_per_rank(self, tp: int) -> int:
        """One GPU's share of a token's KV under tensor parallelism of degree ``tp``."""
        return self.num_attention_layers * self.kv_bytes_per_layer_token_per_rank(tp)

    def kv_bytes_per_block(self, block_tokens: int) -> int:
        return self.kv_bytes_per_token * block_tokens

    @property
    def state_bytes_per_checkpoint(self) -> int:
        """Bytes of one recurrent-state checkpoint: every SSM layer's state and conv state."""
        channels = self.ssm_state_channels or self.ssm_d_inner
        conv_dim = self.ssm_conv_dim or self.ssm_d_inner
        state = channels * self.ssm_d_state * self.state_dtype_bytes
        conv = conv_dim * self.ssm_conv_kernel * self.dtype_bytes
        return self.num_ssm_layers * (state + conv)

    def sequence_bytes(self, num_tokens: int, checkpoint_every: int | None = None) -> int:
        """KV of a sequence plus its state checkpoints (one every ``checkpoint_every`` tokens,
        or one at the end when None)."""
        if checkpoint_every is not None and checkpoint_every <= 0:
            raise ConfigError(f"checkpoint_every must be positive, got {checkpoint_every}")
        checkpoints = 1 if checkpoint_every is None else num_tokens // checkpoint_every
        if not self.num_ssm_layers:
            checkpoints = 0
        return num_tokens * self.kv_bytes_per_token + checkpoints * self.state_bytes_per_checkpoint

    def _attention_weights(self) -> int:
        """One attention layer's projection weights (= its multiply-adds per token)."""
        d, h = self.hidden_size, self.num_heads
        if not self.kv_lora_rank:
            kv = self.num_kv_heads * self.head_dim
            q = (h * self.head_dim) or d
            return d * q + q * d + 2 * d * kv
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = self.q_lora_rank * (d + h * qk) if self.q_lora_rank else d * h * qk
        kv_down = d * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_up = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_down + kv_up + h * self.v_head_dim * d

    def attention_dims(self, decode: bool = False) -> tuple[float, float]:
        """(D_q, D_kv) of the FLOPs formula, which prices an attention layer's projections
        ``2 L D (2 D_q + 2 D_kv)`` and each (query, key) pair ``4 D_q``. For MLA, D_kv is
        what makes the projections its weights, and D_q depends on the path: prefill's
        heads attend over up-projected keys of qk_nope + qk_rope dims and values of
        v_head_dim, D_q = heads (qk + v) / 2; decode's (vLLM's absorbed form) over the
        latents, keys of kv_lora + qk_rope and values of kv_lora dims, D_q = heads
        (2 kv_lora + qk_rope) / 2 (the absorbed up-projections cost what the prefill's do)."""
        d = float(self.hidden_size)
        if not self.kv_lora_rank:
            return float(self.num_heads * self.head_dim) or d, float(
                self.num_kv_heads * self.head_dim
            )
        if decode:
            d_q = self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) / 2
        else:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            d_q = self.num_heads * (qk + self.v_head_dim) / 2
        return d_q, self._attention_weights() / (2 * d) - d_q

    @property
    def mla_context_flops(self) -> float:
        """FLOPs an MLA layer's prefill spends per cached token: the up-projection of its
        latent to keys and values, ``2 kv_lora heads (nope + v)``, which vLLM repeats for
        every chunk it prefills after a cached context (0 without MLA)."""
        if not self.kv_lora_rank:
            return 0.0
        head = self.qk_nope_head_dim + self.v_head_dim
        return float(2 * self.kv_lora_rank * self.num_heads * head)

    @property
    def num_parameters(self) -> int:
        """Weights: all experts, the input embeddings, and the output layer unless tied."""
        d = self.hidden_size
        attn = self._attention_weights()
        mlp = self.mlp_matrices * d * self.intermediate_size
        moe = self.num_experts * self._expert_weights()
        moe += d * self.num_experts + self.mlp_matrices * d * self.shared_expert_intermediate_size
        ssm = d * (self.ssm_in_proj_dim or 2 * self.ssm_d_inner) + self.ssm_d_inner * d
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
        idle = (e - touched) * self._expert_weights() * self.num_moe_layers
        return round(self.num_parameters - idle)

    def _expert_weights(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.moe_intermediate_size

    def weight_units(self) -> tuple[float, float, int, int]:
        """(total, per expert, scale, divisor): a step whose tokens leave ``idle`` experts
        of each MoE layer untouched reads ``round(total - idle x layers x per expert) x
        scale / divisor`` bytes of weights. Unquantized: parameters and ``dtype_bytes``;
        with weight_bits or expert_weight_bits: bits, and 8 bits a byte (the embeddings
        stay at ``dtype_bytes``, as FP8 and MXFP4 checkpoints keep them)."""
        expert = self._expert_weights()
        if not (self.weight_bits or self.expert_weight_bits):
            return self.num_parameters, expert, self.dtype_bytes, 1
        plain = 8 * self.dtype_bytes
        bits = self.weight_bits or plain
        expert_bits = self.expert_weight_bits or bits
        experts = self.num_moe_layers * self.num_experts * expert
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)
        rest = self.num_parameters - experts - embeddings
        total = embeddings * plain + rest * bits + experts * expert_bits
        return total, expert * expert_bits, 1, 8

    def weight_bytes_read(self, num_tokens: int) -> float:
        """Bytes of the weights a step over ``num_tokens`` tokens reads (the experts they
        touch in expectation, as :meth:`parameters_read`), at the stored precision."""
        total, expert, scale, divisor = self.weight_units()
        if self.num_experts:
            e, k = self.num_experts, self.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** max(num_tokens, 1))
            total = round(total - (e - touched) * expert * self.num_moe_layers)
        return float(total * scale) / divisor

    @property
    def weight_bytes(self) -> int:
        """Bytes of all the weights as stored (what a GPU holds)."""
        total, _, scale, divisor = self.weight_units()
        return int(total * scale / divisor) if divisor > 1 else int(total * scale)

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

    def _flops(self, n: Floats, p: Floats, causal: bool, decode: bool = False) -> dict[str, Floats]:
        """The per-layer-type formula on floats or arrays (every term has a factor n, but
        MLA prefill's up-projection of the p cached latents)."""
        d = float(self.hidden_size)
        d_q, d_kv = self.attention_dims(decode)
        proj = 2 * n * d * (2 * d_q + 2 * d_kv)
        square = 2 * n * n * d_q if causal else 4 * n * n * d_q
        attn = proj + 4 * n * p * d_q + square
        up = 0.0 if decode else self.mla_context_flops
        if up:
            context = up * p
            attn = attn + (context * (n > 0) if isinstance(n, np.ndarray) else context)
        attention = (self.num_attention_layers - self.num_sliding_layers) * attn
        if self.num_sliding_layers:
            pairs = _window_pairs(n, p, float(self.sliding_window), causal)
            attention = attention + self.num_sliding_layers * (proj + 4 * d_q * pairs)
        mlp = 2 * n * d * self.intermediate_size * self.mlp_matrices
        moe = 2 * n * d * self.moe_intermediate_size * self.mlp_matrices * self.experts_per_token
        moe += 2 * n * d * self.num_experts
        if self.shared_expert_intermediate_size:
            moe += 2 * n * d * self.shared_expert_intermediate_size * self.mlp_matrices
        di, ns = float(self.ssm_d_inner), float(self.ssm_d_state)
        if self.ssm_in_proj_dim:
            ssm = 2 * n * d * self.ssm_in_proj_dim + 2 * n * di * d + 8 * n * di * ns + 5 * n * di
        else:
            ssm = 2 * n * d * 2 * di + 2 * n * di * d + 8 * n * di * ns + 5 * n * di
        return {
            "attention": attention,
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
        """FLOPs of one decode step of one sequence with ``context_tokens`` before it: a
        one-token prefill, but for MLA's absorbed attention (:meth:`attention_dims`)."""
        total = 0.0
        for v in self._flops(1.0, float(context_tokens), causal, decode=True).values():
            total += float(v)
        return total

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


def _half_square(x: float, w: float) -> float:
    return x * x / 2 if x <= w else w * x - w * w / 2


def _window_pairs(n: Floats, p: Floats, w: float, causal: bool) -> Floats:
    """(query, key) pairs of a sliding-window layer for n new tokens after p, counted as
    the full layers' are: causal, the new square halved (G(p + n) - G(p) with G(x) = x^2/2
    up to the window, then w x - w^2/2, so additive over chunks); else n x min(p + n, w)."""
    if not isinstance(n, np.ndarray) and not isinstance(p, np.ndarray):  # no numpy scalars
        if not causal:
            return n * min(p + n, w)
        return _half_square(p + n, w) - _half_square(p, w)
    if not causal:
        return n * np.minimum(p + n, w)
    after, before = p + n, p
    g_after = np.where(after <= w, after * after / 2, w * after - w * w / 2)
    g_before = np.where(before <= w, before * before / 2, w * before - w * w / 2)
    return g_after - g_before


def check_tp(model: ModelSpec, tp: int) -> None:
    """vLLM's rule: tensor parallelism splits the attention heads evenly over the GPUs."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor parallelism must be an integer >= 1, got {tp!r}")
    if model.num_heads and model.num_heads % tp:
        raise ConfigError(
            f"tensor parallelism {tp} does not divide the {model.num_heads} attention heads "
            f"of {model.name}"
        )
