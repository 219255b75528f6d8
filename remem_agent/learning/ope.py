"""Off-policy evaluation: how another ranking configuration would have done on the searches already logged.

Searches made with exploratory serving (``RememConfig(explore_serving > 0)``, ``ranking/explore.py``) store their
pool, its features and the exact probability ``mu(S | x)`` of every set they could have served. Given another
configuration (the *target*), each logged pool is decided again as the target would decide it
(:meth:`~remem_agent.ranking.decide.PoolView.choose`, deterministic), giving its set ``S_pi(x)``. With the logged
set ``S`` and its outcome ``r`` (1 for a successful verdict, 0 for a failed one), the weight of a search is

    w = [S_pi(x) = S] / mu(S | x)

and three estimates of the target's success rate follow (each with a 95 % normal interval over searches):

* **IPS**: ``mean(w r)``; unbiased when the target's set always has a positive logged probability.
* **SNIPS** (self-normalised): ``sum(w r) / sum(w)``; a little biased, much less variable.
* **DR** (doubly robust): ``mean(q(x, S_pi(x)) + w (r - q(x, S)))`` with ``q`` a logistic model of success
  from the served set's features, fitted on the other half of the searches (cross-fitting); unbiased if
  either the propensities or the model are right, and it uses the searches whose logged set the target
  would not have served.

Sets are compared as sets of memories (the order within a served set is the ranking's and does not change
what the reader sees). What cannot be replayed: changes of the candidate pool (retrieval, fusion, lifts) and
of the features themselves; a target's own exploration is ignored (it is evaluated as its ranking alone). The
target's learning is not simulated either: it is judged on the posteriors the logging policy had.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import NoPropensitiesError, UserInputError
from remem_agent.ranking.decide import PoolView
from remem_agent.ranking.learned import irls
from remem_agent.ranking.policy import RankingPolicy

Z95 = 1.959963984540054
SET_FEATURES = ("rate_all", "rate_class", "similarity", "retrieval", "evidence_all", "stale", "contradictions")


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A value with its 95 % interval."""

    value: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @classmethod
    def normal(cls, value: float, se: float) -> Estimate:
        return cls(value=value, low=value - Z95 * se, high=value + Z95 * se)


def _se(terms: NDArray[np.float64]) -> float:
    n = len(terms)
    return float(np.std(terms, ddof=1) / math.sqrt(n)) if n > 1 else math.inf


Values = Sequence[float] | NDArray[np.float64]


def ips(rewards: Values, weights: Values) -> Estimate:
    """Inverse propensity scoring: the mean of ``w r``."""
    terms = np.asarray(weights, dtype=np.float64) * np.asarray(rewards, dtype=np.float64)
    _check(terms)
    return Estimate.normal(float(terms.mean()), _se(terms))


