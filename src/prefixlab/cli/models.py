"""CLI command ``models``: the model presets, and one model's bytes and KV budget."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

from prefixlab.cli.common import FitTable, console, fail, print_json
from prefixlab.cli.engine import _GpuOpt, _GpuUtilOpt, _JsonOpt, _TpOpt
from prefixlab.errors import PrefixlabError

if TYPE_CHECKING:
    from prefixlab.model.deploy import KVBudget
    from prefixlab.model.spec import ModelSpec

_ModelArg = Annotated[
    str | None,
    typer.Argument(help="A preset or a config.json path: its details (all presets if none)."),
]
GIB = 2**30
COLUMNS = ("name", "layers", "params", "active", "weights", "KV/token", "state", "caching")


def models_cmd(
    model: _ModelArg = None,
    gpu: _GpuOpt = None,
    tp: _TpOpt = 1,
    gpu_memory_utilization: _GpuUtilOpt = 0.9,
    as_json: _JsonOpt = False,
) -> None:
    """List the model presets (layers, weights, KV bytes per token), or show one model, with
    the KV budget it leaves on --tp x --gpu."""
    from prefixlab.model.deploy import kv_budget, model_summary
    from prefixlab.model.presets import MODEL_PRESETS
    from prefixlab.model.spec import get_model

    try:
        specs = [get_model(model)] if model else list(MODEL_PRESETS.values())
        budget = kv_budget(specs[0], gpu, tp, gpu_memory_utilization) if model and gpu else None
    except PrefixlabError as exc:
        fail(str(exc))
        return
    if as_json:
        rows = [model_summary(m) for m in specs]
        if budget is not None:
            rows[0]["kv_budget"] = asdict(budget)
        print_json(rows if model is None else rows[0])
        return
    _print(specs, model, budget)


def _print(specs: list[ModelSpec], model: str | None, budget: KVBudget | None) -> None:
    from prefixlab.model.deploy import cache_rule, layer_summary

    table = FitTable(title="models" if model is None else model)
    for col in COLUMNS:
        table.add_column(col)
    for m in specs:
        state = m.state_bytes_per_checkpoint
        table.add_row(
            m.name,
            layer_summary(m),
            f"{m.num_parameters / 1e9:,.1f}B",
            f"{m.active_parameters / 1e9:,.1f}B",
            f"{m.weight_bytes / GIB:,.1f} GiB",
            f"{m.kv_bytes_per_token:,} B",
            f"{state / 2**20:,.1f} MiB" if state else "-",
            cache_rule(m),
        )
    console().print(table)
    if budget is not None:
        console().print(budget.describe(), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("models")(models_cmd)
