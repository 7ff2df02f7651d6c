"""What a reproduction is, and how its outputs are written.

A reproduction reruns one headline table or figure of a paper in ``../shared/papers/`` with
that paper's setup, and sets our numbers beside the paper's::

    run(scale) -> Outcome ──► <out>/<name>/table.csv, table.md    (our numbers)
                          ├─► <out>/<name>/figure.png             (drawn like the paper's)
                          └─► <out>/<name>/claims.csv, claims.md  (the paper's beside ours)

``scale`` is ``"ci"`` (seconds; the table is compared with a checked-in copy in CI) or
``"paper"`` (the paper's size; its outputs are checked in under ``docs/reproductions/``).
Numbers in tables are rounded when written (:data:`DIGITS`), so the files are the same
bytes on every run with the same inputs and seeds.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from prefixlab.errors import ConfigError
from prefixlab.io import atomic_write
from prefixlab.registry import Registry

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Scale = Literal["ci", "paper"]
SCALES: tuple[Scale, ...] = ("ci", "paper")
Cell = str | int | float | None
Row = dict[str, Cell]
#: significant digits of floats in written tables
DIGITS = 6
VERDICTS = ("agree", "differ", "n/a")


@dataclass(frozen=True, slots=True)
class Claim:
    """One of the paper's numbers beside ours.

    Args:
        what: the quantity ("LLRU faults / LRU faults, Llama-MoE, k = 200").
        where: where the paper says it ("Sec. 5, Fig. 5").
        paper: the paper's number or words, quoted.
        ours: our number at this scale.
        verdict: ``agree``, ``differ`` or ``n/a`` (the paper gives no number to compare).
        why: the reason for a difference, or what makes it agree; never empty on ``differ``.
    """

    what: str
    where: str
    paper: str
    ours: str
    verdict: str
    why: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.verdict == "differ" and not self.why:
            raise ValueError(f"claim '{self.what}': a difference needs its reason")


@dataclass(slots=True)
class Outcome:
    """A finished reproduction: its table, the paper's claims beside ours, its figure."""

    table: list[Row]
    claims: list[Claim]
    #: draws the figure (on a fresh Figure) from ``table``
    figure: Callable[[Figure, list[Row]], None] | None = None
    #: the setup in a few lines (what is synthetic, what was chosen where the paper is silent)
    notes: list[str] = field(default_factory=list)


class Reproduction:
    """Base class: a reproduction of one table or figure. Subclasses set the class
    attributes and implement :meth:`run`; registration is by :func:`register`."""

    name: ClassVar[str] = "base"
    #: the paper's file in ``../shared/papers/``
    paper: ClassVar[str] = ""
    #: the table or figure reproduced ("Fig. 5")
    target: ClassVar[str] = ""
    title: ClassVar[str] = ""

    def run(self, scale: Scale) -> Outcome:
        raise NotImplementedError


_REGISTRY: Registry[type[Reproduction]] = Registry(
    "reproduction", "prefixlab.reproduce.builtin", "prefixlab.reproductions"
)


def register(name: str) -> Callable[[type[Reproduction]], type[Reproduction]]:
    """Class decorator: register a reproduction under a stable name."""
    return _REGISTRY.register(name)


def reproductions() -> dict[str, type[Reproduction]]:
    """Every registered reproduction, sorted by name."""
    return _REGISTRY.all()


def get_reproduction(name: str) -> Reproduction:
    known = reproductions()
    if name not in known:
        raise ConfigError(f"unknown reproduction '{name}'; known: {', '.join(known)}")
    return known[name]()


def num(value: Cell) -> float:
    """A numeric table cell as a float (a missing or text cell is a bug here)."""
    if value is None or isinstance(value, str):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def check_scale(scale: str) -> Scale:
    if scale not in SCALES:
        raise ConfigError(f"scale must be one of {', '.join(SCALES)}, got '{scale}'")
    return "ci" if scale == "ci" else "paper"


# ------------------------------------------------------------------ writing
def fmt_cell(value: Cell) -> str:
    """A table cell as written: floats to :data:`DIGITS` significant digits."""
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0.0 or math.isinf(value):
            return repr(value)
        return f"{value:.{DIGITS}g}"
    return str(value)


def columns_of(rows: Sequence[Row]) -> list[str]:
    """Column names in first-seen order."""
    out: dict[str, None] = {}
    for row in rows:
        out.update(dict.fromkeys(row))
    return list(out)


def to_csv(rows: Sequence[Row]) -> str:
    cols = columns_of(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for row in rows:
        w.writerow([fmt_cell(row.get(c)) for c in cols])
    return buf.getvalue()


def to_markdown(rows: Sequence[Row]) -> str:
    cols = columns_of(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [fmt_cell(row.get(c)).replace("|", "\\|") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def claim_rows(claims: Sequence[Claim]) -> list[Row]:
    return [
        {
            "what": c.what,
            "where": c.where,
            "paper": c.paper,
            "ours": c.ours,
            "verdict": c.verdict,
            "why": c.why,
        }
        for c in claims
    ]


def figure_png(draw: Callable[[Figure, list[Row]], None], rows: list[Row]) -> bytes:
    """The figure as PNG bytes (fixed size and dpi, no software stamp: same bytes each run)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.5), dpi=100, layout="constrained")
    draw(fig, rows)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def write_outcome(rep: Reproduction, outcome: Outcome, scale: Scale, out: Path) -> list[Path]:
    """Write the table (CSV, Markdown), the claims (CSV, Markdown) and the figure."""
    folder = out / rep.name
    folder.mkdir(parents=True, exist_ok=True)
    header = (
        f"# {rep.title}\n\n{rep.paper}, {rep.target}; scale `{scale}` "
        f"(`prefixlab reproduce {rep.name} --scale {scale}`).\n\n"
    )
    notes = "".join(f"- {n}\n" for n in outcome.notes)
    files: dict[str, bytes] = {
        "table.csv": to_csv(outcome.table).encode(),
        "claims.csv": to_csv(claim_rows(outcome.claims)).encode(),
        "table.md": (header + notes + "\n" + to_markdown(outcome.table)).encode(),
        "claims.md": (header + to_markdown(claim_rows(outcome.claims))).encode(),
    }
    if outcome.figure is not None:
        files["figure.png"] = figure_png(outcome.figure, outcome.table)
    written = []
    for fname, data in files.items():
        atomic_write(folder / fname, data)
        written.append(folder / fname)
    return written
