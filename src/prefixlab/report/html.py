"""One self-contained HTML page per results folder: tables, figures, config, environment.

The page is made from the saved folder only, with every figure inlined as a base64 PNG and
the CSS in a ``<style>`` element: no scripts, no external URLs, so it opens offline and can
be mailed or attached as one file. It carries no timestamp, so the same results give the
same page.
"""

from __future__ import annotations

import base64
import csv
import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path

from prefixlab.io import atomic_write
from prefixlab.report.plots import FigureSpec, Results, load_results, make_figures

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; color: #222; max-width: 1150px;
       margin: 2em auto; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.meta { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 14px; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #e4e4e4; text-align: left; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.first td { border-top: 2px solid #bbb; } td[rowspan] { vertical-align: top; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; height: auto; }
figcaption { color: #444; font-size: 14px; max-width: 60em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 13px; }
"""


@dataclass(frozen=True, slots=True)
class _Column:
    metric: str
    header: str
    fmt: Callable[[float], str]
    higher_is_better: bool


_COLUMNS = (
    _Column("token_hit_ratio", "Token hit", lambda x: f"{x:.1%}", True),
    _Column("request_hit_ratio", "Request hit", lambda x: f"{x:.1%}", True),
    _Column("flops_saved_ratio", "FLOPs saved", lambda x: f"{x:.1%}", True),
    _Column("mean_ttft_s", "Mean TTFT (ms)", lambda x: f"{x * 1e3:,.1f}", False),
    _Column("p50_ttft_s", "P50 TTFT (ms)", lambda x: f"{x * 1e3:,.1f}", False),
    _Column("p95_ttft_s", "P95 TTFT (ms)", lambda x: f"{x * 1e3:,.1f}", False),
    _Column("p99_ttft_s", "P99 TTFT (ms)", lambda x: f"{x * 1e3:,.1f}", False),
    _Column("mean_prefill_s", "Mean prefill (ms)", lambda x: f"{x * 1e3:,.1f}", False),
    _Column("throughput_tokens_per_s", "Throughput (tok/s)", lambda x: f"{x:,.1f}", True),
)


def _summary(res: Results) -> str:
    """One row per (variant, capacity, policy), means over seeds; best per capacity bold."""
    columns = [c for c in _COLUMNS if res.has(c.metric)]
    show_variant = len(res.variants) > 1 or res.variants[0] != ""
    heads = (["Variant"] if show_variant else []) + ["Capacity", "Policy"]
    heads += [c.header for c in columns]
    out = ["<table>", "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in heads) + "</tr>"]
    stats = {c.metric: res.stat(c.metric) for c in columns}
    span = len(res.policies)
    for v in res.variants:
        for ci in range(len(res.capacities)):
            means = {
                c.metric: [stats[c.metric][(v, ci, pi)].mean for pi in range(span)] for c in columns
            }
            best = {c.metric: _best_text(c, means[c.metric]) for c in columns}
            for pi, pol in enumerate(res.policies):
                tds = ""
                if pi == 0:
                    keys = ([v] if show_variant else []) + [res.capacity_label(v, ci, False)]
                    tds = "".join(f'<td rowspan="{span}">{escape(k)}</td>' for k in keys)
                tds += f"<td>{escape(pol)}</td>"
                for c in columns:
                    text = _text(c, means[c.metric][pi])
                    if span > 1 and text == best[c.metric]:
                        text = f"<strong>{text}</strong>"
                    tds += f'<td class="num">{text}</td>'
                out.append(f'<tr class="first">{tds}</tr>' if pi == 0 else f"<tr>{tds}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _text(column: _Column, x: float) -> str:
    return "&ndash;" if math.isnan(x) else escape(column.fmt(x))


def _best_text(column: _Column, values: list[float]) -> str | None:
    """The best value as printed (so values equal as printed tie); None when all are NaN."""
    vals = [x for x in values if not math.isnan(x)]
    if not vals:
        return None
    return _text(column, max(vals) if column.higher_is_better else min(vals))


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR), so the page lays out before decoding."""
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def _figure(spec: FigureSpec) -> str:
    data = base64.b64encode(spec.png).decode("ascii")
    width, height = _png_size(spec.png)
    return (
        f'<figure id="{escape(spec.slug)}">'
        f'<img src="data:image/png;base64,{data}" alt="{escape(spec.title)}" '
        f'width="{width}" height="{height}">'
        f"<figcaption><strong>{escape(spec.title)}.</strong> {escape(spec.caption)}"
        "</figcaption></figure>"
    )


def _environment(env: Mapping[str, object]) -> str:
    if not env:
        return "<p>No environment.json.</p>"
    rows = []
    for key in sorted(env):
        value = env[key]
        if isinstance(value, dict):
            text = ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
        else:
            text = str(value)
        rows.append(f"<tr><th>{escape(key)}</th><td>{escape(text)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _timings(folder: Path) -> str:
    """Wall-clock of the cells (how long the sweep took, not a result)."""
    path = folder / "timings.csv"
    if not path.is_file():
        return "<p>No timings.csv.</p>"
    with path.open(encoding="utf-8", newline="") as fh:
        walls = [float(r["wall_s"]) for r in csv.DictReader(fh) if r.get("wall_s")]
    if not walls:
        return "<p>timings.csv lists no cells.</p>"
    items = (
        ("cells", f"{len(walls)}"),
        ("total wall seconds", f"{sum(walls):,.2f}"),
        ("mean per cell (s)", f"{sum(walls) / len(walls):,.3f}"),
        ("slowest cell (s)", f"{max(walls):,.3f}"),
    )
    rows = "".join(f'<tr><th>{k}</th><td class="num">{v}</td></tr>' for k, v in items)
    return f"<table>{rows}</table>"


def render(res: Results, figures: list[FigureSpec]) -> str:
    """The page as a string."""
    seeds = ", ".join(map(str, res.seeds))
    meta = (
        f"{res.runner} runner &middot; {len(res.policies)} policies &middot; "
        f"{len(res.capacities)} cache sizes &middot; seeds {escape(seeds)}"
    )
    if len(res.variants) > 1:
        meta += f" &middot; {len(res.variants)} workload variants"
    note = "mean over seeds" if len(res.seeds) > 1 else "one seed"
    intro = f"Per cache size and policy, {note}; the best value of each cache size in bold."
    return page(
        res.name, meta, res.folder, intro, _summary(res), figures, res.config, res.environment
    )


def page(
    name: str,
    meta: str,
    folder: Path,
    intro: str,
    summary: str,
    figures: list[FigureSpec],
    config: Mapping[str, object],
    env: Mapping[str, object],
) -> str:
    """The page skeleton every report shares: title, summary table, figures, config,
    environment and timings (``meta``, ``intro`` and ``summary`` are HTML)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(name)} &mdash; prefixlab report</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(name)}</h1>",
        f'<p class="meta">{meta}<br>from {escape(str(folder))}</p>',
        f"<h2>Summary</h2><p>{intro}</p>",
        summary,
        "<h2>Figures</h2>",
        *(_figure(f) for f in figures),
        "<h2>Configuration</h2>",
        f"<pre>{escape(json.dumps(config, indent=2, sort_keys=True))}</pre>",
        "<h2>Environment</h2>",
        _environment(env),
        "<h2>Timings</h2>",
        _timings(folder),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def build_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of an experiment's results folder (default ``FOLDER/report.html``);
    its path. (:func:`prefixlab.studies.build_report` takes a folder of any kind.)"""
    res = load_results(folder)
    target = Path(out) if out is not None else res.folder / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, render(res, make_figures(res)))
    return target


__all__ = ["build_report", "page", "render"]
