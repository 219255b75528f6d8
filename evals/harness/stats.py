"""Means with 95% t-intervals over seeds, and paired differences (reference design §9)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# two-sided 95% critical values of Student's t, df = 1..30 (beyond: normal approximation)
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(df: int) -> float:
    if df <= 0:
        return math.nan
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass(frozen=True)
class Estimate:
    mean: float
    half_width: float  # 95% t-interval half width (nan with one sample)
    n: int

    def fmt(self, scale: float = 100.0, digits: int = 1) -> str:
        if math.isnan(self.half_width):
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.half_width * scale:.{digits}f}"

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "ci95": self.half_width, "n": self.n}


def estimate(xs: Sequence[float]) -> Estimate:
    n = len(xs)
    if n == 0:
        return Estimate(math.nan, math.nan, 0)
    mean = sum(xs) / n
    if n == 1:
        return Estimate(mean, math.nan, 1)
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return Estimate(mean, t95(n - 1) * math.sqrt(var / n), n)


def paired(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Estimate of mean(b - a) over paired samples (same seeds)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    return estimate([y - x for x, y in zip(a, b, strict=True)])
