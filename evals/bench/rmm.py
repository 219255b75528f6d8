"""An RMM-style reranker baseline (RMM, arXiv 2503.08026, §6 "retrospective reflection").

A reimplementation of the mechanism, not the authors' code. The reranker adapts the query and memory
embeddings with residual linear maps and learns them from the reader's citations by REINFORCE:

* q' = q + W_q q and m'_i = m_i + W_m m_i (``W_q = W_m = 0`` at the start, so it begins as plain
  similarity), scores s_i = q' . m'_i over the over-fetched candidate pool (the pool similarity search
  gives: top-40 by cosine from the store's exact index, filtered to memories valid now);
* selection is the Plackett-Luce / Gumbel-top-k model at temperature ``tau``: perturb s_i / tau with
  Gumbel(0, 1) noise and take the top k (greedily skipping what does not fit a token budget). The
  probability of the ordered selection (i_1, ..., i_k) is prod_j softmax_{S_j}(s / tau)[i_j], where S_j
  is what is still selectable at step j: not yet chosen and (under a budget) no larger than the budget
  left. Greedy budget filling in Gumbel order is exactly this sequential model, because the budget only
  shrinks (an item skipped once can never fit later);
* reward r_j = +1 if the reader cited the j-th served memory, -1 otherwise; the update is
  W += lr * sum_j (r_j - b) grad log softmax_{S_j}(s / tau)[i_j], i.e. REINFORCE with per-memory credit
  (each memory's reward weights the log-probability of its own choice, as RMM credits memories
  individually) and a baseline b, an exponential moving average of past per-memory rewards (decay 0.05).

Serving. ``serve="sample"`` serves the Gumbel-top-k sample, so the update is on-policy REINFORCE.
``serve="greedy"`` (the default, chosen on dev seeds; see :mod:`evals.bench.tune_rmm`) serves the top k of the
learned scores and applies the same update to the served (greedy) selection: the gradient of the
log-probability of what was served under the tau-tempered policy. That is off-policy (the served set is
the policy's mode, not a sample), so it is a biased but far less noisy estimate; ``tau`` then only sets
how sharp the softmax in the gradient is. The benchmark is online (each task is served once, then
learned from), so there is no separate evaluation pass: the mode decides what the reader sees.

With W = 0 the reranker reproduces system A: scores are the index's own float32 cosines (the residual
terms are added to them, see :meth:`RMMReranker.scores`), ties keep the index's order, and budgets are
filled greedily in rank order exactly as ``select(..., method="greedy")`` does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from evals.harness.embedders import embedder_for
from evals.harness.reader import ReaderParams, read
from evals.harness.replay import WorldReplay, temp_store
from evals.harness.runner import RunResult, TaskRow, invalidation_errors, lifecycle_states
from evals.harness.world import World
from remem_agent import ReMem, RememConfig
from remem_agent.embedders.base import check_vectors
from remem_agent.ranking.select import text_twins

Serve = Literal["greedy", "sample"]
F64 = NDArray[np.float64]


class RMMReranker:
    """Residual linear adaptation of query and memory embeddings, trained by REINFORCE on citations."""

    def __init__(
        self,
        dim: int,
        lr: float,
        tau: float,
        seed: int,
        *,
        baseline: bool = True,
        baseline_decay: float = 0.05,
    ) -> None:
        if tau <= 0:
            raise ValueError("tau must be > 0")
        self.dim = int(dim)
        self.lr = float(lr)
        self.tau = float(tau)
        self.W_q: F64 = np.zeros((self.dim, self.dim))
        self.W_m: F64 = np.zeros((self.dim, self.dim))
        self.rng = np.random.default_rng(seed)
        self.use_baseline = baseline
        self.baseline_decay = float(baseline_decay)
        self.b = 0.0
        self.n_updates = 0

    # -- scoring ----------------------------------------------------------------------------------
    def adapt(self, q: NDArray[np.floating], M: NDArray[np.floating]) -> tuple[F64, F64]:
        """(q', M') = (q + W_q q, M + M W_m^T): the adapted query and memory embeddings (rows of M)."""
        q64 = np.asarray(q, dtype=np.float64).reshape(-1)
        M64 = np.asarray(M, dtype=np.float64).reshape(-1, self.dim)
        return q64 + self.W_q @ q64, M64 + M64 @ self.W_m.T

    def scores(self, q: NDArray[np.floating], M: NDArray[np.floating], base: NDArray[np.floating] | None = None) -> F64:
        """s_i = q' . m'_i.

        ``base`` (optional) is q . m_i as the index computed it. q' . m' = q . m + (the residual terms), so
        passing it only replaces the float64 dot product by the index's float32 cosine: with W = 0 the
        ranking is then the index's own, ties included. Gradients do not depend on it.
        """
        q64 = np.asarray(q, dtype=np.float64).reshape(-1)
        M64 = np.asarray(M, dtype=np.float64).reshape(-1, self.dim)
        qa, Ma = self.adapt(q64, M64)
        if base is None:
            return Ma @ qa
        # q'.m' - q.m = q.(W_m m) + (W_q q).m' ; computed without the q.m term so W = 0 gives exactly 0.
        resid = (M64 @ self.W_m.T) @ q64 + Ma @ (self.W_q @ q64)
        return np.asarray(base, dtype=np.float64).reshape(-1) + resid

    # -- selection --------------------------------------------------------------------------------
    def sample_topk(
        self,
        s: NDArray[np.floating],
        k: int,
        *,
        tokens: Sequence[int] | NDArray[np.integer] | None = None,
        budget: int | None = None,
        greedy: bool = False,
    ) -> list[int]:
        """Indices selected, in selection order: Gumbel-top-k of s / tau (or plain top-k if ``greedy``),
        filling ``budget`` greedily in that order (skipping what does not fit). Ties keep index order."""
        s = np.asarray(s, dtype=np.float64)
        z = s if greedy else s / self.tau + self.rng.gumbel(size=len(s))
        order = np.argsort(-z, kind="stable")
        return _fill(order, k, tokens, budget)

    # -- log-probability and gradients ----------------------------------------------------------
    def log_prob(
        self,
        q: NDArray[np.floating],
        M: NDArray[np.floating],
        chosen: Sequence[int],
        *,
        tokens: Sequence[int] | NDArray[np.integer] | None = None,
        budget: int | None = None,
        weights: Sequence[float] | None = None,
    ) -> float:
        """sum_j w_j log P(i_j | S_j) under Plackett-Luce(s / tau) (w = 1: log P of the ordered selection)."""
        logp, _ = _pl_terms(self.scores(q, M) / self.tau, chosen, tokens, budget, weights)
        return logp

    def grad_log_prob(
        self,
        q: NDArray[np.floating],
        M: NDArray[np.floating],
        chosen: Sequence[int],
        *,
        tokens: Sequence[int] | NDArray[np.integer] | None = None,
        budget: int | None = None,
        weights: Sequence[float] | None = None,
    ) -> tuple[F64, F64]:
        """Analytic gradient of :meth:`log_prob` with respect to (W_q, W_m).

        d/ds_l sum_j w_j log P(i_j | S_j) = sum_j w_j (1[l = i_j] - softmax_{S_j}(s/tau)_l) / tau =: g_l;
        s_l = q'^T m'_l with q' = (I + W_q) q, m'_l = (I + W_m) m_l, so
        dW_q = sum_l g_l m'_l q^T = (M'^T g) q^T and dW_m = sum_l g_l q' m_l^T = q' (M^T g)^T.
        """
        q64 = np.asarray(q, dtype=np.float64).reshape(-1)
        M64 = np.asarray(M, dtype=np.float64).reshape(-1, self.dim)
        qa, Ma = self.adapt(q64, M64)
        _, gz = _pl_terms((Ma @ qa) / self.tau, chosen, tokens, budget, weights)
        g = gz / self.tau
        return np.outer(Ma.T @ g, q64), np.outer(qa, M64.T @ g)

    def update(
        self,
        q: NDArray[np.floating],
        M: NDArray[np.floating],
        chosen: Sequence[int],
        rewards: Sequence[float],
        *,
        tokens: Sequence[int] | NDArray[np.integer] | None = None,
        budget: int | None = None,
    ) -> list[float]:
        """One REINFORCE step on a served selection and its per-memory rewards; returns the advantages."""
        if len(chosen) != len(rewards):
            raise ValueError("one reward per chosen memory")
        if not chosen:
            return []
        r = np.asarray(rewards, dtype=np.float64)
        adv = r - self.b if self.use_baseline else r
        if self.lr:
            gq, gm = self.grad_log_prob(q, M, chosen, tokens=tokens, budget=budget, weights=adv.tolist())
            self.W_q += self.lr * gq
            self.W_m += self.lr * gm
        if self.use_baseline:
            self.b += self.baseline_decay * (float(r.mean()) - self.b)
        self.n_updates += 1
        return [float(a) for a in adv]


def _fill(
    order: Sequence[int] | NDArray[np.integer],
    k: int,
    tokens: Sequence[int] | NDArray[np.integer] | None,
    budget: int | None,
) -> list[int]:
    chosen: list[int] = []
    used = 0
    for i in order:
        if len(chosen) >= k:
            break
        cost = 0 if tokens is None else int(tokens[int(i)])
        if budget is None or used + cost <= budget:
            chosen.append(int(i))
            used += cost
    return chosen


def _pl_terms(
    z: F64,
    chosen: Sequence[int],
    tokens: Sequence[int] | NDArray[np.integer] | None,
    budget: int | None,
    weights: Sequence[float] | None,
) -> tuple[float, F64]:
    """(sum_j w_j log softmax_{S_j}(z)[i_j], its gradient with respect to z)."""
    n = len(z)
    w = np.ones(len(chosen)) if weights is None else np.asarray(weights, dtype=np.float64)
    cost = np.zeros(n, dtype=np.int64) if tokens is None else np.asarray(tokens, dtype=np.int64)
    remaining = np.ones(n, dtype=bool)
    left = budget
    logp = 0.0
    grad = np.zeros(n)
    for wj, i in zip(w, chosen, strict=True):
        mask = remaining if left is None else remaining & (cost <= left)
        if not mask[i]:
            raise ValueError(f"item {i} was not selectable at its step")
        zm = z[mask]
        top = zm.max()
        lse = top + np.log(np.exp(zm - top).sum())
        logp += wj * (z[i] - lse)
        grad[mask] -= wj * np.exp(zm - lse)
        grad[i] += wj
        remaining[i] = False
        if left is not None:
            left -= int(cost[i])
    return float(logp), grad


# -- the benchmark system --------------------------------------------------------------------------
def run_rmm(
    world: World,
    reader_params: ReaderParams,
    *,
    lr: float,
    tau: float,
    k: int | None = None,
    serve: Serve = "greedy",
    seed: int | None = None,
    workdir: Path | None = None,
) -> RunResult:
    """Run the RMM-style reranker on ``world`` like :func:`evals.harness.runner.run` runs a system (name "RMM").

    The store is system A's (similarity-only config, entity/attribute dropped, no feedback to ReMem);
    the reranker reorders A's candidate pool and learns from the reader's citations after every task.
    Deterministic given the world (the Gumbel noise is seeded from ``world.seed`` unless ``seed``).
    """
    t0 = time.perf_counter()
    cfg = RememConfig.similarity_only()
    with one_blas_thread(), temp_store(cfg, embedder_for(world), prefix="remem-rmm-", workdir=workdir) as mem:
        rr = RMMReranker(mem.dim, lr, tau, seed if seed is not None else 7_919 * world.seed + 0x524D4D)
        replay = WorldReplay(mem, world, keys=False, as_of=False)
        rows = _answer_tasks(replay, rr, reader_params, k or world.params.k, serve)
        false_inv, missed = invalidation_errors(mem, world, replay.fact_of)
        states = lifecycle_states(mem)
    return RunResult.from_rows(
        world,
        "RMM",
        reader_params.mode,
        rows,
        states=states,
        false_invalidations=false_inv,
        missed_invalidations=missed,
        wall_s=time.perf_counter() - t0,
    )


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """Limit BLAS to one thread when ``threadpoolctl`` is installed (optional). The products here are tiny
    (40 x 256 by 256 x 256); on a busy 2-core box multi-threaded OpenBLAS made a run 50x slower."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    limits: contextlib.AbstractContextManager[object] = threadpool_limits(limits=1, user_api="blas")
    return limits


