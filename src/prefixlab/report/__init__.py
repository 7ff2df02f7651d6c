"""The report layer: figures and a self-contained HTML page from a saved results folder.

::

    from prefixlab.report import build_report, write_plots
    build_report("results/exp1")              # results/exp1/report.html
    write_plots("results/exp1", "figs")       # figs/hit_vs_capacity.png, ...

These take an experiment's results folder; :mod:`prefixlab.studies` has the same two for a
results folder of any study kind (an expert-cache sweep's too).
"""

from __future__ import annotations

from prefixlab.report.html import build_report
from prefixlab.report.plots import (
    FigureSpec,
    Results,
    load_results,
    make_figures,
    size_for_target,
    write_plots,
)

__all__ = [
    "FigureSpec",
    "Results",
    "build_report",
    "load_results",
    "make_figures",
    "size_for_target",
    "write_plots",
]
