"""The report's figures, drawn from a saved results folder only.

:func:`load_results` reads the folder's tables into :class:`Results` (means over seeds,
cache sizes in blocks, CDF curves), which the figures here and the HTML page share.
Every figure is a fresh :class:`~matplotlib.figure.Figure` (no pyplot, no global state),
saved at a fixed size and dpi without a ``Software`` stamp, so the same results give the
same PNG bytes. A figure is made only when it applies (latency plots need the engine
runner; per-group bars need two groups; sizes-for-a-target need two capacities), and its
caption says what was averaged or chosen.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import PercentFormatter

from prefixlab.errors import ConfigError
from prefixlab.experiments.store import find_results, read_json, read_table
from prefixlab.io import atomic_write

F64 = npt.NDArray[np.float64]
#: (variant, capacity_index, policy_index): a point of the plan, seeds averaged
Key = tuple[str, int, int]
#: (variant, capacity_index, policy_index, seed): one cell
CellKey = tuple[str, int, int, int]
#: (variant, group label, policy_index): a breakdown group at one capacity, seeds averaged
GroupKey = tuple[str, str, int]

DPI = 100
#: one colour and marker per policy index, the same in every figure
_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
#: target token hit ratios of ``size_for_target``, as fractions of the best one reached
TARGET_FRACTIONS = (0.5, 0.75, 0.9)
MAX_VARIANT_PANELS = 6
MAX_CDF_PANELS = 4


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """One finished figure: ``slug`` names its file (``<slug>.png``)."""

    slug: str
    title: str
    caption: str
    png: bytes


# ------------------------------------------------------------------ the results, loaded
@dataclass(frozen=True, slots=True)
class SeedStat:
    """A metric over the seeds of one point: mean, min, max (NaN values left out)."""

    mean: float
    low: float
    high: float
    num_seeds: int

    @staticmethod
    def of(values: Sequence[float]) -> SeedStat:
        vals = [v for v in values if not math.isnan(v)]
        if not vals:
            return SeedStat(math.nan, math.nan, math.nan, 0)
        return SeedStat(sum(vals) / len(vals), min(vals), max(vals), len(vals))


@dataclass(frozen=True, slots=True)
class Results:
    """A results folder as the report needs it; orders are the plan's."""

    folder: Path
    name: str
    runner: str
    variants: tuple[str, ...]
    capacities: tuple[str, ...]  # capacity specs, by capacity_index
    policies: tuple[str, ...]  # policy specs, by policy_index
    seeds: tuple[int, ...]
    #: the numeric columns of each cell (NaN where missing)
    cells: dict[CellKey, dict[str, float]]
    #: (cell key, dimension, group) -> token hit ratio of that group
    group_hits: dict[tuple[CellKey, str, str], float]
    #: cell key -> (quantiles, TTFT seconds), engine runner only
    cdf: dict[CellKey, tuple[F64, F64]]
    config: dict[str, object]
    environment: dict[str, object]
    #: unit of cache sizes: blocks, or GB for the hybrid cache (a byte budget)
    size_unit: str = "blocks"

    def stat(self, metric: str) -> dict[Key, SeedStat]:
        """``metric`` per point of the plan, over seeds."""
        by_key: dict[Key, list[float]] = {}
        for (v, ci, pi, _), values in self.cells.items():
            by_key.setdefault((v, ci, pi), []).append(values.get(metric, math.nan))
        return {k: SeedStat.of(vals) for k, vals in by_key.items()}

    def has(self, metric: str) -> bool:
        return any(not math.isnan(c.get(metric, math.nan)) for c in self.cells.values())

    def blocks(self, variant: str, capacity_index: int) -> float:
        """A capacity in blocks (the mean over seeds: ``0.5ws`` depends on the trace)."""
        sizes = [
            c["capacity_blocks"]
            for (v, ci, _, _), c in self.cells.items()
            if v == variant and ci == capacity_index
        ]
        return SeedStat.of(sizes).mean

    def capacity_label(self, variant: str, capacity_index: int, with_variant: bool = True) -> str:
        """``0.5ws (1,474 blocks)``, and the variant when there are several."""
        spec = self.capacities[capacity_index]
        size = self.blocks(variant, capacity_index)
        blocks = f"{size:,.1f} GB" if self.size_unit == "GB" else f"{size:,.0f} blocks"
        label = blocks if spec.isdigit() else f"{spec} ({blocks})"
        several = with_variant and len(self.variants) > 1
        return f"{label}, {variant}" if several else label

    def groups(self, dimension: str, capacity_index: int) -> list[str]:
        """The breakdown's group labels at a capacity; length bins in numeric order."""
        labels: dict[str, None] = {}
        for key, dim, group in self.group_hits:
            if dim == dimension and key[1] == capacity_index:
                labels[group] = None
        if dimension == "length_bin":
            return sorted(labels, key=lambda s: int(s.split("-")[0].rstrip("+")))
        return list(labels)

    def group_stat(self, dimension: str, capacity_index: int) -> dict[GroupKey, SeedStat]:
        """Token hit ratio per (variant, group, policy_index) at a capacity, over seeds."""
        by_key: dict[GroupKey, list[float]] = {}
        for ((v, ci, pi, _), dim, group), hit in self.group_hits.items():
            if dim == dimension and ci == capacity_index:
                by_key.setdefault((v, group, pi), []).append(hit)
        return {k: SeedStat.of(vals) for k, vals in by_key.items()}