def _pool(
    mem: ReMem, qvec: NDArray[np.float32], query: str, k: int, at: float
) -> tuple[list[str], list[int], NDArray[np.float32]]:
    """A's candidate pool for a present-time search (``ReMem.candidates``, the same channels, over-fetch,
    eligibility filter and widening, and A's rule that a text is served once): (ids, token costs, A's retrieval
    scores). The scores are the fused
    ones in hybrid mode (the cosine in dense mode), so with a zero learning rate the reranker ranks as A does."""
    pool = mem.candidates(qvec, k=k, at=at, query=query)
    base = pool.retrieval if pool.retrieval is not None else pool.similarities
    # the same rule as the ranking's: of two candidates with one text only the better-scored is selectable
    scores = np.asarray(base, dtype=np.float64)
    twins = text_twins([m.text for m in pool.memories], scores, scores)
    keep = [i for i in range(len(pool.memories)) if twins is None or not twins[i]]
    memories = [pool.memories[i] for i in keep]
    return [m.id for m in memories], [m.token_cost for m in memories], base[keep].astype(np.float32)


def _answer_tasks(replay: WorldReplay, rr: RMMReranker, reader: ReaderParams, k: int, serve: Serve) -> list[TaskRow]:
    """Every task of the replay: rerank A's pool, let the reader answer, learn from its citations."""
    mem, world = replay.mem, replay.world
    vec_of: dict[str, NDArray[np.float32]] = {}  # mirror of the index's vectors (the ledger's embeddings)
    seq = 0
    rows: list[TaskRow] = []
    budget = world.params.token_budget
    for task in replay.tasks():
        seq, new_ids, mat = mem.store.embeddings_after(seq, mem.dim)  # the memories added since the last task
        vec_of.update(zip(new_ids, mat, strict=True))
        ts = time.perf_counter()
        qvec = check_vectors(mem.embedder.embed([task.query]), 1, mem.dim, source=mem.embedder.name)[0]
        cand, cost, sims = _pool(mem, qvec, task.query, k, task.t)
        chosen: list[int] = []
        if cand:
            M = np.stack([vec_of[m] for m in cand])
            s = rr.scores(qvec, M, base=sims)
            chosen = rr.sample_topk(s, k, tokens=cost, budget=budget, greedy=serve == "greedy")
        search_ms = (time.perf_counter() - ts) * 1000
        served = [replay.fact_of[cand[i]] for i in chosen]
        reading = read(task, served, seed=world.seed, params=reader, domains=world.domains)
        if chosen:
            cited = {replay.mid_of[fid] for fid in reading.cited}
            rewards = [1.0 if cand[i] in cited else -1.0 for i in chosen]
            rr.update(qvec, M, chosen, rewards, tokens=cost, budget=budget)
        rows.append(TaskRow.of(task, reading, served, tokens=sum(cost[i] for i in chosen), search_ms=search_ms))
    return rows
