"""The vectorised rank stage against plain per-candidate reference code, bit for bit.

``build_features`` (one ``Pool`` pass, sparse stats), ``select`` (vectorised floor, list sorts) and
``knapsack`` (all counts per item at once) were rewritten for speed. Served scores, the recorded feature
snapshots and the explain output must not change by one bit, so each is compared here, as raw bytes,
with the straightforward code it replaced, on random pools that reach every branch (stats or none, a
task or none, same-key conflicts, retired facts, decaying attributes, ties, NaN scores).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from remem_agent.ranking.features import EXPOSURE_FEATURES, FEATURE_NAMES, GROUPS, FeatureConfig, build_features
from remem_agent.ranking.select import knapsack, select
from remem_agent.ranking.utility import _sigmoid
from remem_agent.types import ALL_TASKS, Memory, State, TaskStats

DAY = 86_400.0
NOW = 1.8e9


def reference_features(
    memories: Sequence[Memory],
    sim: NDArray[np.float64],
    stats: Mapping[tuple[str, str], TaskStats],
    *,
    task: str | None,
    now: float,
    config: FeatureConfig,
    keys: Mapping[tuple[str, str, str], tuple[int, float]],
    changing_attributes: frozenset[str],
    lexical: NDArray[np.float64] | None,
    retrieval: NDArray[np.float64] | None,
) -> dict[str, NDArray[np.float64]]:
    """The per-candidate formulation (before the Pool rewrite), kept as the specification."""
    n = len(memories)
    ret = sim if retrieval is None else retrieval
    f: dict[str, NDArray[np.float64]] = {name: np.zeros(n) for name in (*FEATURE_NAMES, *EXPOSURE_FEATURES)}
    on = set(config.groups)
    if "static" in on:
        f["similarity"], f["retrieval"] = sim, ret
        f["lexical"] = np.zeros(n) if lexical is None else lexical
        f["gap"] = ret.max() - ret
        f["rank"] = np.arange(n, dtype=np.float64) / max(1, n - 1)
        age_days = np.maximum(0.0, now - np.array([m.valid_from for m in memories])) / DAY
        f["recency"] = np.power(0.5, age_days / config.recency_half_life_days)
        conf = np.array([m.confidence for m in memories], dtype=np.float64)
        if changing_attributes:
            decays = np.array([m.attribute in changing_attributes for m in memories])
            conf = np.where(decays, conf * np.power(0.5, age_days / 180.0), conf)
        f["confidence"] = conf
        f["tokens"] = np.log1p(np.array([m.token_cost for m in memories], dtype=np.float64))
    overall = [stats.get((m.id, ALL_TASKS)) for m in memories]
    if "history" in on:
        f["retrievals"] = np.log1p([s.retrieved if s else 0 for s in overall])
        last = np.array([s.last_retrieved_at if s and s.last_retrieved_at else -np.inf for s in overall])
        age = np.where(np.isfinite(last), np.maximum(0.0, now - np.where(np.isfinite(last), last, now)), 0.0)
        f["retrieval_recency"] = np.where(np.isfinite(last), np.power(0.5, age / DAY), 0.0)
    if "outcome" in on:
        cls = [stats.get((m.id, task)) if task else s for m, s in zip(memories, overall, strict=True)]
        f["rate_all"] = np.array([s.contribution_rate if s else 0.5 for s in overall])
        f["rate_class"] = np.array([s.contribution_rate if s else 0.5 for s in cls])
        shown = np.array([s.shown if s else 0 for s in cls], dtype=np.float64)
        denom = np.maximum(shown, 1.0)
        f["waste_rate"] = np.array([s.wasted if s else 0 for s in cls], dtype=np.float64) / denom
        f["blame_rate"] = np.array([s.blame_sum if s else 0.0 for s in cls], dtype=np.float64) / denom
        f["post_std"] = np.array([s.posterior_std if s else 0.2887 for s in cls])
        f["evidence"] = shown / (shown + config.evidence_k)
        shown_all = np.array([s.shown if s else 0 for s in overall], dtype=np.float64)
        f["evidence_all"] = shown_all / (shown_all + config.evidence_k)
        f["expected_class"] = np.array([s.expected_sum if s else 0.0 for s in cls])
        f["expected_n_class"] = np.array([s.expected_n if s else 0 for s in cls], dtype=np.float64)
        f["expected_all"] = np.array([s.expected_sum if s else 0.0 for s in overall])
        f["expected_n_all"] = np.array([s.expected_n if s else 0 for s in overall], dtype=np.float64)
    if "contradiction" in on:
        stale, contra = np.zeros(n), np.zeros(n)
        for i, m in enumerate(memories):
            if m.valid_to is not None and m.valid_to <= now:
                stale[i] = 1.0
            scoped = (m.scope, *m.key) if m.key is not None else None
            if scoped is not None and m.role == "state" and scoped in keys:
                count, latest = keys[scoped]
                contra[i] = max(0, count - 1)
                if m.state.value not in ("INVALIDATED", "ERASED") and m.valid_from < latest <= now:
                    stale[i] = 1.0
        f["stale"], f["contradictions"] = stale, contra
    return f


def reference_select(
    p: NDArray[np.float64],
    similarity: NDArray[np.float64],
    tokens: NDArray[np.int64],
    *,
    k: int,
    token_budget: int | None,
    p_floor: float | NDArray[np.float64],
    guard_top: int,
    guard_exempt: NDArray[np.bool_] | None,
    method: str,
) -> list[int]:
    """``select`` as it was, per candidate with numpy scalars (the knapsack is compared on its own)."""
    n = len(p)
    if n == 0 or k <= 0:
        return []
    forced: list[int] = []
    if guard_top > 0:
        exempt = guard_exempt if guard_exempt is not None else np.zeros(n, dtype=bool)
        forced = [int(i) for i in np.argsort(-similarity, kind="stable")[:guard_top] if not exempt[i]]
    floor = np.broadcast_to(np.asarray(p_floor, dtype=np.float64), (n,))
    eligible = [i for i in range(n) if p[i] >= floor[i] and i not in forced]
    if token_budget is None:
        forced = forced[:k]
        chosen = forced + sorted(eligible, key=lambda i: -p[i])[: k - len(forced)]
    else:
        chosen, used = [], 0
        for i in forced:
            if len(chosen) < k and used + int(tokens[i]) <= token_budget:
                chosen.append(i)
                used += int(tokens[i])
        idx = np.array(eligible, dtype=np.int64)
        if method == "greedy":
            for i in sorted(eligible, key=lambda i: -p[i]):
                if len(chosen) < k and used + int(tokens[i]) <= token_budget:
                    chosen.append(i)
                    used += int(tokens[i])
        elif len(idx) and len(chosen) < k:
            picked = knapsack(p[idx], tokens[idx], token_budget - used, k - len(chosen))
            chosen += [int(idx[j]) for j in picked]
    return sorted(chosen, key=lambda i: (-p[i], -similarity[i]))


def reference_knapsack(
    values: NDArray[np.float64], weights: NDArray[np.int64], budget: int, max_items: int
) -> list[int]:
    """The knapsack with the classic descending loop over counts (EXACT grid only: budgets here are small)."""
    n = len(values)
    if n == 0 or budget < 0 or max_items <= 0:
        return []
    k = min(max_items, n)
    dp = np.full((k + 1, budget + 1), -np.inf)
    dp[0, :] = 0.0
    keep = np.zeros((n, k + 1, budget + 1), dtype=bool)
    for i in range(n):
        wi, vi = int(weights[i]), float(values[i])
        if vi <= 0 or wi > budget:
            continue
        for j in range(min(i + 1, k), 0, -1):
            cand = dp[j - 1, : budget + 1 - wi] + vi
            cur = dp[j, wi:]
            better = cand > cur + 1e-12
            if better.any():
                keep[i, j, wi:] = better
                dp[j, wi:] = np.where(better, cand, cur)
    best_j = int(np.argmax(dp[:, budget]))
    if not np.isfinite(dp[best_j, budget]) or dp[best_j, budget] <= 0:
        return []
    chosen: list[int] = []
    j, b = best_j, budget
    for i in range(n - 1, -1, -1):
        if j > 0 and keep[i, j, b]:
            chosen.append(i)
            b -= int(weights[i])
            j -= 1
    return sorted(chosen)


def _pool(
    rng: random.Random, n: int
) -> tuple[list[Memory], dict[tuple[str, str], TaskStats], dict[tuple[str, str, str], tuple[int, float]]]:
    memories, stats, keys = [], {}, {}
    for i in range(n):
        entity = rng.choice([None, "alice", "bob"])
        attribute = rng.choice([None, "city", "job", "mood"])
        valid_from = NOW - rng.choice([0.0, 5 * DAY, rng.uniform(0, 400) * DAY, -DAY])
        valid_to = rng.choice([None, None, valid_from + DAY, NOW + DAY, NOW])
        m = Memory(
            id=f"m{i}",
            text=f"t{i}",
            original_text=f"t{i}",
            entity=entity,
            attribute=attribute,
            role=rng.choice(["state", "state", "note", "preference"]),
            tasks=(),
            created_at=valid_from,
            valid_from=valid_from,
            valid_to=valid_to,
            superseded_by=None,
            state=rng.choice(list(State)),
            token_cost=rng.choice([0, 1, 7, 30, 120]),
            confidence=rng.choice([1.0, 0.9, rng.random()]),
            scope=rng.choice(["default", "default", "shared"]),
        )
        memories.append(m)
        for task in (ALL_TASKS, "qa", "plan"):
            if rng.random() < 0.4:
                shown = rng.randint(0, 9)
                credit = rng.uniform(0, shown)
                stats[(m.id, task)] = TaskStats(
                    task=task,
                    retrieved=rng.randint(0, 30),
                    shown=shown,
                    wasted=rng.randint(0, shown),
                    credit_sum=credit,
                    blame_sum=rng.uniform(0, shown - credit),
                    last_retrieved_at=rng.choice([None, 0.0, NOW - rng.uniform(0, 50) * DAY, NOW + 10.0]),
                    expected_sum=rng.uniform(0, shown),
                    expected_n=rng.randint(0, shown),
                )
        if m.key is not None and rng.random() < 0.6:
            keys[(m.scope, *m.key)] = (rng.randint(0, 3), NOW - rng.uniform(-2, 30) * DAY)
    return memories, stats, keys


def _same(a: NDArray[np.float64], b: NDArray[np.float64]) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("seed", range(40))
def test_build_features_bit_identical_to_reference(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 60])
    memories, stats, keys = _pool(rng, n)
    np_rng = np.random.default_rng(seed)
    sim = np.sort(np_rng.uniform(-0.2, 1.0, n))[::-1].copy()
    hybrid = seed % 2 == 0
    lexical = np_rng.uniform(0, 1, n) if hybrid else None
    retrieval = np.sort(np_rng.uniform(0, 1, n))[::-1].copy() if hybrid else None
    for groups in (GROUPS, ("static",), ("history", "outcome"), ("contradiction",), ()):
        for task in (None, "qa", "missing"):
            for stats_in, keys_in, changing in ((stats, keys, frozenset({"city"})), ({}, {}, frozenset())):
                config = FeatureConfig(groups=groups)
                kw = dict(task=task, now=NOW, config=config, lexical=lexical, retrieval=retrieval)
                want = reference_features(
                    memories,
                    sim,
                    stats_in,
                    keys=keys_in,
                    changing_attributes=changing,
                    **kw,  # type: ignore[arg-type]
                )
                got = build_features(
                    memories,
                    sim,
                    stats_in,
                    keys=keys_in,
                    changing_attributes=changing,
                    **kw,  # type: ignore[arg-type]
                )
                assert list(got) == [*FEATURE_NAMES, *EXPOSURE_FEATURES]
                for name in got:
                    assert _same(got[name], want[name]), (groups, task, name)


@pytest.mark.parametrize("seed", range(60))
def test_select_bit_identical_to_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    p = rng.uniform(0, 1, n)
    if seed % 3 == 0:
        p = np.round(p, 1)  # ties
    if seed % 5 == 0 and n:
        p[rng.integers(0, n)] = np.nan  # a NaN score is never eligible, but the guard may still force it
    sim = np.round(rng.uniform(-1, 1, n), 1 if seed % 2 else 6)
    tokens = rng.integers(0, 30, n).astype(np.int64)
    floor: float | NDArray[np.float64] = rng.uniform(0, 0.5, n) if seed % 2 else 0.3
    exempt = rng.uniform(0, 1, n) < 0.3
    for k in (0, 1, 5):
        for budget in (None, 0, 25, 60):
            for guard_top in (0, 2):
                for method in ("knapsack", "greedy"):
                    kw = dict(
                        k=k, token_budget=budget, p_floor=floor, guard_top=guard_top, guard_exempt=exempt, method=method
                    )
                    got = select(p, sim, tokens, **kw)  # type: ignore[arg-type]
                    assert got == reference_select(p, sim, tokens, **kw)  # type: ignore[arg-type]
                    assert all(type(i) is int for i in got)


@pytest.mark.parametrize("seed", range(200))
def test_knapsack_identical_to_the_per_count_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    values = rng.uniform(-0.2, 1, n)
    if seed % 2:
        values = np.round(values, 1)  # ties: the earlier items must win as before
    weights = rng.integers(0, 25, n).astype(np.int64)
    budget, max_items = int(rng.integers(-1, 80)), int(rng.integers(0, 8))
    assert knapsack(values, weights, budget, max_items) == reference_knapsack(values, weights, budget, max_items)


def test_sigmoid_clip_matches_np_clip_everywhere() -> None:
    specials = [-0.0, 0.0, math.nan, -math.inf, math.inf, -40.0, 40.0, -41.0, 41.0, 1e-300, -1e-300, 3.5]
    z = np.array(specials * 5 + list(np.random.default_rng(0).normal(0, 30, 500)))
    want = 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
    assert _same(_sigmoid(z), want)


def test_the_written_out_posterior_is_the_beta_posterior_bit_for_bit() -> None:
    """``TaskStats.contribution_rate`` and ``posterior_std`` compute the Beta(alpha, beta) mean and standard
    deviation without calling the ``alpha`` and ``beta`` properties; they must give the same floats."""
    rng = random.Random(7)
    for _ in range(20_000):
        shown = rng.randint(0, 60)
        credit = rng.choice([0.0, float(rng.randint(0, shown)), rng.random() * shown, shown * 1.7, shown * 0.3])
        s = TaskStats(ALL_TASKS, shown=shown, credit_sum=credit)
        a, b = s.alpha, s.beta
        assert s.contribution_rate == a / (a + b)
        assert s.posterior_std == float(((a * b) / ((a + b) ** 2 * (a + b + 1.0))) ** 0.5)
