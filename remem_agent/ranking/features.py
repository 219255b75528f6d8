"""Per-candidate features at retrieval time, vectorised over the candidate pool.

Four groups, each switchable so ablations can turn an information source off (reference §3):

* static: similarity (cosine), gap to the best retrieval score, rank in the pool, recency, confidence, token
  cost, the lexical channel's score and the fused retrieval score (``RememConfig.retrieval``)
* history: retrieval count and recency (the "frequency" strawman: frequent is not useful)
* outcome: Beta-posterior contribution rate overall and for this task class, waste rate, blame rate,
  posterior std, and how much evidence there is
* contradiction: stale flag (a newer same-key fact exists) and contradiction count
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from remem_agent.types import ALL_TASKS, Memory, TaskStats

GROUPS = ("static", "history", "outcome", "contradiction")

FEATURES: dict[str, tuple[str, ...]] = {
    "static": ("similarity", "gap", "rank", "recency", "confidence", "tokens", "lexical", "retrieval"),
    "history": ("retrievals", "retrieval_recency"),
    "outcome": ("rate_all", "rate_class", "waste_rate", "blame_rate", "post_std", "evidence", "evidence_all"),
    "contradiction": ("stale", "contradictions"),
}
# The snapshot order of releases before the lexical channel; the two retrieval features are appended after
# it (not placed inside "static") so an old snapshot is a prefix of a new one and old ledgers and saved
# models stay readable: their rows were all dense, so lexical = 0 and retrieval = similarity, exactly.
LEGACY_FEATURE_NAMES: tuple[str, ...] = tuple(
    f for g in GROUPS for f in FEATURES[g] if f not in ("lexical", "retrieval")
)
FEATURE_NAMES: tuple[str, ...] = (*LEGACY_FEATURE_NAMES, "lexical", "retrieval")
# Beside the snapshot features, the outcome group gives the contribution model its exposures' expected uses
# (``TaskStats.expected_sum`` / ``expected_n``, for this task class and overall). They are sums the ledger
# keeps, not a description of the candidate, so searches do not snapshot them and learned models never see them.
EXPOSURE_FEATURES: tuple[str, ...] = ("expected_class", "expected_n_class", "expected_all", "expected_n_all")


def snapshot_features(rows: Sequence[Sequence[float]]) -> dict[str, NDArray[np.float64]] | None:
    """Feature arrays (``FEATURE_NAMES``) of recorded snapshots, one row per served memory, legacy-width rows
    upgraded; None if a row has neither width (a snapshot this version cannot read)."""
    width, legacy = len(FEATURE_NAMES), len(LEGACY_FEATURE_NAMES)
    if any(len(r) not in (width, legacy) for r in rows):
        return None
    full = [upgrade_snapshot(LEGACY_FEATURE_NAMES, [float(v) for v in r]) if len(r) == legacy else r for r in rows]
    table = np.array(full, dtype=np.float64).reshape(len(full), width)
    return {name: table[:, j] for j, name in enumerate(FEATURE_NAMES)}


def upgrade_snapshot(names: tuple[str, ...], row: list[float]) -> list[float]:
    """A legacy-width snapshot extended to ``FEATURE_NAMES`` (lexical 0, retrieval = similarity)."""
    if names == FEATURE_NAMES:
        return row
    if names != LEGACY_FEATURE_NAMES or len(row) != len(names):
        raise ValueError(f"snapshot of features {list(names)} is neither the current nor the legacy set")
    return [*row, 0.0, row[LEGACY_FEATURE_NAMES.index("similarity")]]


DAY = 86_400.0


@dataclass(frozen=True)
class FeatureConfig:
    groups: tuple[str, ...] = GROUPS
    recency_half_life_days: float = 30.0
    evidence_k: float = 2.0  # evidence = n / (n + k): how far to trust the posterior


@dataclass(frozen=True, slots=True)
class Pool:
    """The per-memory scalars of a candidate pool, read from the ``Memory`` rows and the ledger's stats once.

    Ranking reads the same few fields of every candidate in several places (the features, the guard's
    exemption, the knapsack's token costs); reading them here, in one pass, is what keeps the rank stage
    cheap (a pool is ~50-100 candidates and Python attribute reads, not numpy, were most of its time).
    Arrays are fresh and contiguous, as the per-field ``np.array`` calls they replace were, so every numpy
    operation on them (``np.power``, ``np.log1p``) sees the same inputs in the same layout: bit-identical.
    """

    valid_from: NDArray[np.float64]
    valid_to: NDArray[np.float64]  # NaN where open-ended, so ``valid_to <= now`` is False there
    confidence: NDArray[np.float64]
    tokens: NDArray[np.int64]  # what selection counts against a token budget
    overall: list[TaskStats | None]  # stats over all task classes (ALL_TASKS)
    by_task: list[TaskStats | None]  # stats for the search's task class (``overall`` without a task)
    # ``by_task`` as arrays for the guard and the outcome features: exposures (-1: no stats) and contribution
    # rates (0.0: no stats), written only where there are stats
    task_shown: NDArray[np.int64]
    task_rate: NDArray[np.float64]

    @classmethod
    def read(cls, memories: Sequence[Memory], stats: Mapping[tuple[str, str], TaskStats], task: str | None) -> Pool:
        if stats:
            # the stats rows (a few dozen) by memory, then one lookup per memory in C: not a key tuple built and
            # hashed for every memory and task (half of this method's time)
            overall_of: dict[str, TaskStats] = {}
            task_of: dict[str, TaskStats] = {}
            for (mid, t), s in stats.items():
                if t == ALL_TASKS:
                    overall_of[mid] = s
                if t == task:
                    task_of[mid] = s
            ids = [m.id for m in memories]
            overall = list(map(overall_of.get, ids))
            by_task = list(map(task_of.get, ids)) if task else overall
        else:  # no evidence read (a similarity-only config) or none yet: skip the lookups
            overall = by_task = [None] * len(memories)
        task_shown, task_rate = np.full(len(memories), -1, dtype=np.int64), np.zeros(len(memories))
        if stats:
            for i, row in enumerate(by_task):
                if row is not None:
                    task_shown[i], task_rate[i] = row.shown, row.contribution_rate
        return cls(
            valid_from=np.array([m.valid_from for m in memories], dtype=np.float64),
            # None -> NaN (numpy's conversion of None to a float)
            valid_to=np.array([m.valid_to for m in memories], dtype=np.float64),
            confidence=np.array([m.confidence for m in memories], dtype=np.float64),
            tokens=np.array([m.token_cost for m in memories], dtype=np.int64),
            overall=overall,
            by_task=by_task,
            task_shown=task_shown,
            task_rate=task_rate,
        )


def _filled(n: int, value: float) -> NDArray[np.float64]:
    """``np.full(n, value)`` without its Python-level overhead (it is called several times per search)."""
    a = np.empty(n)
    a.fill(value)
    return a


def build_features(
    memories: Sequence[Memory],
    similarity: NDArray[np.float64],
    stats: Mapping[tuple[str, str], TaskStats],
    *,
    task: str | None,
    now: float,
    config: FeatureConfig = FeatureConfig(),
    keys: Mapping[tuple[str, str, str], tuple[int, float]] | None = None,
    changing_attributes: Collection[str] = (),
    decay_half_life_days: float = 180.0,
    lexical: NDArray[np.float64] | None = None,
    retrieval: NDArray[np.float64] | None = None,
    pool: Pool | None = None,
) -> dict[str, NDArray[np.float64]]:
    """Feature arrays (one value per candidate, the pool in retrieval order); disabled groups are all zeros.

    ``keys`` maps (scope, entity, attribute) to (current state facts, latest valid_from) for the contradiction
    group; ``changing_attributes`` are attributes observed to change, whose confidence decays with age.
    ``lexical`` is the lexical channel's score scaled to [0, 1] (0: not a lexical candidate) and ``retrieval``
    the fused retrieval score the pool is ordered by; without them (a dense-only pool) lexical is 0 and
    retrieval is the cosine similarity, so a dense pool's features are what they were before fusion.
    ``pool`` is ``Pool.read(memories, stats, task)`` when the caller has it already (``rank_and_select``
    reuses it for the guard and the token costs).
    """
    n = len(memories)
    sim = np.asarray(similarity, dtype=np.float64)
    ret = sim if retrieval is None else np.asarray(retrieval, dtype=np.float64)
    if n == 0:
        return {name: np.zeros(n) for name in (*FEATURE_NAMES, *EXPOSURE_FEATURES)}
    pool = pool if pool is not None else Pool.read(memories, stats, task)
    on = set(config.groups)
    f: dict[str, NDArray[np.float64]] = {}
    if "static" in on:
        conf = pool.confidence
        age_days = np.maximum(0.0, now - pool.valid_from) / DAY
        if changing_attributes:
            decays = np.array([m.attribute in changing_attributes for m in memories])
            conf = np.where(decays, conf * np.power(0.5, age_days / decay_half_life_days), conf)
        f["similarity"] = sim
        f["retrieval"] = ret
        f["lexical"] = np.zeros(n) if lexical is None else np.asarray(lexical, dtype=np.float64)
        f["gap"] = ret.max() - ret
        f["rank"] = np.arange(n, dtype=np.float64) / max(1, n - 1)
        f["recency"] = np.power(0.5, age_days / config.recency_half_life_days)
        f["confidence"] = conf
        f["tokens"] = np.log1p(pool.tokens.astype(np.float64))  # a fresh array; int -> float is exact
    # Stats are sparse (most of a pool was never served): arrays start at the no-stats defaults and only
    # the candidates with stats are written, the same values the per-candidate expressions gave.
    overall = [(i, s) for i, s in enumerate(pool.overall) if s is not None]
    if "history" in on:
        f.update(_history_features(n, overall, now))
    exposures: tuple[NDArray[np.float64], ...] = (np.zeros(n),) * 4
    if "outcome" in on:
        exposures = _outcome_features(f, n, pool, overall, config)
    if "contradiction" in on:
        f["stale"], f["contradictions"] = _contradiction_features(memories, pool, keys, now)
    # FEATURE_NAMES order (explain output and snapshots follow it); a disabled group's features are zeros
    out = {name: f[name] if name in f else np.zeros(n) for name in FEATURE_NAMES}
    out.update(zip(EXPOSURE_FEATURES, exposures, strict=True))
    return out


def _history_features(n: int, overall: list[tuple[int, TaskStats]], now: float) -> dict[str, NDArray[np.float64]]:
    """How often and how lately each candidate was retrieved (in any task class)."""
    retrieved = np.zeros(n)
    last = _filled(n, -np.inf)
    for i, s in overall:
        retrieved[i] = s.retrieved
        if s.last_retrieved_at:  # 0 / None: never retrieved (as before: falsy -> -inf)
            last[i] = s.last_retrieved_at
    seen = np.isfinite(last)
    age = np.where(seen, np.maximum(0.0, now - np.where(seen, last, now)), 0.0)
    return {"retrievals": np.log1p(retrieved), "retrieval_recency": np.where(seen, np.power(0.5, age / DAY), 0.0)}


def _outcome_features(
    f: dict[str, NDArray[np.float64]],
    n: int,
    pool: Pool,
    overall: list[tuple[int, TaskStats]],
    config: FeatureConfig,
) -> tuple[NDArray[np.float64], ...]:
    """Write the outcome group's features into ``f``; return the exposure sums (class, then all classes)."""
    by_task = overall if pool.by_task is pool.overall else [(i, s) for i, s in enumerate(pool.by_task) if s is not None]
    rate_all, shown_all = _filled(n, 0.5), np.zeros(n)
    for i, s in overall:
        rate_all[i], shown_all[i] = s.contribution_rate, s.shown
    has = pool.task_shown >= 0
    # the rates and exposures Pool.read took from the same rows (the same floats; int -> float is exact)
    rate_class = np.where(has, pool.task_rate, 0.5)
    shown = np.maximum(pool.task_shown, 0).astype(np.float64)
    wasted, blame, post_std = np.zeros(n), np.zeros(n), _filled(n, 0.2887)
    for i, s in by_task:
        wasted[i], blame[i], post_std[i] = s.wasted, s.blame_sum, s.posterior_std
    f["rate_all"], f["rate_class"] = rate_all, rate_class
    denom = np.maximum(shown, 1.0)
    f["waste_rate"] = wasted / denom
    f["blame_rate"] = blame / denom
    f["post_std"] = post_std
    f["evidence"] = shown / (shown + config.evidence_k)
    f["evidence_all"] = shown_all / (shown_all + config.evidence_k)
    exp_all, exp_n_all = np.zeros(n), np.zeros(n)
    for i, s in overall:
        exp_all[i], exp_n_all[i] = s.expected_sum, s.expected_n
    if by_task is overall:
        return exp_all, exp_n_all, exp_all, exp_n_all
    exp_class, exp_n_class = np.zeros(n), np.zeros(n)
    for i, s in by_task:
        exp_class[i], exp_n_class[i] = s.expected_sum, s.expected_n
    return exp_class, exp_n_class, exp_all, exp_n_all


def _contradiction_features(
    memories: Sequence[Memory], pool: Pool, keys: Mapping[tuple[str, str, str], tuple[int, float]] | None, now: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``stale`` (retired, or a newer same-key fact is current) and ``contradictions`` (other current facts)."""
    stale = (pool.valid_to <= now).astype(np.float64)  # retired since (only reachable through as_of)
    contra = np.zeros(len(memories))
    if keys:
        for i, m in enumerate(memories):
            if m.role != "state" or (key := m.key) is None:
                continue
            scoped = (m.scope, *key)
            if scoped in keys:
                count, latest = keys[scoped]
                contra[i] = max(0, count - 1)
                if m.state.value not in ("INVALIDATED", "ERASED") and m.valid_from < latest <= now:
                    stale[i] = 1.0  # a newer same-key fact is current: a pending conflict
    return stale, contra
