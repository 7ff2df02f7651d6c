"""Inter-turn gaps of sessions and their log-normal fit (the CDF is
:func:`prefixlab.workload.arrivals.lognormal_cdf`), and the task labels they share.

A session's gaps are the arrival of its (k+1)-th request minus the arrival of its k-th, its
requests sorted by arrival. Traces carry arrivals only, so a gap is the previous turn's
service time plus the user's think time. A gap belongs to the task of the later request
(a null task is the task ``"(none)"``). The fit is the maximum-likelihood log-normal of the
positive gaps: ``mu`` and ``sigma`` are the mean and population standard deviation of their
logarithms; zero gaps (turns sent at once) are counted apart. The CDF uses ``math.erf``, so
scipy is not needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prefixlab.types import F64, I64
from prefixlab.workload.arrivals import lognormal_cdf, previous_turn_gaps, session_order
from prefixlab.workload.trace import Trace

NO_TASK = "(none)"
_Z90 = 1.2815515655446004  # the standard normal quantile of 0.9


@dataclass(slots=True, frozen=True)
class GapFit:
    """Inter-turn gaps of one task and their log-normal fit (None below two positive gaps)."""

    num_gaps: int  # positive gaps: the fit's sample
    num_zero_gaps: int
    mu: float | None
    sigma: float | None
    median_s: float | None
    p90_s: float | None
    ks_distance: float | None
    #: the positive gaps, sorted (for the CDF plot; not in ``as_dict``)
    gaps_s: F64 = field(repr=False, compare=False)

    @property
    def fit_median_s(self) -> float | None:
        return None if self.mu is None else math.exp(self.mu)

    @property
    def fit_p90_s(self) -> float | None:
        if self.mu is None or self.sigma is None:
            return None
        return math.exp(self.mu + _Z90 * self.sigma)

    def as_dict(self) -> dict[str, int | float | None]:
        return {
            "num_gaps": self.num_gaps,
            "num_zero_gaps": self.num_zero_gaps,
            "mu": self.mu,
            "sigma": self.sigma,
            "median_s": self.median_s,
            "p90_s": self.p90_s,
            "fit_median_s": self.fit_median_s,
            "fit_p90_s": self.fit_p90_s,
            "ks_distance": self.ks_distance,
        }


def label_codes(labels: list[str | None], none_label: str | None) -> tuple[I64, list[str]]:
    """Dense codes of string labels; None -> ``none_label``'s code, or -1 if none_label is None."""
    names: dict[str, int] = {}
    codes = []
    for label in labels:
        name = none_label if label is None else label
        codes.append(-1 if name is None else names.setdefault(name, len(names)))
    return np.asarray(codes, dtype=np.int64), list(names)


def task_groups(trace: Trace) -> tuple[I64, list[str]]:
    """Task code per request, and the group names: sorted tasks, ``(none)`` last."""
    codes, names = label_codes(trace.task, NO_TASK)
    order = sorted(range(len(names)), key=lambda i: (names[i] == NO_TASK, names[i]))
    remap = np.empty(max(len(names), 1), dtype=np.int64)
    remap[order] = np.arange(len(order))
    return remap[codes], [names[i] for i in order]


def session_gaps(trace: Trace) -> dict[str, F64]:
    """Inter-turn gaps (s) per task of the later request, for every multi-request session."""
    task, names = task_groups(trace)
    rows, same = session_order(trace.session_id, trace.arrival_s)
    gaps = previous_turn_gaps(trace.session_id, trace.arrival_s)[rows[1:][same]]
    later_task = task[rows][1:][same]
    return {n: gaps[later_task == i] for i, n in enumerate(names) if (later_task == i).any()}


def fit_lognormal(gaps_s: F64) -> GapFit:
    """MLE log-normal fit of the positive gaps; empirical median, p90 and KS distance."""
    gaps = np.asarray(gaps_s, dtype=np.float64)
    pos = np.sort(gaps[gaps > 0])
    n = int(pos.shape[0])
    if n < 2:
        return GapFit(n, int((gaps <= 0).sum()), None, None, None, None, None, pos)
    logs = np.log(pos)
    mu, sigma = float(logs.mean()), float(logs.std())
    fitted = lognormal_cdf(pos, mu, sigma)
    # The empirical CDF jumps at each gap: compare the fit with it just before and at it.
    before = np.searchsorted(pos, pos, side="left") / n
    at = np.searchsorted(pos, pos, side="right") / n
    ks = float(max(np.max(np.abs(at - fitted)), np.max(np.abs(before - fitted))))
    return GapFit(
        num_gaps=n,
        num_zero_gaps=int((gaps <= 0).sum()),
        mu=mu,
        sigma=sigma,
        median_s=float(np.median(pos)),
        p90_s=float(np.percentile(pos, 90)),
        ks_distance=ks,
        gaps_s=pos,
    )


__all__ = [
    "NO_TASK",
    "GapFit",
    "fit_lognormal",
    "label_codes",
    "lognormal_cdf",
    "session_gaps",
    "task_groups",
]
