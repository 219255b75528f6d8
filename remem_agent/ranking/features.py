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
) -> dict[str, NDArray[np.float64]]:
    """Feature arrays (one value per candidate, the pool in retrieval order); disabled groups are all zeros.

    ``keys`` maps (scope, entity, attribute) to (current state facts, latest valid_from) for the contradiction
    group; ``changing_attributes`` are attributes observed to change, whose confidence decays with age.
    ``lexical`` is the lexical channel's score scaled to [0, 1] (0: not a lexical candidate) and ``retrieval``
    the fused retrieval score the pool is ordered by; without them (a dense-only pool) lexical is 0 and
    retrieval is the cosine similarity, so a dense pool's features are what they were before fusion.
    """
    n = len(memories)
    sim = np.asarray(similarity, dtype=np.float64)
    ret = sim if retrieval is None else np.asarray(retrieval, dtype=np.float64)
    f: dict[str, NDArray[np.float64]] = {name: np.zeros(n) for name in FEATURE_NAMES}
    if n == 0:
        return f
    on = set(config.groups)
    if "static" in on:
        f["similarity"] = sim
        f["retrieval"] = ret
        f["lexical"] = np.zeros(n) if lexical is None else np.asarray(lexical, dtype=np.float64)
        f["gap"] = ret.max() - ret
        f["rank"] = np.arange(n, dtype=np.float64) / max(1, n - 1)
        age_days = np.maximum(0.0, now - np.array([m.valid_from for m in memories])) / DAY
        f["recency"] = np.power(0.5, age_days / config.recency_half_life_days)
        conf = np.array([m.confidence for m in memories], dtype=np.float64)
        if changing_attributes:
            decays = np.array([m.attribute in changing_attributes for m in memories])
            conf = np.where(decays, conf * np.power(0.5, age_days / decay_half_life_days), conf)
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
    if "contradiction" in on:
        keys = keys or {}
        stale, contra = np.zeros(n), np.zeros(n)
        for i, m in enumerate(memories):
            if m.valid_to is not None and m.valid_to <= now:
                stale[i] = 1.0  # retired since (only reachable through as_of)
            scoped = (m.scope, *m.key) if m.key is not None else None
            if scoped is not None and m.role == "state" and scoped in keys:
                count, latest = keys[scoped]
                contra[i] = max(0, count - 1)
                if m.state.value != "INVALIDATED" and m.valid_from < latest <= now:
                    stale[i] = 1.0  # a newer same-key fact is current: a pending conflict
        f["stale"], f["contradictions"] = stale, contra
    return f


def matrix(features: Mapping[str, NDArray[np.float64]]) -> NDArray[np.float64]:
    """Stack features in FEATURE_NAMES order: shape (n, len(FEATURE_NAMES))."""
    return np.column_stack([features[name] for name in FEATURE_NAMES])
