"""``prefixlab experts record``: expert routing of a transformers MoE model on prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefixlab.cli.common import console, fail
from prefixlab.errors import PrefixlabError


def record_cmd(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Hugging Face model id or local model folder.")
    ],
    prompts: Annotated[
        Path, typer.Option("--prompts", help="Prompts: text (one per line) or JSONL (prompt).")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Routing JSONL to write (.jsonl or .jsonl.gz).")
    ] = Path("routing.jsonl"),
    top_k: Annotated[
        int | None, typer.Option("--top-k", help="Choices per token [default: the model's].")
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option(help="Greedy decode tokens recorded after each prompt.")
    ] = 0,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="prefixlab tokenizer spec (bytes, llama3, ...) [default: the model's]."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 8,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16 or float64.")] = "float32",
    device: Annotated[str, typer.Option(help="torch device.")] = "cpu",
) -> None:
    """Record which experts a transformers MoE model routes each token to (needs torch and
    transformers: install torch, then the moe extra)."""
    from prefixlab.experts.record import record_file

    try:
        s = record_file(
            model,
            prompts,
            out,
            tokenizer=tokenizer,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            dtype=dtype,
            device=device,
        )
    except (PrefixlabError, OSError) as exc:
        fail(str(exc))
        return
    console().print(
        f"{out}: {s.num_prompts} prompts, {s.num_tokens:,} tokens, {s.num_layers} MoE layers x "
        f"{s.num_experts} experts, top-{s.top_k}, {s.num_rows:,} routing lines",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
