"""Recall's decisions, with no I/O: which candidates are eligible, how they rank, which are served.

``ReMem.search`` is three stages: *gather* (embed the query, fetch the candidate pool and the ledger's
evidence about it in one read), :func:`rank_and_select` here (features -> utility -> floor, guard and
knapsack; pure and deterministic given its inputs), and *record* (the durable search record that feedback
refers to). Keeping the middle stage pure means it can be tested, replayed and benchmarked without a store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
from numpy.typing import NDArray

from remem_agent.ranking.decide import PoolView
from remem_agent.ranking.explore import draw
from remem_agent.ranking.features import FEATURE_NAMES, Pool, build_features
from remem_agent.ranking.policy import RankingPolicy
from remem_agent.ranking.rerank import RERANK_DEPTH, StoreReranker, rerank_features, utility_order
from remem_agent.ranking.select import text_keys
from remem_agent.ranking.utility import PriorCalibration, UtilityModel, group_factors, relevance_prior
from remem_agent.types import SERVABLE_STATES, Hit, Memory, State, TaskStats

Key = tuple[str, str, str]  # (scope, entity, attribute)


_TEXT = attrgetter("text")
_NOT_ARCHIVED = frozenset(State) - {State.ARCHIVED, State.ERASED}  # what an ``as_of`` search may serve


def is_eligible(memory: Memory, at: float, *, historical: bool, scopes: frozenset[str] | None = None) -> bool:
    """In one of ``scopes`` (None: any); present tense: a servable state, valid at ``at``; ``as_of``
    (historical): valid then, anything but archived. One memory's :func:`eligible_rows`."""
    return bool(eligible_rows({memory.id: memory}, (memory.id,), at, historical=historical, scopes=scopes))


def eligible_rows(
    rows: Mapping[str, Memory],
    ids: Iterable[str],
    at: float,
    *,
    historical: bool,
    scopes: frozenset[str] | None = None,
) -> dict[str, Memory]:
    """``{id: rows[id]}`` for each of ``ids`` (in order) whose row exists and is eligible at ``at``: in one of
    ``scopes`` (None: any), valid at ``at`` (``Memory.valid_at`` written out), and in a servable state (present
    tense) or anything but archived (``as_of``). The one definition of eligibility, as one comprehension: a
    search tests its whole pool, and a call per row with keywords cost more than the test."""
    get = rows.get
    allowed = _NOT_ARCHIVED if historical else SERVABLE_STATES
    return {
        mid: m
        for mid in ids
        if (m := get(mid)) is not None
        and (scopes is None or m.scope in scopes)
        and m.valid_from <= at
        and (m.valid_to is None or at < m.valid_to)
        and m.state in allowed
    }


@dataclass(frozen=True, kw_only=True)
class EvidenceNeeds:
    """Which ledger reads the configured features need (disabled groups read nothing)."""

    stats: bool
    keys: bool
    attributes: bool
    calibration: bool = False  # the store's calibration of the relevance prior (the contribution utility)
    groups: bool = False  # what each kind of memory contributed in the scope (the contribution utility)

    @classmethod
    def of(cls, config: RankingPolicy) -> EvidenceNeeds:
        groups = set(config.features.groups)
        return cls(
            stats=bool(groups & {"history", "outcome"}) or config.guard_top > 0,
            # Pending same-key conflicts exist only in learned-schema mode (key mode supersedes on arrival).
            keys=config.staleness.mode == "learned" and "contradiction" in groups,
            attributes="static" in groups,
            calibration=config.calibrates(),
            groups=config.utility == "contribution" and config.contribution_group > 0,
        )


@dataclass(frozen=True, kw_only=True)
class Candidates:
    """What the gather stage read: the eligible pool (best retrieval score first) and the evidence about it.

    ``similarities`` are cosines; ``lexical`` (the lexical channel's score scaled to [0, 1]) and ``retrieval``
    (the fused score, remem_agent/ranking/fusion.py) are None for a dense-only pool, whose retrieval score
    is its cosine.
    """

    memories: Sequence[Memory]
    similarities: NDArray[np.float64]
    lexical: NDArray[np.float64] | None = None
    retrieval: NDArray[np.float64] | None = None
    stats: Mapping[tuple[str, str], TaskStats] = field(default_factory=dict)
    keys: Mapping[Key, tuple[int, float]] = field(default_factory=dict)
    changing_attributes: frozenset[str] = frozenset()
    calibration: PriorCalibration | None = None  # read when RememConfig.calibrates()
    groups: Mapping[str, tuple[float, float]] | None = None  # {role: (uses, expected uses)} in the search's scope


