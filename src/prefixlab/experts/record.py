"""Recording real expert routing from a Hugging Face transformers Mixture-of-Experts model.

The recorder runs prompts through a causal LM with ``output_router_logits=True`` and turns
the router logits of every MoE layer into one routing row per (token, layer)::

    prompt 0: t0 t1 t2 | g0 g1      prompt 1: t0 t1 | g0 g1      (g = greedy decode tokens)
    token_idx:  0  1  2 |  3  4                 5  6 |  7  8
    rows:     (token 0, layer 0) (token 0, layer 1) ... (token 0, layer l-1) (token 1, layer 0) ...

Each MoE layer's router logits (see :mod:`prefixlab.experts.hf_model`) are
``[batch * seq_len, num_experts]``; a row's ``layer`` is the index among the MoE layers (dense
layers are absent), which is what an expert cache pages over. The chosen experts are the top-k
of ``softmax(router_logits)``: exactly the routing of the softmax top-k routers that
:func:`load_model` and :func:`probe_router` accept.

Prompt tokens are run in right-padded batches (padding never reaches a real token under the
causal mask, and padded positions are dropped). With ``max_new_tokens > 0`` each prompt runs
alone: one prefill, then a greedy loop feeding each new token through ``forward`` with the
KV cache (one ``DynamicCache`` made up front and passed to every call, filled in place),
recording that token's routing. ``generate`` is not used: it
does not return router logits, and the models' auxiliary loss breaks on a padded decode batch.
torch and transformers are optional and imported lazily, inside the functions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from prefixlab.errors import ConfigError
from prefixlab.experts.hf_model import (
    RouterInfo,
    check_dtype,
    check_softmax_topk,
    import_backend,
    load_model,
    model_name,
    model_vocab_size,
    new_kv_cache,
    probe_router,
    router_logits_of,
    run_forward,
)

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

__all__ = [
    "RecordSummary",
    "RouterInfo",
    "RoutingRow",
    "load_model",
    "model_vocab_size",
    "probe_router",
    "record_file",
    "record_routing",
    "write_rows_jsonl",
]

# Routers that always renormalise their top-k weights although the config has no
# ``norm_topk_prob`` (Mixtral divides by the top-k sum; GraniteMoE takes a softmax of the top-k).
_ALWAYS_RENORMALISED = frozenset({"mixtral", "granitemoe"})


@dataclass(frozen=True, slots=True)
class RoutingRow:
    """The routing of one token at one MoE layer.

    Attributes:
        layer: MoE layer index (0-based, dense layers not counted).
        token_idx: token index across the whole recording (prompt 0's tokens first).
        experts: chosen experts, best first (distinct, ``< num_experts``).
        gating_probs: their gating probabilities, descending.
        prompt_idx: the prompt the token belongs to.
        position: the token's position in its sequence; ``>= len(prompt)`` for decode tokens.
        token_id: the token's id (decode tokens: the greedy choice).
    """

    layer: int
    token_idx: int
    experts: list[int]
    gating_probs: list[float]
    prompt_idx: int = 0
    position: int = 0
    token_id: int = 0


@dataclass(frozen=True, slots=True)
class RecordSummary:
    """What :func:`record_file` wrote."""

    model: str
    num_prompts: int
    num_tokens: int
    num_layers: int
    num_experts: int
    top_k: int
    num_rows: int


def _stack(
    torch: ModuleType, m: PreTrainedModel, layers: list[Tensor], batch: int, seq: int
) -> Tensor:
    """Router logits as one float32 tensor ``[batch, seq, num_layers, num_experts]``."""
    widths = {int(t.shape[-1]) for t in layers}
    if len(widths) != 1:
        raise ConfigError(f"model '{model_name(m)}' has layers with {sorted(widths)} experts")
    return cast("Tensor", torch.stack([t.reshape(batch, seq, -1).float() for t in layers], dim=2))


def _prefill_batches(
    torch: ModuleType, m: PreTrainedModel, prompts: list[list[int]], batch_size: int
) -> list[tuple[list[int], Tensor]]:
    """Per prompt, its ids and router logits ``[len, num_layers, num_experts]``, in
    right-padded batches.

    Right padding keeps every real token at its own position (0..len-1) and, under the causal
    mask, never lets it see a pad, so its routing equals a run of the prompt alone::

        ids  a0 a1 a2 a3      mask 1 1 1 1
             b0 b1 __ __           1 1 0 0   -> rows of b2, b3 dropped
    """
    per_prompt: list[tuple[list[int], Tensor]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        seq = max(len(p) for p in chunk)
        ids = torch.zeros((len(chunk), seq), dtype=torch.long)
        mask = torch.zeros((len(chunk), seq), dtype=torch.long)
        for row, p in enumerate(chunk):
            ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
            mask[row, : len(p)] = 1
        out = run_forward(m, ids.to(m.device), mask=mask.to(m.device), cache=False)
        logits = _stack(torch, m, router_logits_of(m, out), len(chunk), seq).cpu()
        per_prompt.extend((p, logits[row, : len(p)]) for row, p in enumerate(chunk))
    return per_prompt


def _prefill_and_decode(
    torch: ModuleType, m: PreTrainedModel, prompt: list[int], max_new_tokens: int
) -> tuple[list[int], Tensor]:
    """Token ids and router logits ``[len + max_new_tokens, num_layers, num_experts]`` of one
    prompt and its greedy continuation: each new token is fed through ``forward`` with the
    KV cache, so the last one's routing is recorded too."""
    ids = torch.tensor([prompt], dtype=torch.long, device=m.device)
    kv = new_kv_cache(m)
    out = run_forward(m, ids, past=kv, cache=True)
    steps = [_stack(torch, m, router_logits_of(m, out), 1, len(prompt))[0]]
    token_ids = list(prompt)
    for _ in range(max_new_tokens):
        next_id = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        token_ids.append(int(next_id.item()))
        out = run_forward(m, next_id, past=kv, cache=True)
        steps.append(_stack(torch, m, router_logits_of(m, out), 1, 1)[0])
    return token_ids, torch.cat(steps, dim=0).cpu()


def _resolve_top_k(m: PreTrainedModel, top_k: int | None, num_experts: int) -> int:
    k = top_k if top_k is not None else getattr(m.config, "num_experts_per_tok", None)
    if k is None:
        raise ConfigError(
            f"model '{model_name(m)}' has no num_experts_per_tok in its config; pass top_k"
        )
    if not 1 <= int(k) <= num_experts:
        raise ConfigError(f"top_k={k} must be between 1 and the {num_experts} experts per layer")
    return int(k)


def _resolve_renormalize(m: PreTrainedModel, renormalize: bool | None) -> bool:
    if renormalize is not None:
        return renormalize
    norm = getattr(m.config, "norm_topk_prob", None)
    if norm is not None:
        return bool(norm)
    return str(getattr(m.config, "model_type", "")) in _ALWAYS_RENORMALISED


def _check_options(max_new_tokens: int, batch_size: int, top_k: int | None) -> None:
    """The checks that need no model (``top_k <= num_experts`` is :func:`_resolve_top_k`'s)."""
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be >= 1, got {top_k}")


def _check_prompts(
    m: PreTrainedModel, token_id_lists: Sequence[Sequence[int]], max_new_tokens: int
) -> list[list[int]]:
    vocab = model_vocab_size(m)
    max_pos = getattr(m.config, "max_position_embeddings", None)
    prompts = [[int(t) for t in p] for p in token_id_lists]
    for i, p in enumerate(prompts):
        if not p:
            raise ConfigError(f"prompt {i} has no tokens")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ConfigError(
                f"prompt {i} has token id {bad[0]} outside the model's vocabulary "
                f"(vocab_size {vocab}); use the model's own tokenizer"
            )
        if max_pos is not None and len(p) + max_new_tokens > int(max_pos):
            raise ConfigError(
                f"prompt {i}: {len(p)} tokens + max_new_tokens {max_new_tokens} exceed the "
                f"model's max_position_embeddings {max_pos}"
            )
    return prompts


def record_routing(
    model: object,
    token_id_lists: Sequence[Sequence[int]],
    *,
    top_k: int | None = None,
    max_new_tokens: int = 0,
    batch_size: int = 8,
    renormalize: bool | None = None,
) -> list[RoutingRow]:
    """Record the expert routing of every token of ``token_id_lists`` (and their decode).

    Args:
        model: a transformers causal LM with MoE layers (see :func:`load_model`); it is put
            in eval mode, which turns router jitter and dropout off.
        token_id_lists: one list of token ids per prompt.
        top_k: experts recorded per (token, layer); default the config's ``num_experts_per_tok``.
            A larger value records the runners-up too.
        max_new_tokens: greedy decode tokens recorded after each prompt (exactly this many;
            an end-of-sequence token does not stop the loop).
        batch_size: prompts per forward pass when ``max_new_tokens == 0``.
        renormalize: divide the top-k probabilities by their sum. Default: the config's
            ``norm_topk_prob`` if present, else True for routers that always renormalise
            (Mixtral, GraniteMoE), else False (plain softmax over all experts).

    Returns:
        Rows ordered by token_idx then layer: one per (token, MoE layer).

    Raises:
        ConfigError: an empty prompt, a token id outside the vocabulary, a bad top_k, or a
            model without router logits.
    """
    torch, _ = import_backend()
    m: Any = model  # Any: a transformers model (load_model's), whose eval() is untyped
    _check_options(max_new_tokens, batch_size, top_k)
    check_softmax_topk(m)
    prompts = _check_prompts(m, token_id_lists, max_new_tokens)
    m.eval()
    with torch.inference_mode():
        if max_new_tokens == 0:
            per_prompt = _prefill_batches(torch, m, prompts, batch_size)
        else:
            per_prompt = [_prefill_and_decode(torch, m, p, max_new_tokens) for p in prompts]
    if not per_prompt:
        return []
    k = _resolve_top_k(m, top_k, int(per_prompt[0][1].shape[-1]))
    return _rows(torch, per_prompt, k, _resolve_renormalize(m, renormalize))


def _rows(
    torch: ModuleType, per_prompt: list[tuple[list[int], Tensor]], top_k: int, renormalize: bool
) -> list[RoutingRow]:
    rows: list[RoutingRow] = []
    token_idx = 0
    for prompt_idx, (token_ids, logits) in enumerate(per_prompt):
        probs, experts = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1, sorted=True)
        if renormalize:
            probs = probs / probs.sum(dim=-1, keepdim=True)
        for position, (p_layers, e_layers) in enumerate(
            zip(probs.tolist(), experts.tolist(), strict=True)
        ):
            rows.extend(
                RoutingRow(layer, token_idx, e, p, prompt_idx, position, token_ids[position])
                for layer, (p, e) in enumerate(zip(p_layers, e_layers, strict=True))
            )
            token_idx += 1
    return rows


