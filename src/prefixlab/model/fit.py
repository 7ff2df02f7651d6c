"""Fit the power-law prefill model ``t = a * BS^b * L^c`` to measured timings.

Least squares on logs (``log t = log a + b log BS + c log L``), as the UniCache paper fits
its presets. The input CSV has ``input_tokens`` and ``ttft_s`` columns and optionally
``batch_size`` (default 1). With a single batch size, ``b`` cannot be identified and is
reported as 1.0 (fixed). R^2 is reported on the seconds themselves and on their logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.model._csv import read_csv


@dataclass(frozen=True, slots=True)
class PowerFit:
    a: float
    b: float
    c: float
    r2: float
    r2_log: float
    num_points: int
    b_fixed: bool

    def spec(self) -> str:
        return f"power:a={self.a:.6g},b={self.b:.6g},c={self.c:.6g}"


def fit_power_law(batch_size: np.ndarray, tokens: np.ndarray, seconds: np.ndarray) -> PowerFit:
    """Fit ``seconds = a * batch_size^b * tokens^c`` by least squares on logs."""
    bs = np.asarray(batch_size, dtype=np.float64)
    n = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if not (bs.shape == n.shape == t.shape) or t.shape[0] < 2:
        raise ConfigError("a power-law fit needs at least 2 points of equal-length columns")
    if not (np.isfinite(bs).all() and np.isfinite(n).all() and np.isfinite(t).all()):
        raise ConfigError("a power-law fit needs finite batch sizes, tokens and seconds")
    if (bs <= 0).any() or (n <= 0).any() or (t <= 0).any():
        raise ConfigError("a power-law fit needs positive batch sizes, tokens and seconds")
    b_fixed = np.unique(bs).shape[0] == 1
    if np.unique(n).shape[0] < 2:
        raise ConfigError("a power-law fit needs at least 2 distinct input lengths")
    y = np.log(t)
    cols = [np.ones_like(y), np.log(n)] if b_fixed else [np.ones_like(y), np.log(bs), np.log(n)]
    x = np.column_stack(cols)
    target = y - np.log(bs) if b_fixed else y  # b fixed at 1
    coef, _, rank, _ = np.linalg.lstsq(x, target, rcond=None)
    if rank < x.shape[1]:
        raise ConfigError(
            "batch size and input length vary together in the data: b and c cannot be told "
            "apart; measure several lengths at each batch size"
        )
    if b_fixed:
        log_a, c = coef
        b = 1.0
    else:
        log_a, b, c = coef
    a = float(np.exp(log_a))
    pred = a * bs**b * n**c
    return PowerFit(
        a=a,
        b=float(b),
        c=float(c),
        r2=_r2(t, pred),
        r2_log=_r2(y, np.log(pred)),
        num_points=int(t.shape[0]),
        b_fixed=bool(b_fixed),
    )


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def fit_csv(path: str | Path) -> PowerFit:
    """Read ``input_tokens``, ``ttft_s`` (and ``batch_size``) from a CSV and fit."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"timing CSV not found: {p}")
    rows: list[tuple[float, float, float]] = []
    reader = read_csv(p)
    names = reader.fieldnames or []
    for col in ("input_tokens", "ttft_s"):
        if col not in names:
            raise TraceFormatError(str(p), 1, col, "column missing")
    for lineno, row in enumerate(reader, start=2):
        values = []
        for col in ("batch_size", "input_tokens", "ttft_s"):
            raw = row.get(col) if col in names else "1"
            try:
                v = float(raw) if raw is not None else float("nan")
            except ValueError:
                raise TraceFormatError(
                    str(p), lineno, col, f"expected a number, got {raw!r}"
                ) from None
            if not np.isfinite(v) or v <= 0:
                raise TraceFormatError(str(p), lineno, col, f"must be > 0, got {raw!r}")
            values.append(v)
        rows.append((values[0], values[1], values[2]))
    if len(rows) < 2:
        raise TraceFormatError(str(p), None, None, "need at least 2 rows to fit")
    arr = np.array(rows)
    return fit_power_law(arr[:, 0], arr[:, 1], arr[:, 2])