@dataclass(frozen=True, kw_only=True)
class Ranking:
    """The served hits, best first, and each one's feature snapshot (training rows are built from these)."""

    hits: tuple[Hit, ...]
    features: tuple[tuple[float, ...], ...]
    # with exploratory serving: the pool, its features and the served set's distribution (ranking/explore.py)
    decision: Mapping[str, object] | None = None
    # with the store's re-ranker on: each served row's re-rank features (ranking/rerank.py), its training input
    rerank: tuple[tuple[float, ...], ...] | None = None

    def search_record(self) -> list[dict[str, object]]:
        """The served list as the ledger stores it (rounded so the record is compact and stable)."""
        rows = [
            {"id": h.id, "rank": h.rank, "score": round(h.score, 6), "similarity": round(h.similarity, 6), "f": list(f)}
            for h, f in zip(self.hits, self.features, strict=True)
        ]
        if self.rerank is not None:
            for row, r in zip(rows, self.rerank, strict=True):
                row["r"] = list(r)
        return rows


def rank_and_select(
    candidates: Candidates,
    *,
    config: RankingPolicy,
    utility: UtilityModel,
    task: str | None,
    at: float,
    k: int,
    token_budget: int | None,
    explain: bool = False,
    explore_u: float | None = None,
    rerank_query: str | None = None,
    reranker: StoreReranker | None = None,
) -> Ranking:
    """Features -> utility -> (re-ranker) -> selection (p_floor, similarity guard, knapsack under a token budget).

    With ``rerank_query`` (the search's query; ``RememConfig.rerank="store"``), each served row also records its
    re-rank features, and ``reranker``, when given, re-orders the head of the utility's order first
    (``ranking/rerank.py``).

    Cold start (``static_prior="with_evidence"``): the ``p_floor`` applies only to candidates the ledger
    holds outcome evidence about (shown at least once); a never-shown candidate's score only restates its
    retrieval score, and a floor on it would drop good matches for no reason, so a fresh store serves ``k``.
    The guard and the final order follow the retrieval score (the fused one in hybrid mode).
    """
    cands = candidates.memories
    if not cands:
        return Ranking(hits=(), features=())
    view = _pool_view(candidates, config=config, task=task, at=at, k=k, token_budget=token_budget)
    p, comps = view.scores(utility)
    rerank_rows: NDArray[np.float64] | None = None
    if rerank_query is not None:
        order = utility_order(p, view.order_by(config))
        rerank_rows = rerank_features(query=rerank_query, memories=cands, features=view.features, p=p, order=order)
        if reranker is not None:
            p, z = reranker.reorder(p, order[:RERANK_DEPTH], rerank_rows)
            comps = {**comps, "rerank": z}
    chosen, decision = _serve(view, config, p, explore_u, memories=cands)
    hits, snapshots = _hits(cands, chosen, view, p, comps if explain else None)
    served_rerank = None if rerank_rows is None else tuple(tuple(r) for r in rerank_rows[chosen].round(5).tolist())
    return Ranking(hits=hits, features=snapshots, decision=decision, rerank=served_rerank)


