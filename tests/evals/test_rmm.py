"""The RMM-style reranker baseline (evals/bench/rmm.py): gradient, W = 0 behaviour, determinism, learning."""

from __future__ import annotations

import numpy as np
import pytest

from evals.bench.rmm import RMMReranker, run_rmm
from evals.harness.families import make_world
from evals.harness.reader import ReaderParams
from evals.harness.runner import run
from evals.harness.systems import load_systems
from evals.harness.world import WorldParams


def _unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("budget", [None, 9])
def test_gradient_matches_finite_differences(budget: int | None) -> None:
    rng = np.random.default_rng(0)
    dim, n, k = 6, 9, 4
    rr = RMMReranker(dim, lr=0.1, tau=0.7, seed=1)
    rr.W_q = 0.3 * rng.normal(size=(dim, dim))  # away from 0, so every term of the gradient is exercised
    rr.W_m = 0.3 * rng.normal(size=(dim, dim))
    q, M = _unit(rng, dim), _unit(rng, n, dim)
    tokens = rng.integers(1, 5, size=n)
    chosen = rr.sample_topk(rr.scores(q, M), k, tokens=tokens, budget=budget)
    assert 1 <= len(chosen) <= k
    for weights in (None, [1.5, -0.5, 0.25, -1.0][: len(chosen)]):
        gq, gm = rr.grad_log_prob(q, M, chosen, tokens=tokens, budget=budget, weights=weights)
        eps = 1e-6
        for W, g in ((rr.W_q, gq), (rr.W_m, gm)):
            num = np.zeros_like(W)
            for idx in np.ndindex(W.shape):
                old = W[idx]
                W[idx] = old + eps
                up = rr.log_prob(q, M, chosen, tokens=tokens, budget=budget, weights=weights)
                W[idx] = old - eps
                down = rr.log_prob(q, M, chosen, tokens=tokens, budget=budget, weights=weights)
                W[idx] = old
                num[idx] = (up - down) / (2 * eps)
            np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-7)


def test_log_prob_is_plackett_luce_and_sums_to_one() -> None:
    # Over all ordered pairs (k = 2, no budget) the sequence probabilities sum to 1.
    rng = np.random.default_rng(3)
    rr = RMMReranker(4, lr=0.0, tau=0.5, seed=0)
    q, M = _unit(rng, 4), _unit(rng, 5, 4)
    total = sum(np.exp(rr.log_prob(q, M, [i, j])) for i in range(5) for j in range(5) if i != j)
    assert total == pytest.approx(1.0)
    # ... and Gumbel-top-k sampling matches the model's first-choice probabilities.
    s = rr.scores(q, M)
    p = np.exp(s / 0.5) / np.exp(s / 0.5).sum()
    firsts = np.bincount([rr.sample_topk(s, 2)[0] for _ in range(20_000)], minlength=5) / 20_000
    np.testing.assert_allclose(firsts, p, atol=0.015)


def test_zero_w_ranks_exactly_like_cosine() -> None:
    rng = np.random.default_rng(5)
    rr = RMMReranker(16, lr=0.1, tau=1.0, seed=0)
    q, M = _unit(rng, 16), _unit(rng, 30, 16)
    M[7] = M[3]  # an exact tie keeps index order, as the similarity ranking does
    cos = M @ q
    np.testing.assert_array_equal(rr.scores(q, M), cos)
    assert rr.sample_topk(rr.scores(q, M), 30, greedy=True) == np.argsort(-cos, kind="stable").tolist()
    base = (M.astype(np.float32) @ q.astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(rr.scores(q, M, base=base), base.astype(np.float64))


def test_zero_lr_reproduces_system_a() -> None:
    world = make_world("budget_tight", 3, WorldParams(n_tasks=60))  # token budget and k = 10
    for mode in ("first", "latest"):
        reader = ReaderParams(mode=mode)
        a = run(world, load_systems()["A"], reader)
        r = run_rmm(world, reader, lr=0.0, tau=1.0)
        assert [x.served_fids for x in r.rows] == [x.served_fids for x in a.rows]
        assert r.success == a.success and r.tokens_per_task == a.tokens_per_task


def test_short_run_is_sane_and_deterministic() -> None:
    world = make_world("contradiction", 7, WorldParams(n_tasks=60))
    r1 = run_rmm(world, ReaderParams(), lr=0.1, tau=0.3, serve="sample")
    r2 = run_rmm(world, ReaderParams(), lr=0.1, tau=0.3, serve="sample")
    assert r1.system == "RMM" and r1.reader == "first" and r1.n_tasks == 60 == len(r1.rows)
    assert 0.0 <= r1.success <= 1.0 and 0.0 <= r1.gold_never_served <= 1.0
    assert all(1 <= row.served <= world.params.k for row in r1.rows)
    assert r1.tokens_per_task > 0 and r1.false_invalidations == 0
    assert r1.states == {"ACTIVE": sum(r1.states.values())} and sum(r1.states.values()) > 0
    timing = {"wall_s": 0, "search_ms_p50": 0}
    assert r1.summary() | timing == r2.summary() | timing
    assert [x.served_fids for x in r1.rows] == [x.served_fids for x in r2.rows]
    g = run_rmm(world, ReaderParams(), lr=0.03, tau=0.3)
    budget = run_rmm(make_world("budget_tight", 7, WorldParams(n_tasks=60)), ReaderParams(), lr=0.03, tau=0.3)
    assert g.n_tasks == 60 and 0 < g.success <= 1
    assert all(row.tokens <= 45 for row in budget.rows)


@pytest.mark.parametrize("greedy", [True, False])
def test_consistently_cited_memory_rises(greedy: bool) -> None:
    rng = np.random.default_rng(11)
    dim, n, k = 32, 20, 3
    rr = RMMReranker(dim, lr=0.05, tau=0.5, seed=2)
    M = _unit(rng, n, dim)
    queries = _unit(rng, 40, dim)
    target = 7  # always cited when served; everything else never

    def rank_of_target(q: np.ndarray) -> int:
        return int(np.flatnonzero(np.argsort(-rr.scores(q, M), kind="stable") == target)[0])

    before = [rank_of_target(q) for q in queries]
    served = 0
    for step in range(400):
        q = queries[step % len(queries)]
        chosen = rr.sample_topk(rr.scores(q, M), k, greedy=greedy)
        served += target in chosen
        rr.update(q, M, chosen, [1.0 if i == target else -1.0 for i in chosen])
    after = [rank_of_target(q) for q in queries]
    assert served > 0
    assert np.mean(after) < np.mean(before) - 2
    assert sum(a == 0 for a in after) > sum(b == 0 for b in before)