def snips(rewards: Values, weights: Values) -> Estimate:
    """Self-normalised IPS: ``sum(w r) / sum(w)``, its interval by the delta method. With no weight at all
    (the target never chose a logged set) the value is NaN and the interval unbounded."""
    w = np.asarray(weights, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    _check(w)
    total = float(w.sum())
    if total <= 0:
        return Estimate(value=math.nan, low=-math.inf, high=math.inf)
    value = float((w * r).sum() / total)
    n = len(w)
    mean_w = total / n
    var = float(np.mean(w**2 * (r - value) ** 2)) / mean_w**2
    return Estimate.normal(value, math.sqrt(var / n) if n > 1 else math.inf)


def doubly_robust(rewards: Values, weights: Values, q_target: Values, q_logged: Values) -> Estimate:
    """The doubly robust estimate: the mean of ``q(x, S_pi) + w (r - q(x, S))``."""
    terms = np.asarray(q_target, dtype=np.float64) + np.asarray(weights, dtype=np.float64) * (
        np.asarray(rewards, dtype=np.float64) - np.asarray(q_logged, dtype=np.float64)
    )
    _check(terms)
    return Estimate.normal(float(terms.mean()), _se(terms))


def _check(values: NDArray[np.float64]) -> None:
    if len(values) == 0:
        raise UserInputError("no judged searches to estimate from")


# -- the logged decisions ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LoggedDecision:
    """One judged search made with exploratory serving, as off-policy evaluation reads it."""

    search_id: str
    task: str | None
    view: PoolView
    served: frozenset[int]  # indices into the pool
    probability: float  # the logging policy's probability of that set
    support: frozenset[frozenset[int]]  # every set the logging policy could have served
    reward: float  # 1.0 success, 0.0 failure

    @functools.cached_property
    def served_features(self) -> list[float]:
        """The logged set's :func:`set_features`, the same for every target evaluated on this decision."""
        return set_features(self.view, self.served)

    @classmethod
    def parse(cls, search_id: str, task: str | None, feedback: Any, decision: Any) -> LoggedDecision:
        """From a stored decision and its search's feedback; a malformed one is a ``UserInputError``."""
        try:
            policy = decision["policy"]
            served = frozenset(int(i) for i in policy["chosen"])
            probability = float(policy["probability"])
            support = frozenset(frozenset(int(i) for i in s) for s, _ in policy["support"])
            reward = 1.0 if bool(feedback["success"]) else 0.0
        except (KeyError, TypeError, ValueError) as exc:
            raise UserInputError(f"search {search_id}: not a stored decision ({exc})") from exc
        view = PoolView.from_record(decision.get("pool", {}))
        if not (0 < probability <= 1) or served not in support or any(not 0 <= i < view.size for i in served):
            raise UserInputError(f"search {search_id}: its stored decision is inconsistent")
        return cls(
            search_id=search_id,
            task=task,
            view=view,
            served=served,
            probability=probability,
            support=support,
            reward=reward,
        )


def set_features(view: PoolView, chosen: Iterable[int]) -> list[float]:
    """The served set as the outcome model sees it: the largest and the mean of each of :data:`SET_FEATURES`
    over the set, its smallest similarity, its size relative to ``k``, its share of the token budget and
    whether it is empty."""
    idx = sorted(chosen)
    width = 2 * len(SET_FEATURES) + 4
    if not idx:
        return [0.0] * (width - 1) + [1.0]
    f = view.features
    table = np.array([np.asarray(f[name])[idx] if name in f else np.zeros(len(idx)) for name in SET_FEATURES])
    pairs = np.column_stack([table.max(axis=1), table.mean(axis=1)]).ravel().tolist()
    budget = view.token_budget
    used = float(view.tokens[idx].sum()) / budget if budget else 0.0
    return [*pairs, float(view.similarity[idx].min()), len(idx) / max(view.k, 1), used, 0.0]


@dataclass(frozen=True, kw_only=True)
class OutcomeModel:
    """An L2 logistic regression of success on set features (:func:`set_features`), on standardised columns."""

    mean: NDArray[np.float64]
    scale: NDArray[np.float64]
    weights: NDArray[np.float64]
    intercept: float

    @classmethod
    def fit(cls, X: NDArray[np.float64], y: NDArray[np.float64], *, lam: float = 1.0) -> OutcomeModel:
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale[scale == 0] = 1.0
        w, b, _ = irls((X - mean) / scale, y, lam)
        return cls(mean=mean, scale=scale, weights=w, intercept=b)

    def predict(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """P(success) of each row."""
        z = ((np.asarray(X, dtype=np.float64) - self.mean) / self.scale) @ self.weights + self.intercept
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -40, 40))), dtype=np.float64)


@dataclass(frozen=True, kw_only=True)
class PolicyEvaluation:
    """What :func:`evaluate_policy` found. ``logged`` is the logging policy's own success rate on the same
    searches; ``match_rate`` the share of searches where the target would have served the logged set, and
    ``support_rate`` the share where the target's set had a positive logged probability at all (below 1, IPS
    and SNIPS miss the rest and only DR's model speaks for it). ``effective_n`` is ``(sum w)^2 / sum w^2``."""

    searches: int
    logged: Estimate
    ips: Estimate
    snips: Estimate
    dr: Estimate
    match_rate: float
    support_rate: float
    effective_n: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("logged", "ips", "snips", "dr"):
            d[key]["half_width"] = getattr(self, key).half_width
        return d