def _rows(folder: Path, name: str) -> list[dict[str, object]]:
    if name != "results" and not (folder / f"{name}.parquet").is_file():
        return []
    try:
        rows: list[dict[str, object]] = read_table(folder, name).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's errors for a damaged file
        raise ConfigError(f"{folder / name}.parquet: unreadable ({exc})") from None
    return rows


def _key(row: dict[str, object]) -> CellKey:
    v, ci, pi, seed = (row.get(k) for k in ("variant", "capacity_index", "policy_index", "seed"))
    if not (
        isinstance(v, str) and isinstance(ci, int) and isinstance(pi, int) and isinstance(seed, int)
    ):
        raise ConfigError(f"a results row lacks its key columns: {row.get('cell_id')!r}")
    return v, ci, pi, seed


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None if value is not None else math.nan
    return float(value)


def load_results(folder: str | Path) -> Results:
    """Read a results folder (or its results file); a missing or damaged one is a ConfigError."""
    path = find_results(folder)
    rows = _rows(path, "results")
    if not rows:
        raise ConfigError(f"{path}: results.parquet has no rows")
    cells: dict[CellKey, dict[str, float]] = {}
    variants: dict[str, None] = {}
    capacities: dict[int, str] = {}
    policies: dict[int, str] = {}
    seeds: dict[int, None] = {}
    hybrid = any(row.get("structure") == "hybrid" for row in rows)
    for row in rows:
        key = _key(row)
        numbers = {k: n for k, val in row.items() if (n := _number(val)) is not None}
        if hybrid:  # a byte budget: sizes in GB
            numbers["capacity_blocks"] = numbers.get("capacity_bytes", math.nan) / 1e9
        cells[key] = numbers
        variants[key[0]] = None
        capacities[key[1]] = str(row.get("capacity"))
        policies[key[2]] = str(row.get("policy"))
        seeds[key[3]] = None
    group_hits = {
        (_key(r), str(r["dimension"]), str(r["group"])): _number(r.get("token_hit_ratio")) or 0.0
        for r in _rows(path, "breakdown")
    }
    by_cell: dict[CellKey, list[tuple[float, float]]] = {}
    for r in _rows(path, "cdf"):
        q, t = _number(r.get("quantile")), _number(r.get("ttft_s"))
        by_cell.setdefault(_key(r), []).append((q or 0.0, math.nan if t is None else t))
    cdf = {
        k: (np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
        for k, pts in ((k, sorted(v)) for k, v in by_cell.items())
    }
    return Results(
        folder=path,
        name=str(rows[0].get("experiment") or path.name),
        runner=str(rows[0].get("runner")),
        variants=tuple(variants),
        capacities=tuple(capacities[i] for i in sorted(capacities)),
        policies=tuple(policies[i] for i in sorted(policies)),
        seeds=tuple(seeds),
        cells=cells,
        group_hits=group_hits,
        cdf=cdf,
        config=read_json(path, "config.resolved.json"),
        environment=read_json(path, "environment.json"),
        size_unit="GB" if hybrid else "blocks",
    )


# ------------------------------------------------------------------ helpers
def evenly(num_items: int, k: int) -> list[int]:
    """At most ``k`` indices of ``range(num_items)``, evenly spread, first and last kept."""
    if num_items <= k:
        return list(range(num_items))
    if k == 1:
        return [0]
    return sorted({round(i * (num_items - 1) / (k - 1)) for i in range(k)})


def new_figure(num_panels: int, height_in: float = 3.4) -> tuple[Figure, list[Axes]]:
    ncols = min(num_panels, 3)
    nrows = math.ceil(num_panels / ncols)
    width = max(7.0, 3.4 * ncols) + 1.9  # room on the right for the legend
    fig = Figure(figsize=(width, height_in * nrows + 0.5), dpi=DPI, layout="constrained")
    grid = fig.subplots(nrows, ncols, squeeze=False, sharey=True)  # panels compare
    axes = [ax for row in grid for ax in row]
    for ax in axes[num_panels:]:
        fig.delaxes(ax)
    return fig, axes[:num_panels]


def finish_figure(fig: Figure, axes: Sequence[Axes], title: str) -> bytes:
    """Title, one legend outside the panels (never over the data), PNG bytes."""
    fig.suptitle(title)
    handles, labels, seen = [], [], set()
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in seen and not label.startswith("_"):
                seen.add(label)
                handles.append(h)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="outside right upper", frameon=False, fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def plot_style(pi: int) -> dict[str, str]:
    return {"color": _COLORS[pi % len(_COLORS)], "marker": _MARKERS[pi % len(_MARKERS)]}


def _bars(
    ax: Axes,
    groups: Sequence[str],
    series: Sequence[tuple[int, str, Sequence[SeedStat | None]]],
) -> None:
    """Grouped bars: one group per label, one bar per series (mean; min-max whiskers)."""
    width = 0.8 / max(len(series), 1)
    base = np.arange(len(groups), dtype=np.float64)
    for j, (pi, label, stats) in enumerate(series):
        kept = [(i, st) for i, st in enumerate(stats) if st is not None and not math.isnan(st.mean)]
        xs = base[[i for i, _ in kept]] + (j - (len(series) - 1) / 2) * width
        means = [st.mean for _, st in kept]
        ax.bar(xs, means, width, label=label, color=plot_style(pi)["color"])
        if any(st.num_seeds > 1 for _, st in kept):
            err = [[st.mean - st.low for _, st in kept], [st.high - st.mean for _, st in kept]]
            ax.errorbar(xs, means, yerr=err, fmt="none", ecolor="black", lw=0.8, capsize=2)
    slanted = max(map(len, groups)) > 9
    ax.set_xticks(
        base, list(groups), rotation=30 if slanted else 0, ha="right" if slanted else "center"
    )


def _spec(capacity: str) -> str:
    return f"{capacity} blocks" if capacity.isdigit() else capacity


def _seeds_note(res: Results) -> str:
    n = len(res.seeds)
    if n == 1:
        return f"seed {res.seeds[0]}"
    return f"mean over {n} seeds, whiskers or band from their min to max"


# ------------------------------------------------------------------ 1. hit vs capacity
def _variant_axis(variants: Sequence[str]) -> tuple[list[float], str, list[str] | None]:
    """x positions of the variants: the value when all are one numeric key (``p=0.5``)."""
    parts = [v.split("=", 1) for v in variants]
    if all(len(p) == 2 for p in parts) and len({p[0] for p in parts}) == 1:
        try:
            return [float(p[1]) for p in parts], parts[0][0], None
        except ValueError:
            pass
    return [float(i) for i in range(len(variants))], "workload variant", list(variants)


def _line(ax: Axes, xs: Sequence[float], stats: Sequence[SeedStat], pi: int, label: str) -> None:
    order = np.argsort(np.asarray(xs), kind="stable")
    x = np.asarray(xs)[order]
    style = plot_style(pi)
    ax.plot(
        x, [stats[i].mean for i in order], label=label, color=style["color"], marker=style["marker"]
    )
    if any(s.num_seeds > 1 for s in stats):
        lo, hi = [stats[i].low for i in order], [stats[i].high for i in order]
        ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)


