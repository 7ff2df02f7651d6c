"""CLI commands of learned prefix caching: ``lpc train`` and ``lpc eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from prefixlab.cli.common import (
    FormatOpt,
    TraceArg,
    console,
    fail,
    load_shown,
    print_json,
    with_loader_options,
)
from prefixlab.errors import PrefixlabError
from prefixlab.learn.predictor import ContinuationPredictor, TrainConfig, evaluate, train

EmbedCacheOpt = Annotated[
    Path | None,
    typer.Option(
        help="Keep the embeddings in this folder (default: $PREFIXLAB_EMBED_CACHE, else memory "
        "only); a slow text model then embeds a trace once.",
    ),
]

lpc_app = typer.Typer(no_args_is_help=True, help="Learned prefix caching: train, evaluate.")


@with_loader_options
def train_cmd(
    trace: TraceArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Model path (writes .npz, .json).")],
    fmt: FormatOpt = "native",
    embedder: Annotated[str, typer.Option(help="hashed[:dim=384], st:PATH or minilm.")] = "hashed",
    epochs: Annotated[int, typer.Option(min=1, help="Epochs at most.")] = 20,
    seed: Annotated[int, typer.Option(min=0, help="Split and training seed.")] = 0,
    history: Annotated[int, typer.Option(min=0, help="Earlier user prompts in the window.")] = 4,
    token_budget: Annotated[
        int, typer.Option(min=1, help="Tokens of the window, split evenly across its turns.")
    ] = 512,
    replies: Annotated[
        bool, typer.Option("--with-replies", help="Embed the model's replies too (reply_text).")
    ] = False,
    embed_cache: EmbedCacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    load: dict[str, Any] | None = None,
) -> None:
    """Train the continuation predictor on half of the conversations; report the other half."""
    try:
        tr = load_shown(trace, fmt, load or {})
        cfg = TrainConfig(
            embedder=embedder,
            epochs=epochs,
            seed=seed,
            history=history,
            token_budget=token_budget,
            replies=replies,
        )
        pred, mask = train(tr, cfg, embed_cache)
        path = pred.save(out)
        ev = evaluate(pred, tr, mask, embed_cache=embed_cache)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    result = {**ev.as_dict(), "model": str(path), "best_epoch": pred.history["best_epoch"]}
    if as_json:
        print_json(result)
        return
    console().print(
        f"model: {path} (best epoch {result['best_epoch']})\nheld-out conversations: {ev.summary()}"
    )


@with_loader_options
def eval_cmd(
    trace: TraceArg,
    model: Annotated[Path, typer.Option(help="A model from `prefixlab lpc train`.")],
    fmt: FormatOpt = "native",
    all_rows: Annotated[
        bool, typer.Option("--all", help="Score every request (a trace not used in training).")
    ] = False,
    embed_cache: EmbedCacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    load: dict[str, Any] | None = None,
) -> None:
    """MCC and macro-F1 of a trained predictor (default: the conversations it did not train on)."""
    try:
        pred = ContinuationPredictor.load(model)
        tr = load_shown(trace, fmt, load or {})
        ev = evaluate(pred, tr, None, all_rows=all_rows, embed_cache=embed_cache)
    except PrefixlabError as exc:
        fail(str(exc))
        return
    if as_json:
        print_json(ev.as_dict())
        return
    console().print(ev.summary())


def register(app: typer.Typer) -> None:
    lpc_app.command("train")(train_cmd)
    lpc_app.command("eval")(eval_cmd)
    app.add_typer(lpc_app, name="lpc")
