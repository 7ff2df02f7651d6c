"""Study kinds: what a config file and its results folder are, how a config becomes cells,
and how each kind's results are summed up and reported.

A study kind names its config model (validated by :mod:`prefixlab.configfile`), turns a
config into a :class:`~prefixlab.experiments.study.Study` (its cells, run by the one engine,
:func:`~prefixlab.experiments.study.run_study`), tells its results folders apart
(``config.resolved.json``'s ``kind``), and says what their summary table, report and
figures are. The command line (``prefixlab sweep``, ``schema``, ``report``, ``plot``) and
library callers go through this registry, so they name no kind, and the report layer
(:mod:`prefixlab.report`) and each kind's own module never import each other. A new kind
(a fleet of replicas, say) is one :func:`register_kind` call.

========== ======================================== ========================================
kind       config                                   study, summary, report
========== ======================================== ========================================
experiment :class:`~prefixlab.experiments.config.   :mod:`prefixlab.experiments.sweep`,
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
from typing import cast

from prefixlab.configfile import ConfigModel
from prefixlab.errors import ConfigError
from prefixlab.experiments.store import CellStore
from prefixlab.experiments.study import Study, StudyCell
from prefixlab.experiments.summary import Summary
from prefixlab.report.plots import FigureSpec, write_figures

#: a study of any kind
AnyStudy = Study[StudyCell, object, CellStore]


@dataclass(frozen=True, slots=True)
class StudyKind:
    """One kind of study: its config model, how a config becomes a study of cells (run by
    :func:`prefixlab.experiments.study.run_study`, as every kind), and its results
    folder's summary table, report and figures."""

    name: str
    #: what the kind studies (``prefixlab schema`` lists it)
    about: str
    config: type[ConfigModel]
    #: a config file's data (validated, with the kind's own rules) named after its file
    load: Callable[[object, str], ConfigModel]
    #: the study of a config; the flag asks for per-request detail (a one-line error for a
    #: kind without it)
    study: Callable[[ConfigModel, bool], AnyStudy]
    #: the answer of a results folder, mean and spread over seeds
    summary: Callable[[Path], Summary]
    #: the self-contained HTML page of a results folder (default ``FOLDER/report.html``)
    report: Callable[[Path, Path | None], Path]
    #: every figure that applies to a results folder, in order
    figures: Callable[[Path], Iterable[FigureSpec]]


def _experiment() -> StudyKind:
    from prefixlab.experiments.config import ExperimentConfig, parse_config
    from prefixlab.experiments.summary import experiment_summary
    from prefixlab.experiments.sweep import ExperimentStudy
    from prefixlab.report.html import build_report
    from prefixlab.report.plots import make_figures

    def study(cfg: ConfigModel, detail: bool) -> AnyStudy:
        assert isinstance(cfg, ExperimentConfig)
        return cast(AnyStudy, ExperimentStudy(cfg, detail))

    return StudyKind(
        "experiment",
        "prefix or hybrid cache policies on a workload",
        ExperimentConfig,
        lambda data, name: parse_config(data if data is not None else {}, name=name),
        study,
        experiment_summary,
        build_report,
        make_figures,
    )


def _experts() -> StudyKind:
    from prefixlab.experts.config import ExpertSweepConfig, parse_sweep_config
    from prefixlab.experts.report import build_expert_report, expert_summary, load_expert_results
    from prefixlab.experts.report import make_expert_figures as figures
    from prefixlab.experts.sweep import ExpertStudy

    def study(cfg: ConfigModel, detail: bool) -> AnyStudy:
        assert isinstance(cfg, ExpertSweepConfig)
        if detail:
            raise ConfigError("--detail: an experts study has no per-request rows")
        return cast(AnyStudy, ExpertStudy(cfg))

    return StudyKind(
        "experts",
        "MoE expert cache policies on routing traces",
        ExpertSweepConfig,
        lambda data, name: parse_sweep_config(data, name=name),
        study,
        expert_summary,
        build_expert_report,
        lambda folder: figures(load_expert_results(folder)),
    )


_KINDS: dict[str, Callable[[], StudyKind]] = {"experiment": _experiment, "experts": _experts}


def register_kind(name: str, make: Callable[[], StudyKind]) -> None:
    """Add a study kind (``make`` builds it on first use, importing its modules then);
    ``prefixlab sweep``, ``report``, ``plot`` and ``schema`` then serve it."""
    if name in _KINDS:
        raise ConfigError(f"study kind {name!r} is registered already")
    _KINDS[name] = make


def kinds() -> dict[str, StudyKind]:
    """Every study kind, by name (its modules imported on first use)."""
    return {name: make() for name, make in _KINDS.items()}


def get_kind(name: str) -> StudyKind:
    """The study kind ``name``; an unknown one is a one-line error listing the known."""
    if name not in _KINDS:
        raise ConfigError(f"unknown config kind {name!r}; known: {', '.join(_KINDS)}")
    return _KINDS[name]()


def kind_for(config: ConfigModel) -> StudyKind:
    """The study kind whose config model ``config`` is."""
    for kind in kinds().values():
        if isinstance(config, kind.config):
            return kind
    raise ConfigError(f"no study kind has configs of type {type(config).__name__}")


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


def summary(folder: str | Path) -> Summary:
    """The summary table of a results folder of any kind."""
    return kind_of(folder).summary(Path(folder))


def build_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a results folder of any kind; its path."""
    return kind_of(folder).report(Path(folder), None if out is None else Path(out))


def write_plots(folder: str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``<slug>.png`` for every figure of a results folder of any kind into
    ``out_dir`` (created); their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_figures(kind_of(folder).figures(Path(folder)), out)
