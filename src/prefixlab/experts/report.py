"""Figures and the HTML page of an expert-cache results folder (saved results only).

Figures, each drawn when the sweep has what it needs:

- ``experts-vs-capacity``: faults / OPT's faults against the cache size k, a panel per
  workload variant (at most 6), a line per policy (mean over seeds).
- ``experts-vs-<key>``: faults / OPT against the one varied workload parameter (for
  example Zipf's ``a``), a panel per capacity entry (at most 4).
- ``experts-heatmap``: with two varied parameters (for example ``num_experts`` and
  ``num_layers``), faults / OPT of each policy (a panel each, at most 6) at the first
  capacity entry, on the grid of the two.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.experiments.summary import Column, Summary, mean, number, over_seeds
from prefixlab.io import atomic_write
from prefixlab.report.html import page
from prefixlab.report.plots import FigureSpec, evenly, finish_figure, plot_style
from prefixlab.report.plots import new_figure as _panels
from prefixlab.types import JSON, Row

MAX_PANELS = 6
MAX_SUMMARY_CAPACITIES = 12


@dataclass(frozen=True, slots=True)
class ExpertResults:
    """An expert sweep's folder: rows plus the config's orders."""

    folder: Path
    name: str
    config: dict[str, JSON]
    environment: dict[str, JSON]
    rows: list[Row]
    policies: list[str]
    variants: list[str]
    vary: dict[str, list[JSON]]
    capacity_specs: list[str]
    seeds: list[int]

    def mean(self, metric: str, **where: object) -> float:
        """Mean of ``metric`` over the rows matching ``where`` (over seeds); NaN if none."""
        rows = [r for r in self.rows if all(r.get(k) == v for k, v in where.items())]
        return mean(r[metric] for r in rows)


def load_expert_results(folder: str | Path) -> ExpertResults:
    """Read ``results.parquet``, the resolved config and the environment of a folder."""
    import pyarrow.parquet as pq

    f = Path(folder)
    if f.is_file():
        f = f.parent
    path = f / "results.parquet"
    if not path.is_file():
        raise ConfigError(f"{f}: no results.parquet here (run `prefixlab sweep`)")
    cfg = json.loads((f / "config.resolved.json").read_text(encoding="utf-8"))
    env_path = f / "environment.json"
    env = json.loads(env_path.read_text(encoding="utf-8")) if env_path.is_file() else {}
    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise ConfigError(
            f"{f}: the results table has no rows (every policy was undefined at these "
            "capacities: -dist policies need k >= the number of layers)"
        )
    seen_caps = list(dict.fromkeys(str(r["capacity_spec"]) for r in rows))
    return ExpertResults(
        folder=f,
        name=str(cfg.get("name", f.name)),
        config=cfg,
        environment=env,
        rows=rows,
        # folders written before 2026-11-27 hold the config flat
        policies=list(cfg.get("cache", cfg)["policies"]),
        variants=list(dict.fromkeys(str(r["variant"]) for r in rows)),
        vary=dict(cfg.get("workload", cfg).get("vary", {})),
        capacity_specs=seen_caps,
        seeds=list(cfg.get("seeds", [0])),
    )


def expert_summary(folder: str | Path) -> Summary:
    """An expert-cache study's answer: faults relative to OPT (mean and sd over seeds)
    and the fault rate, per variant, cache size and policy; the fewest faults of each
    (variant, cache size) among the online policies marked."""
    from prefixlab.experts.policies import registered
    from prefixlab.registry import parse_spec

    res = load_expert_results(folder)
    rows = over_seeds(
        res.rows,
        lambda r: (r["variant"], r["capacity_spec"], r["policy"]),
        ("variant", "capacity_spec", "policy"),
        ("fault_ratio_to_opt", "fault_rate"),
    )
    known = registered()
    for r in rows:
        name = parse_spec(str(r["policy"]), "policy")[0]
        r["offline"] = name in known and known[name].needs_future
    cols = [Column("capacity_spec", "k"), Column("policy", "policy")]
    if len(res.variants) > 1 or res.vary:
        cols.insert(0, Column("variant", "workload"))
    cols.append(Column("fault_ratio_to_opt", "faults/OPT", "ratio"))
    if len(res.seeds) > 1:
        cols.append(Column("fault_ratio_to_opt_sd", "± sd", "ratio"))
    cols.append(Column("fault_rate", "fault rate", "ratio"))
    note = f" (mean and sd of {len(res.seeds)} seeds)" if len(res.seeds) > 1 else ""
    return Summary(
        f"{res.name}: faults relative to OPT{note}",
        tuple(cols),
        rows,
        group=("variant", "capacity_spec"),
        best="fault_ratio_to_opt",
        lower_is_better=True,
        bound="offline",
    )


def _caption_seeds(res: ExpertResults) -> str:
    n = len(res.seeds)
    return f"seed {res.seeds[0]}" if n == 1 else f"mean over {n} seeds"


def _vs_capacity(res: ExpertResults) -> FigureSpec:
    variants = [res.variants[i] for i in evenly(len(res.variants), MAX_PANELS)]
    fig, axes = _panels(len(variants))
    for ax, v in zip(axes, variants, strict=True):
        caps = sorted({int(number(r["capacity"])) for r in res.rows if r["variant"] == v})
        for pi, pol in enumerate(res.policies):
            ys = [res.mean("fault_ratio_to_opt", variant=v, capacity=k, policy=pol) for k in caps]
            st = plot_style(pi)
            ax.plot(caps, ys, label=pol, color=st["color"], marker=st["marker"], markersize=3)
        ax.set_title(v, fontsize="small")
        ax.set_xlabel("cache size k (experts)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("faults / OPT's faults")
    png = finish_figure(fig, axes, "Faults relative to OPT by cache size")
    caption = (
        f"Each policy's faults divided by Belady's (OPT) on the same trace and cache "
        f"size; 1 is optimal. {_caption_seeds(res)}."
    )
    return FigureSpec("experts-vs-capacity", "Faults relative to OPT by cache size", caption, png)


def _vs_param(res: ExpertResults) -> FigureSpec | None:
    if len(res.vary) != 1:
        return None
    ((key, values),) = res.vary.items()
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    specs = [res.capacity_specs[i] for i in evenly(len(res.capacity_specs), 4)]
    fig, axes = _panels(len(specs))
    for ax, spec in zip(axes, specs, strict=True):
        for pi, pol in enumerate(res.policies):
            ys = [
                res.mean("fault_ratio_to_opt", **{key: v}, capacity_spec=spec, policy=pol)
                for v in values
            ]
            st = plot_style(pi)
            xs = [number(v) for v in values]
            ax.plot(xs, ys, label=pol, color=st["color"], marker=st["marker"], markersize=4)
        ax.set_title(f"k = {spec}", fontsize="small")
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("faults / OPT's faults")
    png = finish_figure(fig, axes, f"Faults relative to OPT against {key}")
    caption = f"One panel per cache size; {_caption_seeds(res)}."
    return FigureSpec(f"experts-vs-{key}", f"Faults relative to OPT against {key}", caption, png)


def _heatmap(res: ExpertResults) -> FigureSpec | None:
    if len(res.vary) != 2:
        return None
    (kx, xs), (ky, ys) = res.vary.items()
    spec = res.capacity_specs[0]
    policies = [p for p in res.policies if p != "opt"][:MAX_PANELS]
    if not policies:  # OPT against itself is 1 everywhere: nothing to show
        return None
    fig, axes = _panels(len(policies), height_in=3.0)
    grids = []
    for pol in policies:
        grid = np.array(
            [
                [
                    res.mean("fault_ratio_to_opt", **{kx: x, ky: y}, capacity_spec=spec, policy=pol)
                    for x in xs
                ]
                for y in ys
            ]
        )
        grids.append(grid)
    finite = [float(np.nanmax(g)) for g in grids if np.isfinite(g).any()]
    high = max(finite, default=1.0)  # a panel undefined everywhere (-dist, k < l) is blank
    image = None
    for ax, pol, grid in zip(axes, policies, grids, strict=True):
        top = max(high, 1.0 + 1e-9)
        image = ax.imshow(grid, origin="lower", cmap="viridis", vmin=1.0, vmax=top, aspect="auto")
        for (i, j), val in np.ndenumerate(grid):
            ax.text(j, i, f"{val:.2f}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_yticks(range(len(ys)), [str(y) for y in ys])
        ax.set_xlabel(kx)
        ax.set_ylabel(ky)
        ax.set_title(pol, fontsize="small")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="faults / OPT")
    title = f"Faults relative to OPT over {kx} and {ky} (k = {spec})"
    png = finish_figure(fig, axes, title)
    return FigureSpec("experts-heatmap", title, f"{_caption_seeds(res)}.", png)


def make_expert_figures(res: ExpertResults) -> list[FigureSpec]:
    figs = [_vs_capacity(res), _vs_param(res), _heatmap(res)]
    return [f for f in figs if f is not None]


def _num(x: float, fmt: str) -> str:
    """A number as shown; an undefined one (a -dist policy at k < l) as a dash."""
    return "&ndash;" if math.isnan(x) else fmt.format(x)


def _summary(res: ExpertResults) -> str:
    """Faults and ratio to OPT per variant, capacity entry and policy (means over seeds)."""
    specs = [res.capacity_specs[i] for i in evenly(len(res.capacity_specs), MAX_SUMMARY_CAPACITIES)]
    heads = ["Variant", "Capacity", "Policy", "Faults", "Fault rate", "Faults / OPT"]
    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>"]
    for v in res.variants:
        for spec in specs:
            for pi, pol in enumerate(res.policies):
                w = {"variant": v, "capacity_spec": spec, "policy": pol}
                cells = [
                    _num(res.mean("num_faults", **w), "{:,.0f}"),
                    _num(res.mean("fault_rate", **w), "{:.4f}"),
                    _num(res.mean("fault_ratio_to_opt", **w), "{:.3f}"),
                ]
                tds = ""
                if pi == 0:
                    span = len(res.policies)
                    tds = (
                        f'<td rowspan="{span}">{escape(v)}</td>'
                        f'<td rowspan="{span}">{escape(spec)}</td>'
                    )
                tds += f"<td>{escape(pol)}</td>" + "".join(
                    f'<td class="num">{c}</td>' for c in cells
                )
                out.append(f'<tr class="first">{tds}</tr>' if pi == 0 else f"<tr>{tds}</tr>")
    out.append("</table>")
    return "\n".join(out)


def render_expert_report(res: ExpertResults, figures: list[FigureSpec]) -> str:
    """The page as a string (no timestamp: the same results give the same page)."""
    meta = (
        f"expert cache &middot; {len(res.policies)} policies &middot; "
        f"{len(res.capacity_specs)} cache sizes &middot; {len(res.variants)} workload "
        f"variants &middot; seeds {escape(', '.join(map(str, res.seeds)))}"
    )
    intro = (
        "Faults (misses) per variant, cache size and policy; faults / OPT divides by "
        "Belady's faults on the same trace and size."
    )
    return page(
        res.name, meta, res.folder, intro, _summary(res), figures, res.config, res.environment
    )


def build_expert_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of an expert results folder (default ``FOLDER/report.html``)."""
    res = load_expert_results(folder)
    target = Path(out) if out is not None else res.folder / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    page = render_expert_report(res, make_expert_figures(res))
    atomic_write(target, page)
    return target
