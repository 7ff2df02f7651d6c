"""The figure of a fleet sizing (``prefixlab plan``): P95 time to first token and token hit
ratio against replicas, one line per (router, tier setup), the target as a line."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from prefixlab.experiments.sizing import Sizing
from prefixlab.io import atomic_write
from prefixlab.report.plots import finish_figure, plot_style


def sizing_png(sizing: Sizing, title: str) -> bytes:
    """Two panels over replicas (every simulated count): P95 arrival-to-first-token time
    (log scale, the target dashed) and token hit ratio."""
    fig = Figure(figsize=(11.0, 4.0), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2)
    for i, (router, tiers) in enumerate(sizing.answers):
        pts = sorted(
            (p for p in sizing.points if (p.router, p.tiers) == (router, tiers)),
            key=lambda p: p.replicas,
        )
        label = router if tiers == "none" else f"{router}, {tiers}"
        xs = [p.replicas for p in pts]
        style = plot_style(i)
        left.plot(xs, [p.p95_ttft_s for p in pts], label=label, **style)
        right.plot(xs, [p.token_hit_ratio for p in pts], label=label, **style)
    left.axhline(sizing.slo_p95_ttft_s, color="black", linestyle="--", label="target")
    left.set_yscale("log")
    left.set_ylabel("P95 TTFT, arrival to first token (s)")
    right.set_ylabel("token hit ratio")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("replicas")
        ax.grid(True, alpha=0.3)
    return finish_figure(fig, [left, right], title)


def write_sizing_png(sizing: Sizing, path: str | Path, title: str) -> None:
    atomic_write(path, sizing_png(sizing, title))