def _ratio_axes(axes: Sequence[Axes], grid: Literal["both", "x", "y"] = "both") -> None:
    """Hit-ratio y axes in percent, never below 0 % (an all-zero line stays readable).

    Called once all panels are drawn: the panels share y, so the limits cover them all.
    """
    low, high = axes[0].get_ylim()
    axes[0].set_ylim(max(low, 0.0), high if high > 0 else 1.0)
    for ax in axes:
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
        ax.grid(axis=grid, alpha=0.3)


def _hit_vs_variant(res: Results) -> FigureSpec:
    """One cache size, several workload variants: x is the variant (its value if numeric)."""
    stat = res.stat("token_hit_ratio")
    xs, xlabel, ticks = _variant_axis(res.variants)
    fig, axes = new_figure(1)
    for pi, pol in enumerate(res.policies):
        _line(axes[0], xs, [stat[(v, 0, pi)] for v in res.variants], pi, pol)
    axes[0].set_xlabel(xlabel)
    if ticks is not None:
        axes[0].set_xticks(xs, ticks)
    _ratio_axes(axes)
    axes[0].set_ylabel("token hit ratio")
    caption = (
        f"Token hit ratio, one line per policy ({_seeds_note(res)}), at one cache size "
        f"({_spec(res.capacities[0])}); x is the workload's {xlabel}."
    )
    title = f"Token hit ratio vs {xlabel}"
    return FigureSpec("hit_vs_capacity", title, caption, finish_figure(fig, axes, title))