def _pool_view(
    candidates: Candidates, *, config: RankingPolicy, task: str | None, at: float, k: int, token_budget: int | None
) -> PoolView:
    """The pool's features (with the calibrated prior and the kind's factor when the store has them) and what
    selection needs of it."""
    cands, sims, stats = candidates.memories, candidates.similarities, candidates.stats
    # one pass over the pool's rows and stats, shared by the features, the guard and the token costs
    pool = Pool.read(cands, stats, task)
    feats = build_features(
        cands,
        sims,
        stats,
        task=task,
        now=at,
        config=config.features,
        keys=candidates.keys,
        changing_attributes=candidates.changing_attributes,
        decay_half_life_days=config.staleness.decay_half_life_days,
        lexical=candidates.lexical,
        retrieval=candidates.retrieval,
        pool=pool,
    )
    if candidates.calibration is not None:
        # the store's calibrated relevance prior, for the contribution utility (ranking/utility.py)
        feats["calibrated_prior"] = candidates.calibration(relevance_prior(config.relevance_static, feats))
    if candidates.groups is not None:
        # each candidate's kind's contribution factor, the prior mean of its own (ranking/utility.py)
        feats["group_factor"] = group_factors(candidates.groups, [m.role for m in cands], config.contribution_group)
    return PoolView(
        features=feats,
        similarity=np.asarray(sims, dtype=np.float64),
        tokens=pool.tokens,
        shown=pool.task_shown,
        rate=pool.task_rate,
        text_keys=text_keys(list(map(_TEXT, cands))),
        k=k,
        token_budget=token_budget,
    )


def _hits(
    cands: Sequence[Memory],
    chosen: list[int],
    view: PoolView,
    p: NDArray[np.float64],
    comps: Mapping[str, NDArray[np.float64]] | None,
) -> tuple[tuple[Hit, ...], tuple[tuple[float, ...], ...]]:
    """The served rows as hits (with every feature and component when ``comps`` is given, for explain) and
    their feature snapshots."""
    feats, sims = view.features, view.similarity
    # the feature snapshots of the served rows only (a search records them; the rest of the pool is not kept):
    # one (features x pool) stack and one column pick, the same values in the same FEATURE_NAMES order as
    # stacking each feature's served rows, and rounded elementwise alike
    picked = np.array([feats[name] for name in FEATURE_NAMES])[:, chosen].T.round(5).tolist() if chosen else []
    # the served rows' scores and cosines as floats, each array converted once (float64 -> float is exact: the
    # values float(p[i]) and float(sims[i]) give)
    scores = np.asarray(p, dtype=np.float64)[chosen].tolist() if chosen else []
    cosines = sims[chosen].tolist() if chosen else []
    hits: list[Hit] = []
    snapshots: list[tuple[float, ...]] = []
    for rank, i in enumerate(chosen):
        m = cands[i]
        snapshots.append(tuple(picked[rank]))
        detail = None
        if comps is not None:
            detail = {f"feature.{n}": float(v[i]) for n, v in feats.items()}
            # a component with no value for this candidate (NaN: the re-ranker's logit outside its head) is left out
            detail.update({f"component.{n}": x for n, v in comps.items() if (x := float(v[i])) == x})
        hits.append(
            Hit(
                id=m.id,
                text=m.text,
                score=scores[rank],
                similarity=cosines[rank],
                state=m.state,
                rank=rank,
                valid_from=m.valid_from,
                valid_to=m.valid_to,
                entity=m.entity,
                attribute=m.attribute,
                role=m.role,
                token_cost=m.token_cost,
                explain=detail,
            )
        )
    return tuple(hits), tuple(snapshots)


def _serve(
    view: PoolView,
    config: RankingPolicy,
    p: NDArray[np.float64],
    explore_u: float | None,
    *,
    memories: Sequence[Memory],
) -> tuple[list[int], dict[str, object] | None]:
    """The served indices, and with exploratory serving (``explore_u`` given) the decision a search stores."""
    rules = view.selection(config, p)
    if explore_u is None or config.explore_serving <= 0:
        return rules.choose(), None
    fits = np.ones(view.size, dtype=bool) if view.token_budget is None else view.tokens <= view.token_budget
    served = draw(
        rules.choose,
        p,
        priority=rules.priority,
        epsilon=config.explore_serving,
        width=config.explore_width,
        u=explore_u,
        excluded=rules.twins,
        fits=fits,
    )
    decision: dict[str, object] = {
        "ids": [m.id for m in memories],
        "pool": view.record(),
        "policy": served.record(
            epsilon=config.explore_serving, width=config.explore_width, seed=config.explore_seed, u=explore_u
        ),
    }
    return list(served.chosen), decision
