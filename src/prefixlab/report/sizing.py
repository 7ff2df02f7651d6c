"""The figure of a fleet sizing (``prefixlab plan``): P95 time to first token and token hit
ratio against replicas, one line per (router, tier setup), the target as a line; and
against the CPU pool per replica when the sizing has that curve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from prefixlab.experiments.sizing import Sizing, SizingPoint
from prefixlab.io import atomic_write
from prefixlab.report.plots import finish_figure, plot_style


def sizing_png(sizing: Sizing, title: str) -> bytes:
    """P95 arrival-to-first-token time (log scale, the target dashed) and token hit ratio
    against replicas (every simulated count), and, when the sizing has one, against the
    CPU pool per replica (each router at one replica count)."""
    rows = 2 if sizing.cpu_points else 1
    fig = Figure(figsize=(11.0, 4.0 * rows), dpi=100, layout="constrained")
    grid = fig.subplots(rows, 2, squeeze=False)
    for i, (router, tiers) in enumerate(sizing.answers):
        pts = sorted(
            (p for p in sizing.points if (p.router, p.tiers) == (router, tiers)),
            key=lambda p: p.replicas,
        )
        label = router if tiers == "none" else f"{router}, {tiers}"
        _lines(grid[0], [p.replicas for p in pts], pts, label, i)
    _axes(grid[0], "replicas", sizing.slo_p95_ttft_s)
    for ax in grid[0]:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    if sizing.cpu_points:
        routers = list(dict.fromkeys(p.router for p in sizing.cpu_points))
        for i, router in enumerate(routers):
            pts = sorted(
                (p for p in sizing.cpu_points if p.router == router), key=lambda p: p.cpu_gb
            )
            n = pts[0].replicas
            _lines(grid[1], [p.cpu_gb for p in pts], pts, f"{router}, {n} replicas", i + 6)
        _axes(grid[1], "CPU pool per replica (GB)", sizing.slo_p95_ttft_s)
    return finish_figure(fig, [ax for row in grid for ax in row], title)


def _lines(
    axes: Sequence[Axes], xs: list[float], pts: list[SizingPoint], label: str, i: int
) -> None:
    color, marker = plot_style(i)["color"], plot_style(i)["marker"]
    curves = ([p.p95_ttft_s for p in pts], [p.token_hit_ratio for p in pts])
    for ax, ys in zip(axes, curves, strict=True):
        ax.plot(xs, ys, label=label, color=color, marker=marker)


def _axes(axes: Sequence[Axes], xlabel: str, target: float) -> None:
    axes[0].axhline(target, color="black", linestyle="--", label="target")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("P95 TTFT, arrival to first token (s)")
    axes[1].set_ylabel("token hit ratio")
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)


def write_sizing_png(sizing: Sizing, path: str | Path, title: str) -> None:
    atomic_write(path, sizing_png(sizing, title))