def _hit_vs_capacity(res: Results) -> FigureSpec:
    if len(res.variants) > 1 and len(res.capacities) == 1:
        return _hit_vs_variant(res)
    stat = res.stat("token_hit_ratio")
    chosen = evenly(len(res.variants), MAX_VARIANT_PANELS)
    fig, axes = new_figure(len(chosen))
    for ax, vi in zip(axes, chosen, strict=True):
        v = res.variants[vi]
        xs = [res.blocks(v, ci) for ci in range(len(res.capacities))]
        for pi, pol in enumerate(res.policies):
            _line(ax, xs, [stat[(v, ci, pi)] for ci in range(len(xs))], pi, pol)
        ax.set_xlabel(f"cache size ({res.size_unit})")
        if v:
            ax.set_title(v, fontsize="medium")
        if min(xs) > 0 and max(xs) / min(xs) >= 20:
            ax.set_xscale("log")
    _ratio_axes(axes)
    axes[0].set_ylabel("token hit ratio")
    caption = (
        f"Token hit ratio, one line per policy ({_seeds_note(res)}); x is the cache "
        f"size in {res.size_unit} (the mean over seeds where a size is a fraction of each "
        "seed's working set)."
    )
    if len(chosen) < len(res.variants):
        caption += f" {len(chosen)} of {len(res.variants)} variants, evenly chosen."
    title = "Token hit ratio vs cache size"
    return FigureSpec("hit_vs_capacity", title, caption, finish_figure(fig, axes, title))


# ------------------------------------------------------------------ 2-3. latency
def _cells(res: Results) -> list[tuple[str, int]]:
    return [(v, ci) for v in res.variants for ci in range(len(res.capacities))]


def _ttft_cdf(res: Results) -> FigureSpec | None:
    if res.runner != "engine" or not res.cdf:
        return None
    cells = _cells(res)
    chosen = [cells[i] for i in evenly(len(cells), MAX_CDF_PANELS)]
    fig, axes = new_figure(len(chosen))
    seed = res.seeds[0]
    for ax, (v, ci) in zip(axes, chosen, strict=True):
        positive = True
        for pi, pol in enumerate(res.policies):
            curve = res.cdf.get((v, ci, pi, seed))
            if curve is not None:
                q, ttft = curve
                positive = positive and bool((ttft > 0).all())
                ax.plot(ttft, q, label=pol, color=plot_style(pi)["color"])
        if positive:
            ax.set_xscale("log")
        ax.set_title(res.capacity_label(v, ci), fontsize="medium")
        ax.set_xlabel("TTFT (s)")
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("requests at or below")
    caption = (
        f"Distribution of TTFT (arrival to first token, queueing included), one line per "
        f"policy, seed {seed} only."
    )
    if len(chosen) < len(cells):
        caption += f" {len(chosen)} of {len(cells)} cache sizes, evenly chosen."
    title = "TTFT distribution"
    return FigureSpec("ttft_cdf", title, caption, finish_figure(fig, axes, title))


