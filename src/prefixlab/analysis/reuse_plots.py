"""Figures of a reuse analysis, one per analysis (``reuse_<what>.png``).

Drawn from a :class:`~prefixlab.analysis.reuse.ReuseAnalysis` only, on fresh matplotlib
figures (no pyplot, no global state), saved without a ``Software`` stamp so the same
analysis gives the same bytes. The gap figure is made only when some task has a fit.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from prefixlab.analysis.gaps import lognormal_cdf
from prefixlab.analysis.reuse import ALL, POSITION_LABELS, ReuseAnalysis
from prefixlab.errors import ConfigError
from prefixlab.report.plots import FigureSpec, write_figures

DPI = 100
MAX_GAP_PANELS = 6
#: a position bin with fewer stored blocks is left out of the position figure (noise)
MIN_PLOTTED_BLOCKS = 20


def _color(i: int) -> str:
    return f"C{i % 10}"


def _figure(num_panels: int, dpi: int, height_in: float = 3.4) -> tuple[Figure, list[Axes]]:
    ncols = min(num_panels, 3)
    nrows = math.ceil(num_panels / ncols)
    fig = Figure(
        figsize=(max(6.0, 3.6 * ncols), height_in * nrows + 0.6), dpi=dpi, layout="constrained"
    )
    grid = fig.subplots(nrows, ncols, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[num_panels:]:
        fig.delaxes(ax)
    return fig, axes[:num_panels]


def _png(fig: Figure, title: str, dpi: int) -> bytes:
    fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _ratio_axis(ax: Axes) -> None:
    ax.set_ylim(0.0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1))
    ax.grid(axis="y", alpha=0.3)


def _group_ticks(ax: Axes, groups: Sequence[str]) -> None:
    slanted = len(groups) * max(map(len, groups)) > 48  # labels would touch
    ax.set_xticks(
        np.arange(len(groups)),
        list(groups),
        rotation=30 if slanted else 0,
        ha="right" if slanted else "center",
    )


def _title(a: ReuseAnalysis, what: str) -> str:
    return f"{what}\n{a.name} ({a.num_requests:,} requests, {a.block_tokens}-token blocks)"


def _stacked_shares(ax: Axes, groups: list[str], intra: list[float], what: str) -> None:
    x = np.arange(len(groups))
    inter = [1.0 - v if not math.isnan(v) else math.nan for v in intra]
    legend = what == "session"  # the same two colours in both panels: one legend
    ax.bar(x, intra, 0.7, color=_color(0), label="intra (same session / task)" if legend else "_")
    ax.bar(x, inter, 0.7, bottom=intra, color=_color(1), label="inter" if legend else "_")
    _group_ticks(ax, groups)
    _ratio_axis(ax)
    ax.set_ylabel("share of reuses")
    ax.set_title(f"intra- vs inter-{what}")


def sessions_figure(a: ReuseAnalysis, dpi: int = DPI) -> FigureSpec:
    """Stacked shares of reuses: intra/inter-session and intra/inter-task, per task."""
    groups = [g for g in a.groups() if a.attribution[g].num_reuses]
    rows = [a.attribution[g] for g in groups]
    fig, (left, right) = _figure(2, dpi)
    fig.set_figwidth(9.5)
    if groups:
        _stacked_shares(left, groups, [r.num_intra_session / r.num_reuses for r in rows], "session")
        _stacked_shares(right, groups, [r.num_intra_task / r.num_reuses for r in rows], "task")
    fig.legend(fontsize="small", loc="outside right upper", frameon=False)
    caption = "Each reuse is attributed to the most recent earlier request holding the block."
    return FigureSpec(
        "reuse_sessions",
        "Reuse by session and task",
        caption,
        _png(fig, _title(a, "who reuses blocks"), dpi),
    )


def phase_figure(a: ReuseAnalysis, dpi: int = DPI) -> FigureSpec:
    """Fraction of stored prefill and decode blocks reused later, per task."""
    groups = a.groups()
    fig, (ax,) = _figure(1, dpi)
    x = np.arange(len(groups), dtype=np.float64)
    for j, (label, values) in enumerate(
        (
            ("prefill blocks", [a.phase[g].prefill_reuse_fraction for g in groups]),
            ("decode blocks", [a.phase[g].decode_reuse_fraction for g in groups]),
        )
    ):
        ys = [math.nan if v is None else v for v in values]
        xs = x + (j - 0.5) * 0.38
        ax.bar(xs, ys, 0.38, color=_color(j), label=label)
        for xi, y in zip(xs, ys, strict=True):
            if not math.isnan(y):  # a 0 % bar is otherwise invisible
                ax.annotate(
                    f"{y:.0%}",
                    (xi, y),
                    ha="center",
                    va="bottom",
                    xytext=(0, 1),
                    textcoords="offset points",
                    fontsize="x-small",
                )
    _group_ticks(ax, groups)
    _ratio_axis(ax)
    ax.set_ylabel("fraction reused later")
    fig.legend(fontsize="small", loc="outside right upper", frameon=False)
    caption = "Of the blocks each request stores, the share a later request looks up."
    return FigureSpec(
        "reuse_phase",
        "Prefill vs decode block reuse",
        caption,
        _png(fig, _title(a, "prefill vs decode reuse"), dpi),
    )


def position_figure(a: ReuseAnalysis, dpi: int = DPI) -> FigureSpec:
    """Reuse probability of stored prefill blocks by block position, one line per task."""
    fig, (ax,) = _figure(1, dpi)
    fig.set_figwidth(7.5)
    x = np.arange(len(POSITION_LABELS))
    for i, group in enumerate(a.groups()):
        pos = a.position[group]
        ys = [
            math.nan if p is None or n < MIN_PLOTTED_BLOCKS else p
            for p, n in zip(pos.probability, pos.num_stored, strict=True)
        ]
        style = {"lw": 2.5, "color": "black"} if group == ALL else {"color": _color(i - 1)}
        ax.plot(x, ys, marker="o", ms=3, label=group, **style)
    ax.set_xticks(x, list(POSITION_LABELS), fontsize="small")
    ax.set_xlabel("block position in the prompt")
    ax.set_ylabel("reuse probability")
    _ratio_axis(ax)
    fig.legend(fontsize="small", loc="outside right upper", frameon=False)
    caption = (
        "Share of stored prefill blocks at each position that a later request looks up; "
        f"bins with fewer than {MIN_PLOTTED_BLOCKS} blocks are not drawn."
    )
    return FigureSpec(
        "reuse_position",
        "Reuse probability by position",
        caption,
        _png(fig, _title(a, "reuse probability by position"), dpi),
    )


def gaps_figure(a: ReuseAnalysis, dpi: int = DPI) -> FigureSpec | None:
    """Empirical CDF of inter-turn gaps per task with the fitted log-normal CDF overlaid."""
    fits = [(t, g) for t, g in a.gaps.items() if g.mu is not None][:MAX_GAP_PANELS]
    if not fits:
        return None
    fig, axes = _figure(len(fits), dpi)
    for ax, (task, g) in zip(axes, fits, strict=True):
        assert g.mu is not None and g.sigma is not None
        n = g.gaps_s.shape[0]
        ax.step(g.gaps_s, np.arange(1, n + 1) / n, where="post", color=_color(0), label="empirical")
        grid = np.geomspace(g.gaps_s[0], g.gaps_s[-1], 200)
        ax.plot(
            grid, lognormal_cdf(grid, g.mu, g.sigma), "--", color=_color(3), label="log-normal fit"
        )
        ax.set_xscale("log")
        ax.set_title(
            f"{task}: mu={g.mu:.2f}, sigma={g.sigma:.2f}, n={g.num_gaps:,}", fontsize="medium"
        )
        ax.set_xlabel("gap between turns (s)")
        _ratio_axis(ax)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_ylabel("CDF")
    axes[0].legend(fontsize="small", loc="lower right")
    caption = "Gaps are arrival to arrival, so they include the previous turn's service time."
    return FigureSpec(
        "reuse_gaps", "Inter-turn gaps", caption, _png(fig, _title(a, "inter-turn gaps"), dpi)
    )


def headroom_figure(a: ReuseAnalysis, dpi: int = DPI) -> FigureSpec:
    """Token hit ratio: infinite cache, and OPT and LRU at the given capacity."""
    h = a.headroom
    bars: list[tuple[str, float | None]] = [("infinite cache", h.infinite_token_hit_ratio)]
    if h.capacity_blocks is not None:
        bars += [
            (f"OPT @ {h.capacity_blocks:,}", h.opt_token_hit_ratio),
            (f"LRU @ {h.capacity_blocks:,}", h.lru_token_hit_ratio),
        ]
    fig, (ax,) = _figure(1, dpi)
    values = [math.nan if v is None else v for _, v in bars]
    ax.bar(np.arange(len(bars)), values, 0.6, color=[_color(i) for i in range(len(bars))])
    for i, v in enumerate(values):
        ax.annotate(
            f"{v:.1%}", (i, v), ha="center", va="bottom", xytext=(0, 2), textcoords="offset points"
        )
    _group_ticks(ax, [b for b, _ in bars])
    _ratio_axis(ax)
    ax.set_ylabel("token hit ratio")
    caption = "Capacity in blocks; OPT is offline Belady (prefix-aware)."
    return FigureSpec(
        "reuse_headroom", "Hit-ratio headroom", caption, _png(fig, _title(a, "headroom"), dpi)
    )


_MAKERS: tuple[Callable[[ReuseAnalysis, int], FigureSpec | None], ...] = (
    sessions_figure,
    phase_figure,
    position_figure,
    gaps_figure,
    headroom_figure,
)


def reuse_figures(a: ReuseAnalysis, dpi: int = DPI) -> list[FigureSpec]:
    """Every figure that applies to the analysis, in order."""
    return [spec for make in _MAKERS if (spec := make(a, dpi)) is not None]


def write_reuse_plots(a: ReuseAnalysis, out_dir: str | Path, dpi: int = DPI) -> list[Path]:
    """Write ``<slug>.png`` for each figure into ``out_dir`` (created); their paths."""
    if dpi <= 0:
        raise ConfigError(f"dpi must be positive, got {dpi}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--plots: {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plots: cannot create {out}: {exc.strerror}") from exc
    return write_figures(reuse_figures(a, dpi), out)


__all__ = [
    "gaps_figure",
    "headroom_figure",
    "phase_figure",
    "position_figure",
    "reuse_figures",
    "sessions_figure",
    "write_reuse_plots",
]
