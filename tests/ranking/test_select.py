"""Cost-aware selection: the exact knapsack against brute force, and the rules of ``select``."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent.ranking.select import EXACT_BUDGET_LIMIT, knapsack, select


def brute_force(values: list[float], weights: list[int], budget: int, max_items: int) -> float:
    best = 0.0
    n = len(values)
    for size in range(0, min(max_items, n) + 1):
        for combo in itertools.combinations(range(n), size):
            if sum(weights[i] for i in combo) <= budget:
                best = max(best, sum(values[i] for i in combo))
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[float], list[int], int, int]:
    n = draw(st.integers(0, 10))
    values = draw(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=n, max_size=n))
    weights = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    budget = draw(st.integers(0, 60))
    max_items = draw(st.integers(0, 11))
    return values, weights, budget, max_items


@settings(max_examples=400, deadline=None)
@given(instances())
def test_knapsack_matches_brute_force(inst: tuple[list[float], list[int], int, int]) -> None:
    values, weights, budget, max_items = inst
    chosen = knapsack(np.array(values, dtype=np.float64), np.array(weights, dtype=np.int64), budget, max_items)
    assert len(set(chosen)) == len(chosen)
    assert chosen == sorted(chosen)
    assert all(0 <= i < len(values) for i in chosen)
    assert len(chosen) <= max_items
    assert sum(weights[i] for i in chosen) <= budget
    assert all(values[i] > 0 for i in chosen)  # non-positive values are never taken
    got = sum(values[i] for i in chosen)
    assert abs(got - brute_force(values, weights, budget, max_items)) <= 1e-9


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 1.0, allow_nan=False), st.integers(0, 3000)), min_size=0, max_size=10),
    st.integers(EXACT_BUDGET_LIMIT + 1, 30_000),
    st.integers(0, 10),
)
def test_knapsack_coarse_grid_is_feasible(items: list[tuple[float, int]], budget: int, max_items: int) -> None:
    values = np.array([v for v, _ in items], dtype=np.float64)
    weights = np.array([w for _, w in items], dtype=np.int64)
    chosen = knapsack(values, weights, budget, max_items)
    assert int(weights[chosen].sum()) <= budget
    assert len(chosen) <= max_items
    if sum(int(w) for w in weights) <= budget // 2 and max_items >= len(items):
        # plenty of room even after rounding weights up: every positive item fits (value within 1e-9)
        assert abs(float(values[chosen].sum()) - float(values[values > 0].sum())) <= 1e-9


def test_knapsack_edge_cases() -> None:
    v = np.array([0.5, 0.4])
    w = np.array([3, 3], dtype=np.int64)
    assert knapsack(np.array([]), np.array([], dtype=np.int64), 10, 3) == []
    assert knapsack(v, w, -1, 3) == []
    assert knapsack(v, w, 10, 0) == []
    assert knapsack(v, w, 2, 3) == []  # nothing fits
    assert knapsack(v, w, 5, 3) == [0]
    assert knapsack(np.array([0.0, -1.0]), w, 10, 2) == []
    assert knapsack(np.array([0.3, 0.3]), np.array([0, 0], dtype=np.int64), 0, 2) == [0, 1]  # free items
    # the count limit binds: two light items beat one heavy, but only one may be taken
    assert knapsack(np.array([0.6, 0.5, 0.5]), np.array([10, 1, 1], dtype=np.int64), 10, 1) == [0]
    assert knapsack(np.array([0.6, 0.5, 0.5]), np.array([10, 1, 1], dtype=np.int64), 10, 2) == [1, 2]


# -- select ----------------------------------------------------------------------------------------
def _arr(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float64)


def _tok(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def test_p_floor_drops_low_p() -> None:
    p = _arr(0.9, 0.05, 0.6, 0.1)
    sim = _arr(0.5, 0.4, 0.3, 0.2)
    out = select(p, sim, _tok(1, 1, 1, 1), k=5, p_floor=0.1)
    assert out == [0, 2, 3]  # 0.1 is at the floor, so it stays
    out = select(p, sim, _tok(1, 1, 1, 1), k=5, token_budget=100, p_floor=0.2)
    assert out == [0, 2]


def test_guard_forces_most_similar_unless_exempt() -> None:
    p = _arr(0.9, 0.8, 0.7, 0.01)
    sim = _arr(0.1, 0.2, 0.3, 0.99)
    tokens = _tok(5, 5, 5, 5)
    assert select(p, sim, tokens, k=2) == [0, 1]
    # the most similar memory is served despite its low p (and despite the floor)
    assert select(p, sim, tokens, k=2, guard_top=1, p_floor=0.5) == [0, 3]
    assert select(p, sim, tokens, k=2, guard_top=1, token_budget=10) == [0, 3]
    exempt = np.array([False, False, False, True])
    assert select(p, sim, tokens, k=2, guard_top=1, guard_exempt=exempt) == [0, 1]
    assert select(p, sim, tokens, k=2, guard_top=1, guard_exempt=exempt, token_budget=10) == [0, 1]
    # guard_top=2 forces the two most similar (3 and 2); exempting 3 forces only 2
    assert select(p, sim, tokens, k=2, guard_top=2) == [2, 3]
    assert select(p, sim, tokens, k=3, guard_top=2, guard_exempt=exempt) == [0, 1, 2]


def test_guarded_item_that_cannot_fit_is_skipped() -> None:
    p = _arr(0.9, 0.2)
    sim = _arr(0.1, 0.9)
    out = select(p, sim, _tok(3, 50), k=2, guard_top=1, token_budget=10)
    assert out == [0]


def test_budget_above_exact_limit_is_feasible() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = 30
        p = rng.random(n)
        sim = rng.random(n)
        tokens = rng.integers(100, 3000, size=n).astype(np.int64)
        budget = int(rng.integers(EXACT_BUDGET_LIMIT + 1, 20_000))
        out = select(p, sim, tokens, k=8, token_budget=budget, guard_top=2)
        assert int(tokens[out].sum()) <= budget
        assert 0 < len(out) <= 8


def test_k_respected_and_sorted_by_p() -> None:
    rng = np.random.default_rng(3)
    for budget in (None, 0, 5, 40, 200):
        for guard_top in (0, 1, 3, 10):
            for k in (1, 2, 5, 12):
                p = rng.random(12)
                sim = rng.random(12)
                tokens = rng.integers(0, 15, size=12).astype(np.int64)
                out = select(p, sim, tokens, k=k, token_budget=budget, guard_top=guard_top)
                assert len(out) <= k
                assert len(set(out)) == len(out)
                assert list(p[out]) == sorted(p[out], reverse=True)
                if budget is not None:
                    assert int(tokens[out].sum()) <= budget
                else:
                    assert len(out) == k


def test_empty_pool_and_zero_k() -> None:
    assert select(_arr(), _arr(), _tok(), k=3) == []
    assert select(_arr(0.5), _arr(0.5), _tok(1), k=0) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0, allow_nan=False), st.floats(-1.0, 1.0, allow_nan=False), st.integers(0, 20)),
        min_size=0,
        max_size=10,
    ),
    st.integers(1, 6),
    st.one_of(st.none(), st.integers(0, 60)),
    st.floats(0.0, 1.0, allow_nan=False),
    st.integers(0, 4),
    st.lists(st.booleans(), min_size=10, max_size=10),
)
def test_select_properties(
    items: list[tuple[float, float, int]],
    k: int,
    budget: int | None,
    p_floor: float,
    guard_top: int,
    exempt_flags: list[bool],
) -> None:
    n = len(items)
    p = np.array([it[0] for it in items], dtype=np.float64)
    sim = np.array([it[1] for it in items], dtype=np.float64)
    tokens = np.array([it[2] for it in items], dtype=np.int64)
    exempt = np.array(exempt_flags[:n], dtype=bool)
    out = select(p, sim, tokens, k=k, token_budget=budget, p_floor=p_floor, guard_top=guard_top, guard_exempt=exempt)
    assert len(out) <= k and len(set(out)) == len(out)
    if budget is not None:
        assert int(tokens[out].sum()) <= budget
    assert list(p[out]) == sorted(p[out], reverse=True)
    guarded = [int(i) for i in np.argsort(-sim, kind="stable")[:guard_top] if not exempt[i]]
    for i in out:  # anything below the floor got in only through the guard
        assert p[i] >= p_floor or i in guarded
    if budget is None:  # without a budget, forced items come first (up to k)
        assert set(guarded[:k]) <= set(out)


def test_greedy_fills_the_budget_in_rank_order() -> None:
    p = np.array([0.9, 0.8, 0.7, 0.6])
    tokens = np.array([30, 30, 10, 10], dtype=np.int64)
    sims = p.copy()
    assert select(p, sims, tokens, k=4, token_budget=45, method="greedy") == [0, 2]
    # the knapsack instead maximises summed utility: 0.8 + 0.7 + ... ; both stay within the budget
    knap = select(p, sims, tokens, k=4, token_budget=45)
    assert sum(tokens[knap]) <= 45 and sum(p[knap]) >= sum(p[[0, 2]])


def test_text_keys_group_copies_up_to_case_and_blanks_memo_or_not() -> None:
    from remem_agent.ranking.select import _MEMO, FoldMemo, text_keys

    _MEMO.clear()
    texts = ["A  b", "a b", "c", "C ", "d"]
    assert text_keys(texts) == (0, 0, 2, 2, 4)
    assert text_keys(texts) == (0, 0, 2, 2, 4)  # the same keys from the memo
    assert text_keys(["x", "y", "z"]) == (0, 1, 2)
    memo = FoldMemo(max_texts=3)
    assert memo.folded(["A", "b "]) == ["a", "b"]
    assert memo.folded(["c", "D\tE"]) == ["c", "d e"]  # over its bound: it starts over, the answer is whole
    assert len(memo) == 2


def test_text_twins_keep_the_best_copy_of_each_text() -> None:
    from remem_agent.ranking.select import text_twins

    texts = ["Lunch is at noon.", "lunch  is at NOON.", "Deploys run on Fridays.", "Lunch is at noon."]
    p = np.array([0.4, 0.9, 0.5, 0.9])
    sim = np.array([0.8, 0.7, 0.6, 0.65])
    twins = text_twins(texts, p, sim)
    assert twins is not None and twins.tolist() == [True, False, False, True]  # p first, then similarity
    assert text_twins(["a", "b"], np.array([0.1, 0.2]), np.array([0.1, 0.2])) is None  # nothing to exclude


def test_an_excluded_twin_is_neither_guarded_nor_selected_and_frees_its_slot() -> None:
    p = np.array([0.9, 0.8, 0.7, 0.6])
    sim = np.array([0.95, 0.94, 0.5, 0.4])
    tokens = np.array([10, 10, 10, 10], dtype=np.int64)
    exclude = np.array([False, True, False, False])
    for budget in (None, 25):
        chosen = select(p, sim, tokens, k=2, token_budget=budget, guard_top=2, exclude=exclude)
        assert chosen == [0, 2]  # the twin (index 1) is skipped, the next candidate takes its place


def test_a_floor_relative_to_the_best_keeps_a_weakly_matched_pool_and_still_drops_the_far_worse() -> None:
    """``p_floor_reference="best"``: an exposed candidate needs p >= p_floor * evidence * max p, so a question every
    memory matches weakly keeps its best candidates, while the absolute floor empties it."""
    from remem_agent.config import RememConfig
    from remem_agent.ranking.decide import PoolView

    n = 4
    view = PoolView(
        features={"evidence_all": np.full(n, 0.8), "retrieval": np.array([0.4, 0.35, 0.3, 0.1])},
        similarity=np.array([0.4, 0.35, 0.3, 0.1]),
        tokens=np.full(n, 10, dtype=np.int64),
        shown=np.full(n, 3, dtype=np.int64),
        rate=np.full(n, 0.3),
        text_keys=tuple(range(n)),
        k=4,
        token_budget=None,
    )
    p = np.array([0.2, 0.18, 0.15, 0.04])  # all below the absolute floor 0.35 * 0.8 = 0.28
    base = RememConfig(guard_top=0, p_floor=0.35, p_floor_reference="absolute")
    assert view.choose(base, p) == []
    best = RememConfig(guard_top=0, p_floor=0.35, p_floor_reference="best")
    # relative floor 0.35 * 0.8 * 0.2 = 0.056: the last one (0.04) is far worse than the best and goes
    assert sorted(view.choose(best, p)) == [0, 1, 2]


def test_the_floor_reference_is_checked() -> None:
    import pytest

    from remem_agent.config import RememConfig
    from remem_agent.errors import UserInputError

    with pytest.raises(UserInputError, match="p_floor_reference"):
        RememConfig(p_floor_reference="median")  # type: ignore[arg-type]


def test_a_memorys_own_record_by_hand() -> None:
    """``own_record`` = (1 + a) / (1 + E): the credit earned against the uses its exposures promised."""
    import pytest

    from remem_agent.ranking.utility import own_record

    # 3 exposures (evidence 3 / 5) and one use (rate (1 + 1) / (2 + 3)), two of them recorded with priors summing
    # to 0.9 and the third counted at today's prior 0.5; a memory never judged (evidence 0, rate 1/2)
    feats = {
        "evidence_all": np.array([0.6, 0.0]),
        "rate_all": np.array([0.4, 0.5]),
        "expected_all": np.array([0.9, 0.0]),
        "expected_n_all": np.array([2.0, 0.0]),
    }
    assert own_record(feats, np.array([0.5, 0.7])) == pytest.approx([(1 + 1) / (1 + 0.9 + 0.5), 1.0])
    assert own_record(feats, np.array([0.5, 0.7]), strength=4.0)[0] == pytest.approx((4 + 1) / (4 + 1.4))


def test_a_memory_whose_record_clears_the_exemption_has_no_floor() -> None:
    """``p_floor_exempt``: a memory used more than its exposures promised stays however far below the best it
    scores; one used less keeps its floor."""
    from remem_agent.config import RememConfig
    from remem_agent.ranking.decide import PoolView

    n = 4
    view = PoolView(
        features={
            # the best (never used), a weak one used on every exposure, a weak one never used, one never shown
            "evidence_all": np.array([0.75, 0.75, 0.75, 0.0]),
            "rate_all": np.array([1 / 8, 7 / 8, 1 / 8, 0.5]),
            "expected_all": np.array([6 * 0.8, 6 * 0.2, 6 * 0.2, 0.0]),
            "expected_n_all": np.array([6.0, 6.0, 6.0, 0.0]),
            "calibrated_prior": np.array([0.8, 0.2, 0.2, 0.3]),  # every exposure has its prior recorded
            "retrieval": np.array([0.9, 0.2, 0.2, 0.3]),
        },
        similarity=np.array([0.9, 0.2, 0.2, 0.3]),
        tokens=np.full(n, 10, dtype=np.int64),
        shown=np.array([6, 6, 6, -1], dtype=np.int64),
        rate=np.full(n, 0.3),
        text_keys=tuple(range(n)),
        k=4,
        token_budget=None,
    )
    p = np.array([0.8, 0.1, 0.1, 0.25])
    best = RememConfig(guard_top=0, p_floor=0.9, p_floor_reference="best")
    # floors 0.9 * 0.75 * 0.8 = 0.54 for the exposed ones: both weak ones go
    assert view.choose(best, p) == [0, 3]
    # records: the used one (1 + 6) / (1 + 1.2) = 3.2, the unused one 1 / 2.2, the best 1 / 5.8
    exempt = replace(best, p_floor_exempt=1.5)
    assert view.choose(exempt, p) == [0, 3, 1]
    assert view.choose(replace(best, p_floor_exempt=4.0), p) == [0, 3]  # a record of 3.2 does not reach 4


def test_the_floor_exemption_is_checked() -> None:
    import pytest

    from remem_agent.config import RememConfig
    from remem_agent.errors import UserInputError

    for bad in (0, -1.0, float("nan"), float("inf"), True, "1.5"):
        with pytest.raises(UserInputError, match="p_floor_exempt"):
            RememConfig(p_floor_exempt=bad)  # type: ignore[arg-type]
    assert RememConfig(p_floor_exempt=2).p_floor_exempt == 2