def _p95_ttft(res: Results) -> FigureSpec | None:
    if res.runner != "engine" or not res.has("p95_ttft_s"):
        return None
    stat = res.stat("p95_ttft_s")
    cells = _cells(res)
    groups = [res.capacity_label(v, ci) for v, ci in cells]
    series = [
        (pi, pol, [stat.get((v, ci, pi)) for v, ci in cells]) for pi, pol in enumerate(res.policies)
    ]
    fig, axes = new_figure(1)
    _bars(axes[0], groups, series)
    axes[0].set_ylabel("P95 TTFT (s)")
    axes[0].grid(axis="y", alpha=0.3)
    caption = (
        "95th-percentile TTFT (arrival to first token) per cache size, one bar per policy "
        f"({_seeds_note(res)})."
    )
    title = "P95 TTFT by cache size"
    return FigureSpec("p95_ttft", title, caption, finish_figure(fig, axes, title))


# ------------------------------------------------------------------ 4-5. per group
def _hit_by(res: Results, dimension: str, slug: str, what: str) -> FigureSpec | None:
    ci = len(res.capacities) // 2
    chosen = [res.variants[i] for i in evenly(len(res.variants), MAX_VARIANT_PANELS)]
    stat = res.group_stat(dimension, ci)
    groups = res.groups(dimension, ci)
    if len(groups) < 2:
        return None
    fig, axes = new_figure(len(chosen))
    for ax, v in zip(axes, chosen, strict=True):
        series = [
            (pi, pol, [stat.get((v, g, pi)) for g in groups]) for pi, pol in enumerate(res.policies)
        ]
        _bars(ax, groups, series)
        ax.set_title(res.capacity_label(v, ci), fontsize="medium")
    _ratio_axes(axes, grid="y")
    axes[0].set_ylabel("token hit ratio")
    caption = (
        f"Token hit ratio per {what} at the middle cache size "
        f"({_spec(res.capacities[ci])}), one bar per policy ({_seeds_note(res)})."
    )
    if len(chosen) < len(res.variants):
        caption += f" {len(chosen)} of {len(res.variants)} variants, evenly chosen."
    title = f"Token hit ratio by {what}"
    return FigureSpec(slug, title, caption, finish_figure(fig, axes, title))


# ------------------------------------------------------------------ 6. size for a target
def size_for_target(
    sizes_blocks: Sequence[float], hit_ratios: Sequence[float], target: float
) -> float | None:
    """The cache size at which a hit-ratio curve first reaches ``target``; None if never.

    The curve is made monotone (running max: a larger cache can always act as a smaller
    one) and starts at (0 blocks, 0 hits); sizes between points are linear::

        hit  ^          .------  (400, .5)      target .35 lies between (100, .2)
         .5  |     .---'                         and (200, .5): 100 + (.35-.2)/.3*100
         .2  |  .-'  (200, .5) after max(.4)     = 150 blocks
          0  +--+----+---------+--> blocks
             0 100  200       400
    """
    order = np.argsort(np.asarray(sizes_blocks, dtype=np.float64), kind="stable")
    xs = np.concatenate(([0.0], np.asarray(sizes_blocks, dtype=np.float64)[order]))
    ys = np.maximum.accumulate(
        np.concatenate(([0.0], np.asarray(hit_ratios, dtype=np.float64)[order]))
    )
    reached = np.nonzero(ys >= target)[0]
    if len(reached) == 0:
        return None
    i = int(reached[0])
    if i == 0:
        return 0.0
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0))