def write_rows_jsonl(rows: Iterable[RoutingRow], path: str | Path) -> int:
    """Write rows in the routing JSONL format, one line per (token, layer).

    Each line is ``{"layer", "token_idx", "experts", "gating_probs", "prompt_idx", "position",
    "token_id"}``; the last three are extra fields a routing loader may ignore.

    Returns:
        The number of lines written.
    """
    num_rows = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for r in rows:  # asdict keeps the field order: layer, token_idx, experts ...
            fh.write(json.dumps(dataclasses.asdict(r), separators=(",", ":")) + "\n")
            num_rows += 1
    return num_rows


def record_file(
    model_id_or_path: str,
    prompts_path: str | Path,
    out_path: str | Path,
    *,
    tokenizer: str | None = None,
    top_k: int | None = None,
    max_new_tokens: int = 0,
    batch_size: int = 8,
    dtype: str = "float32",
    device: str = "cpu",
) -> RecordSummary:
    """Load a model, tokenize a prompts file, record routing and write routing JSONL
    (what ``prefixlab experts record`` runs).

    Everything that needs no model is checked before it is loaded (a hub id can mean a
    multi-GB download): the prompts file, the options, the dtype, a tokenizer spec, and the
    output's folder (created if missing). ``top_k`` is checked against the model's experts
    before any inference pass.

    Raises:
        ConfigError: a missing or empty prompts file, a bad option, an output folder that
            cannot be created, or any error of :func:`load_model` or :func:`record_routing`.
        TraceFormatError: a malformed JSONL prompts file.
    """
    from prefixlab.experts.prompts import load_tokenizer, read_prompts, tokenize_prompts

    prompts = read_prompts(prompts_path)
    _check_options(max_new_tokens, batch_size, top_k)
    check_dtype(dtype)
    tok = load_tokenizer(model_id_or_path, tokenizer) if tokenizer is not None else None
    _make_parent_folder(Path(out_path))
    model = load_model(model_id_or_path, dtype=dtype, device=device)
    info = probe_router(model)
    k = _resolve_top_k(model, top_k, info.num_experts)
    if tok is None:
        tok = load_tokenizer(model_id_or_path)
    token_ids = tokenize_prompts(prompts, tok, vocab_size=model_vocab_size(model))
    rows = record_routing(
        model, token_ids, top_k=k, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    num_rows = _write_routing(rows, out_path, model_id_or_path, max_new_tokens, info)
    n_layers, n_experts = info.num_layers, info.num_experts
    tokens = num_rows // n_layers
    return RecordSummary(model_id_or_path, len(prompts), tokens, n_layers, n_experts, k, num_rows)


def _write_routing(
    rows: list[RoutingRow],
    out_path: str | Path,
    model_id_or_path: str,
    max_new_tokens: int,
    info: RouterInfo,
) -> int:
    """Write ``rows`` as routing JSONL with a header line; the number of rows written."""
    from prefixlab.experts.routing_jsonl import write_routing_jsonl

    # a header line gives the shape: an expert never chosen still counts in num_experts
    meta = {
        "source": "prefixlab experts record",
        "model": str(model_id_or_path),
        "max_new_tokens": str(max_new_tokens),
    }
    return write_routing_jsonl(
        (dataclasses.asdict(r) for r in rows),
        out_path,
        num_layers=info.num_layers,
        num_experts=info.num_experts,
        meta=meta,
    )


def _make_parent_folder(out: Path) -> None:
    if out.is_dir():
        raise ConfigError(f"output {out} is a folder; give a file such as {out / 'routing.jsonl'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the output folder {out.parent}: {exc.strerror or exc}"
        ) from None
