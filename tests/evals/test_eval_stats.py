"""evals.harness.stats: t-intervals from scipy, and the exact paired tests the real-model study uses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evals.harness.stats import estimate, mcnemar_exact, paired, sign_test, t95, wilcoxon_signed_rank


def test_t95_matches_the_textbook_table() -> None:
    table = {1: 12.706, 2: 4.303, 5: 2.571, 14: 2.145, 30: 2.042}
    for df, value in table.items():
        assert t95(df) == pytest.approx(value, abs=5e-4)
    assert t95(1000) == pytest.approx(1.962, abs=1e-3)
    assert math.isnan(t95(0))


def test_estimate_and_paired() -> None:
    e = estimate([0.5, 0.7, 0.6])
    assert e.mean == pytest.approx(0.6)
    assert e.half_width == pytest.approx(t95(2) * 0.1 / math.sqrt(3))
    assert math.isnan(estimate([0.4]).half_width)
    assert paired([0.1, 0.2], [0.3, 0.5]).mean == pytest.approx(0.25)
    with pytest.raises(ValueError):
        paired([0.1], [0.2, 0.3])


def _binomial_two_sided(k: int, n: int) -> float:
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 5), (3, 3), (4, 23), (10, 1), (57, 71)])
def test_mcnemar_exact_is_the_binomial_test_on_discordant_pairs(b: int, c: int) -> None:
    res = mcnemar_exact(b, c)
    assert res.n == b + c
    assert res.p_value == pytest.approx(1.0 if b + c == 0 else _binomial_two_sided(b, b + c), rel=1e-9)


def test_sign_test_drops_ties() -> None:
    a = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    b = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    res = sign_test(a, b)
    assert (res.statistic, res.n) == (6.0, 6)
    assert res.p_value == pytest.approx(2 / 64)


def test_wilcoxon_signed_rank_exact_small_sample() -> None:
    a = [0.0] * 6
    b = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]  # every difference positive: T- = 0, exact two-sided p = 2 / 2**6
    res = wilcoxon_signed_rank(a, b)
    assert res.n == 6
    assert res.statistic == 0.0
    assert res.p_value == pytest.approx(2 / 64)
    assert wilcoxon_signed_rank([1.0, 2.0], [1.0, 2.0]).p_value == 1.0


def test_json_writers_write_null_for_nan(tmp_path: Path) -> None:
    from evals.harness.jsonio import dumps, write_json

    obj = {"e": estimate([0.5]).to_dict(), "xs": [float("nan"), np.float64("inf"), 1.5], "t": (float("-inf"),)}
    path = write_json(tmp_path / "out.json", obj, indent=1)

    def refuse(constant: str) -> float:
        raise ValueError(f"non-finite constant {constant} in JSON")

    back = json.loads(path.read_text(), parse_constant=refuse)
    assert back == {"e": {"mean": 0.5, "ci95": None, "n": 1}, "xs": [None, None, 1.5], "t": [None]}
    assert dumps({"a": 1.0}) == '{"a": 1.0}'
