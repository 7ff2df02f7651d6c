"""Study kinds: what a config file and its results folder are, and how each is reported.

A study kind names its config model (validated by :mod:`prefixlab.configfile`), tells its
results folders apart (``config.resolved.json``'s ``kind``), and says how to write their
report and figures. The command line (``prefixlab schema``, ``report``, ``plot``) and
library callers go through :func:`build_report` and :func:`write_plots` here, so the
report layer (:mod:`prefixlab.report`) and each kind's own module never import each other.

========== ======================================== ========================================
kind       config                                   results, report
========== ======================================== ========================================
experiment :class:`~prefixlab.experiments.config.   :mod:`prefixlab.experiments`,
           ExperimentConfig` (prefix, hybrid cache) :mod:`prefixlab.report`
experts    :class:`~prefixlab.experts.config.       :mod:`prefixlab.experts.sweep`,
           ExpertSweepConfig` (MoE expert cache)    :mod:`prefixlab.experts.report`
========== ======================================== ========================================
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prefixlab.configfile import ConfigModel
from prefixlab.errors import ConfigError
from prefixlab.report.plots import FigureSpec, write_figures


@dataclass(frozen=True, slots=True)
class StudyKind:
    """One kind of study: its config model, and its results folder's report and figures."""

    name: str
    #: what the kind studies (``prefixlab schema`` lists it)
    about: str
    config: type[ConfigModel]
    #: the self-contained HTML page of a results folder (default ``FOLDER/report.html``)
    report: Callable[[Path, Path | None], Path]
    #: every figure that applies to a results folder, in order
    figures: Callable[[Path], Iterable[FigureSpec]]


def _experiment() -> StudyKind:
    from prefixlab.experiments.config import ExperimentConfig
    from prefixlab.report.html import build_report
    from prefixlab.report.plots import make_figures

    return StudyKind(
        "experiment",
        "prefix or hybrid cache policies on a workload",
        ExperimentConfig,
        build_report,
        make_figures,
    )


def _experts() -> StudyKind:
    from prefixlab.experts.config import ExpertSweepConfig
    from prefixlab.experts.report import build_expert_report, load_expert_results
    from prefixlab.experts.report import make_expert_figures as figures

    return StudyKind(
        "experts",
        "MoE expert cache policies on routing traces",
        ExpertSweepConfig,
        build_expert_report,
        lambda folder: figures(load_expert_results(folder)),
    )


_KINDS: dict[str, Callable[[], StudyKind]] = {"experiment": _experiment, "experts": _experts}


def kinds() -> dict[str, StudyKind]:
    """Every study kind, by name (its modules imported on first use)."""
    return {name: make() for name, make in _KINDS.items()}


def get_kind(name: str) -> StudyKind:
    """The study kind ``name``; an unknown one is a one-line error listing the known."""
    if name not in _KINDS:
        raise ConfigError(f"unknown config kind {name!r}; known: {', '.join(_KINDS)}")
    return _KINDS[name]()


def config_kind(data: object) -> str:
    """The kind a config file declares (``kind = "..."``) or, without one, the one its
    workload table says: ``trace`` (a routing trace) for ``experts``, else ``experiment``."""
    if isinstance(data, dict):
        kind = data.get("kind")
        if isinstance(kind, str):
            return get_kind(kind).name
        workload = data.get("workload")
        if isinstance(workload, dict) and "trace" in workload and "source" not in workload:
            return "experts"
    return "experiment"


def kind_of(folder: str | Path) -> StudyKind:
    """The kind of a results folder (or of the folder holding a file given), from its
    ``config.resolved.json`` (``kind``; folders of prefix-cache experiments have none)."""
    f = Path(folder)
    if f.is_file():
        f = f.parent
    path = f / "config.resolved.json"
    name = "experiment"
    if path.is_file():
        try:
            name = str(json.loads(path.read_text(encoding="utf-8")).get("kind", name))
        except (OSError, json.JSONDecodeError, AttributeError):
            name = "experiment"  # the kind's own loader says what is wrong with the folder
    return get_kind(name)


def build_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a results folder of any kind; its path."""
    return kind_of(folder).report(Path(folder), None if out is None else Path(out))


def write_plots(folder: str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``<slug>.png`` for every figure of a results folder of any kind into
    ``out_dir`` (created); their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_figures(kind_of(folder).figures(Path(folder)), out)