def evaluate_decisions(
    decisions: Sequence[LoggedDecision], target: RankingPolicy, *, k: int | None = None
) -> PolicyEvaluation:
    """The three estimates of ``target``'s success rate on ``decisions`` (pure; :func:`evaluate_policy` reads
    the decisions from a store). ``k``: the target asks each search for this many memories instead of the
    logged search's ``k``."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise UserInputError(f"k must be a positive integer, got {k!r}")
    if target.rerank != "off":
        raise UserInputError(
            "a target with the store's re-ranker (rerank='store') cannot be estimated from logged pools: a pool "
            "is logged without the query and the re-rank features of the candidates it did not serve"
        )
    if not decisions:
        raise NoPropensitiesError("no judged search was logged with propensities")
    utility = target.make_utility()
    rewards, weights, in_support = [], [], []
    x_logged, x_target = [], []
    for d in decisions:
        view = d.view if k is None else replace(d.view, k=k)
        p, _ = view.scores(utility)
        chosen = frozenset(view.choose(target, p))
        rewards.append(d.reward)
        weights.append(1.0 / d.probability if chosen == d.served else 0.0)
        in_support.append(chosen in d.support)
        x_logged.append(d.served_features)
        x_target.append(set_features(d.view, chosen))
    r = np.asarray(rewards, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    q_logged, q_target = _cross_fit(np.asarray(x_logged), np.asarray(x_target), r)
    n = len(r)
    total_sq = float((w**2).sum())
    return PolicyEvaluation(
        searches=n,
        logged=Estimate.normal(float(r.mean()), _se(r)),
        ips=ips(r, w),
        snips=snips(r, w),
        dr=doubly_robust(r, w, q_target, q_logged),
        match_rate=float(np.mean(w > 0)),
        support_rate=float(np.mean(in_support)),
        effective_n=float(w.sum()) ** 2 / total_sq if total_sq > 0 else 0.0,
    )


def _cross_fit(
    x_logged: NDArray[np.float64], x_target: NDArray[np.float64], r: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Outcome-model predictions for the logged and the target sets, each search's from a model fitted on the
    other half of the searches (alternate searches; one model on all of them when a half has one outcome)."""
    n = len(r)
    q_logged = np.empty(n)
    q_target = np.empty(n)
    halves = [np.arange(n) % 2 == 0, np.arange(n) % 2 == 1]
    for test in halves:
        train = ~test
        if not test.any():
            continue
        if not train.any() or len(set(r[train].tolist())) < 2:
            train = np.ones(n, dtype=bool)
        if len(set(r[train].tolist())) < 2:  # one outcome throughout: the model is that constant
            q_logged[test] = q_target[test] = float(r[train].mean())
            continue
        model = OutcomeModel.fit(x_logged[train], r[train])
        q_logged[test] = model.predict(x_logged[test])
        q_target[test] = model.predict(x_target[test])
    return q_logged, q_target


def read_decisions(store: Any, *, scope: str | None = None) -> tuple[list[LoggedDecision], int]:
    """The judged searches of ``store`` (of ``scope``) that stored a decision, and how many judged searches of
    it did not (made before ledger schema 15 or without exploratory serving). ``store`` is a ``Store``."""
    with store.read() as tx:
        rows = list(tx.decisions(scope, judged=True))
        judged = tx.search_counts(scope)[1]
    decisions = [LoggedDecision.parse(sid, task, feedback, decision) for sid, task, _, feedback, decision in rows]
    return decisions, judged - len(decisions)


def evaluate_policy(
    store: Any, target: RankingPolicy, *, scope: str | None = None, k: int | None = None
) -> PolicyEvaluation:
    """Estimate ``target``'s success rate on the judged searches ``store`` logged with propensities.

    A store with judged searches but none logged with propensities raises ``NoPropensitiesError``: decisions
    are stored from ledger schema 15 on, by searches made with ``RememConfig(explore_serving > 0)``."""
    return evaluate_policies(store, {"target": target}, scope=scope, k=k)["target"]


def evaluate_policies(
    store: Any, targets: Mapping[str, RankingPolicy], *, scope: str | None = None, k: int | None = None
) -> dict[str, PolicyEvaluation]:
    """:func:`evaluate_policy` for several targets, reading the logged decisions once."""
    decisions, without = read_decisions(store, scope=scope)
    if not decisions:
        raise NoPropensitiesError(
            f"none of the {without} judged searches{'' if scope is None else f' of scope {scope!r}'} was logged "
            "with propensities: searches store their decision from ledger schema 15 on (migration 15, "
            "search_decisions), and only when made with RememConfig(explore_serving > 0)"
        )
    return {name: evaluate_decisions(decisions, cfg, k=k) for name, cfg in targets.items()}
