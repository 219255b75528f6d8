"""Estimates and tests of the evaluations (reference design §9): means with 95% t-intervals over seeds,
paired differences, and exact paired tests for per-task outcomes.

* :func:`estimate` / :func:`paired`: mean and two-sided 95% Student-t half width (``scipy.stats.t``);
* :func:`sign_test`: exact two-sided sign test on paired differences (ties dropped);
* :func:`mcnemar_exact`: exact McNemar test on the discordant pairs of two paired binary outcomes;
* :func:`wilcoxon_signed_rank`: Wilcoxon signed-rank test on paired differences (exact for small samples).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _sp


def t95(df: int) -> float:
    """Two-sided 95% critical value of Student's t with ``df`` degrees of freedom (nan when df <= 0)."""
    if df <= 0:
        return math.nan
    return float(_sp.t.ppf(0.975, df))


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
    """Mean of ``xs`` with its 95% t-interval half width (nan for one sample; nan mean for none)."""
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


@dataclass(frozen=True)
class PairedTest:
    """Result of a paired test: the statistic, the two-sided p-value and how many pairs counted."""

    statistic: float
    p_value: float
    n: int  # pairs that entered the test (non-zero differences, or discordant pairs)

    def to_dict(self) -> dict[str, float | int]:
        return {"statistic": self.statistic, "p": self.p_value, "n": self.n}


def _binomial_two_sided(k: int, n: int) -> float:
    """Exact two-sided binomial p-value of ``k`` successes in ``n`` fair trials (1.0 when n = 0)."""
    if n == 0:
        return 1.0
    return float(_sp.binomtest(k, n, 0.5, alternative="two-sided").pvalue)


def mcnemar_exact(b: int, c: int) -> PairedTest:
    """Exact McNemar test: ``b`` pairs where only the first outcome succeeded, ``c`` where only the second did.

    Concordant pairs carry no information; under the null each discordant pair goes either way with
    probability 1/2, so the p-value is the two-sided binomial one of min(b, c) in b + c trials.
    The statistic is ``b`` (the count of the first kind).
    """
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be >= 0")
    return PairedTest(float(b), _binomial_two_sided(min(b, c), b + c), b + c)


def sign_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """Exact two-sided sign test of paired samples: do the differences ``b - a`` tend to one side?

    Zero differences are dropped. The statistic is the number of positive differences.
    """
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    pos = sum(d > 0 for d in diffs)
    neg = sum(d < 0 for d in diffs)
    return PairedTest(float(pos), _binomial_two_sided(min(pos, neg), pos + neg), pos + neg)


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """Two-sided Wilcoxon signed-rank test of the paired differences ``b - a`` (zero differences dropped).

    scipy chooses the exact null distribution for small samples without ties and the normal
    approximation otherwise. With no non-zero difference the p-value is 1.0.
    """
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    diffs = [y - x for x, y in zip(a, b, strict=True) if y != x]
    if not diffs:
        return PairedTest(0.0, 1.0, 0)
    res = _sp.wilcoxon(diffs, zero_method="wilcox", alternative="two-sided")
    return PairedTest(float(res.statistic), float(res.pvalue), len(diffs))