def _size_panel(ax: Axes, res: Results, v: str, stat: dict[Key, SeedStat]) -> None:
    caps = range(len(res.capacities))
    xs = [res.blocks(v, ci) for ci in caps]
    best = max(stat[(v, ci, pi)].mean for ci in caps for pi in range(len(res.policies)))
    targets = [f * best for f in TARGET_FRACTIONS]
    top = max(xs)
    width = 0.8 / len(res.policies)
    base = np.arange(len(targets), dtype=np.float64)
    for pi, pol in enumerate(res.policies):
        ys = [stat[(v, ci, pi)].mean for ci in caps]
        x = base + (pi - (len(res.policies) - 1) / 2) * width
        color = plot_style(pi)["color"]
        ax.add_patch(Rectangle((0, 0), 0, 0, color=color, label=pol))  # the legend's swatch
        for k, t in enumerate(targets):
            size = size_for_target(xs, ys, t) if best > 0 else None
            if size is not None:  # lighter when below the smallest size swept
                alpha = 1.0 if size >= min(xs) else 0.45
                ax.bar(x[k], size, width, color=color, alpha=alpha)
                continue
            ax.bar(x[k], top, width, facecolor="none", edgecolor=color, hatch="//")
            box = {"facecolor": "white", "edgecolor": "none", "pad": 1}
            ax.text(
                x[k],
                top / 2,
                "not reached",
                rotation=90,
                ha="center",
                va="center",
                fontsize="small",
                bbox=box,
            )
    labels = [f"{f:.0%} of best\n({t:.1%})" for f, t in zip(TARGET_FRACTIONS, targets, strict=True)]
    ax.set_xticks(base, labels)
    ax.set_ylim(0, top * 1.05)
    if v:
        ax.set_title(v, fontsize="medium")
    ax.grid(axis="y", alpha=0.3)


def _size_for_target(res: Results) -> FigureSpec | None:
    if len(res.capacities) < 2:
        return None
    stat = res.stat("token_hit_ratio")
    chosen = [res.variants[i] for i in evenly(len(res.variants), MAX_VARIANT_PANELS)]
    fig, axes = new_figure(len(chosen))
    for ax, v in zip(axes, chosen, strict=True):
        _size_panel(ax, res, v, stat)
    axes[0].set_ylabel(f"cache size ({res.size_unit})")
    fractions = ", ".join(f"{f:.0%}" for f in TARGET_FRACTIONS)
    curve = "mean over seeds" if len(res.seeds) > 1 else f"seed {res.seeds[0]}"
    caption = (
        f"Cache size each policy needs to reach a token hit ratio of {fractions} of the best "
        f"any policy reached, read off its hit-ratio curve ({curve}, made monotone, linear "
        "between swept sizes). Lighter bars: below the smallest swept size, interpolated from "
        "an empty cache and zero hits. Hatched bars at the largest swept size: not reached."
    )
    if len(chosen) < len(res.variants):
        caption += f" {len(chosen)} of {len(res.variants)} variants, evenly chosen."
    title = "Cache size needed for a target hit ratio"
    return FigureSpec("size_for_target", title, caption, finish_figure(fig, axes, title))


# ------------------------------------------------------------------ entry points
_MAKERS: tuple[Callable[[Results], FigureSpec | None], ...] = (
    _hit_vs_capacity,
    _ttft_cdf,
    _p95_ttft,
    lambda r: _hit_by(r, "task", "hit_by_task", "task"),
    lambda r: _hit_by(r, "length_bin", "hit_by_length", "input length (tokens)"),
    _size_for_target,
)


def make_figures(folder: str | Path | Results) -> list[FigureSpec]:
    """Every figure that applies to a results folder (or already loaded results), in order."""
    res = folder if isinstance(folder, Results) else load_results(folder)
    return [spec for make in _MAKERS if (spec := make(res)) is not None]


def write_plots(folder: str | Path | Results, out_dir: str | Path) -> list[Path]:
    """Write ``<slug>.png`` for every figure of an experiment's results into ``out_dir``
    (created); their paths. (:func:`prefixlab.studies.write_plots` takes any kind.)"""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_figures(make_figures(folder), out)


def write_figures(specs: Iterable[FigureSpec], out: Path) -> list[Path]:
    """Write each figure as ``out/<slug>.png`` (whole or not at all); their paths."""
    paths = []
    for spec in specs:
        path = out / f"{spec.slug}.png"
        atomic_write(path, spec.png)
        paths.append(path)
    return paths


__all__ = [
    "FigureSpec",
    "evenly",
    "make_figures",
    "size_for_target",
    "write_figures",
    "write_plots",
]
