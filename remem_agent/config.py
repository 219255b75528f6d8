"""``RememConfig``: the tunable defaults of search (ranking, selection) and feedback (credit, staleness, retention).

One frozen value object that both the recall pipeline (``ranking/pipeline.py``) and the learning step
(``learning/feedback.py``) read, so neither needs the ``ReMem`` facade.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal

from remem_agent.embedders.context import check_weight
from remem_agent.errors import UserInputError
from remem_agent.learning.credit import CreditPolicy
from remem_agent.learning.retention import RetentionPolicy
from remem_agent.learning.staleness import StalenessPolicy
from remem_agent.ranking.features import FeatureConfig
from remem_agent.ranking.utility import ContributionUtility, HeuristicUtility, SimilarityUtility, UtilityModel


@dataclass(frozen=True)
class RememConfig:
    """Tunable defaults of search and feedback."""

    k: int = 5
    pool_factor: int = 4  # over-fetch k * pool_factor candidates ...
    min_pool: int = 40  # ... but never fewer than this
    p_floor: float = 0.35  # chosen on dev seeds (evals/bench/tune_contribution.py, with LoCoMo's transfer)
    # "absolute": a candidate with outcome evidence needs p >= p_floor * evidence; "best": p >= p_floor *
    # evidence * the pool's best p, so a question that every memory matches weakly is not left with nothing.
    p_floor_reference: Literal["absolute", "best"] = "best"
    # A memory whose own record is at least this has no floor (ranking/utility.py own_record: (1 + uses) / (1 +
    # the uses its exposures promised), over every judged exposure): what has helped more than its relevance
    # promised is not dropped for being far less similar than the best candidate. None: no exemption. It reads
    # the outcome features (``features.groups`` with "outcome"); without them nothing is exempt.
    p_floor_exempt: float | None = None
    # The similarity guard: the guard_top most similar candidates are served whatever their utility. Off by
    # default: it kept a never-used look-alike in every served set until its exemption (below) came, and on
    # dev seeds the contribution utility did better without it.
    guard_top: int = 0
    guard_min_shown: int = 3  # guard exemption: shown at least this often ...
    guard_max_rate: float = 0.2  # ... with class contribution rate below this
    # Under a token budget: "knapsack" maximises the summed utility exactly; "greedy" fills the budget in
    # rank order (what a plain similarity search truncated to a budget does).
    selection: Literal["knapsack", "greedy"] = "knapsack"
    features: FeatureConfig = field(default_factory=FeatureConfig)
    credit: CreditPolicy = field(default_factory=CreditPolicy)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    staleness: StalenessPolicy = field(default_factory=StalenessPolicy)
    # Which utility model ranks candidates when none is passed to ReMem: the contribution utility (relevance
    # scaled by what each memory and its kind contributed), the documented heuristic, or a LearnedUtility
    # loaded from ``utility_path`` (JSON written by LearnedUtility.save).
    utility: Literal["heuristic", "contribution", "learned", "similarity"] = "contribution"
    utility_path: str | None = None
    # Exploration of the heuristic utility: "ucb" adds explore_c * posterior std; "thompson" samples.
    explore: Literal["ucb", "thompson", "none"] = "ucb"
    explore_c: float = 0.1
    # The contribution utility (ranking/utility.py ContributionUtility): the weight, in uses, of the prior on a
    # memory's contribution factor (its kind's factor), and how much an exposure in another task class counts.
    # kappa 16 was chosen on dev seeds with LoCoMo's transfer as a constraint
    # (results/benchmark/tuning/contribution_relative_dev.json).
    contribution_kappa: float = 16.0
    contribution_other_weight: float = 0.5
    # The store's calibration of the relevance prior from outcomes (ranking/utility.py PriorCalibration): the
    # strength, in exposures, of each bin's starting value; 0 uses the uncalibrated prior. Chosen on dev seeds
    # (evals/bench/tune_contribution.py, results/benchmark/tuning/contribution_dev.json).
    contribution_calibration: float = 5.0
    # The contribution utility's prior for a memory's contribution factor: its kind's (role's) factor in the scope,
    # ``(g + uses) / (g + expected uses)`` over that kind's judged exposures, with ``g`` this strength in expected
    # uses (ranking/utility.py ContributionUtility); 0 starts every memory at 1. Chosen on dev seeds
    # (evals/bench/tune_contribution.py).
    contribution_group: float = 5.0
    # What each served memory costs under a token budget, in utility: the knapsack maximises the sum of
    # (p - item_cost), so a memory is worth serving only if it is likely enough to be used.
    item_cost: float = 0.0
    # Overrides of HeuristicUtility's documented weights (ablations, experiments); None keeps them.
    heuristic_weights: Mapping[str, float] | None = None
    # A scope every search may also read (team-wide facts, say); None: each search reads its own scope only.
    shared_scope: str | None = None
    # Query embeddings kept for repeated questions (remem_agent/embedders/cache.py); 0 turns the cache off.
    query_cache_size: int = 1024
    # Candidate generation: "hybrid" fuses the dense index and the ledger's lexical index (FTS5 / memory_terms)
    # into one pool; "dense" or "lexical" use one channel. See remem_agent/ranking/fusion.py.
    retrieval: Literal["hybrid", "dense", "lexical"] = "hybrid"
    # How the two channels' lists become one retrieval score: "bonus" (cosine + lexical_weight * the lexical
    # score scaled to [0, 1] by the pool's best) or "rrf" (reciprocal rank fusion). Chosen on the LoCoMo dev
    # conversations (evals/bench/fusion_dev.py, results/locomo/fusion_dev.json): bonus 0.3 had the best
    # recall@5 of 21 fusion rules (54.8 vs RRF's best 53.2, RRF k=60 48.1; BM25 alone 44.2, cosine 40.5).
    fusion: Literal["rrf", "bonus"] = "bonus"
    rrf_k: float = 60.0  # RRF's rank offset: 1 / (rrf_k + rank)
    lexical_weight: float = 0.3  # the bonus scale ("bonus"), or the lexical list's weight beside dense's 1 ("rrf")
    lexical_pool: int | None = None  # lexical candidates fetched (None: the dense pool's size)
    # Time in fusion ("hybrid" and "lexical" retrieval): a query that names a time ("in May 2023", "last week",
    # resolved against the search's now by remem_agent/temporal.py) lifts each pooled memory said or valid then,
    # or whose text speaks of that time (its stored mentions), by ``time_weight`` on the retrieval score. Chosen
    # on the LoCoMo dev conversations by leave-one-conversation-out (evals/bench/locomo_loco.py,
    # results/locomo/loco_time.json): 0.3 on every fold, of 0, 0.1, 0.2, 0.3, 0.5 and 1.
    time_weight: float = 0.3
    # A query that names a memory's speaker ("What did Caroline ...") lifts it by ``speaker_weight``
    # (remem_agent/ranking/lifts.py). Chosen with time_weight on the same folds (results/locomo/loco_lifts.json):
    # 0.3 on two folds and 0.2 on the third, of 0, 0.1, 0.2, 0.3 and 0.5; time_weight 0.2 and 0.3 tie there.
    speaker_weight: float = 0.3
    # How far a conversation turn's stored vector leans toward the turn before it in its session
    # (remem_agent/embedders/context.py). A property of the store's vectors: a new store records it (None: the
    # default, 0.7); an existing store keeps its own, and a different value given here is refused (``remem
    # reembed --turn-context`` changes it). Chosen with time_weight and speaker_weight on the LoCoMo dev
    # conversations by leave-one-conversation-out (evals/bench/locomo_loco.py, results/locomo/loco_context.json):
    # the folds chose 0.5, 0.5 and 1.0 of 0, 0.5, 0.7 and 1; 0.7 and 1 are within 0.1 point over all three
    # conversations, and 0.7, the plateau's middle, keeps more temporal recall. 0: each turn's own vector.
    turn_context: float | None = None
    # The cold-start rule: "with_evidence" scales the static prior by the candidate's outcome evidence and
    # turns the p_floor on only for pools holding some; "always" applies both unconditionally (system B).
    static_prior: Literal["with_evidence", "always"] = "with_evidence"
    # The abstain gate (ranking/gate.py): "null" serves nothing when no candidate's cosine similarity beats the
    # query's similarity to unrelated text (the ``abstain_quantile`` of its cosines to a fixed null corpus, plus
    # ``abstain_margin``); "off" always serves the nearest memories.
    abstain: Literal["off", "null"] = "off"
    abstain_quantile: float = 1.0  # chosen by evals/bench/abstain_gate.py (results/abstain/gate.json)
    abstain_margin: float = 0.0
    # Exploratory serving (ranking/explore.py): the share of searches that serve an alternative to the ranking's
    # set (one of the ``explore_width`` best candidates it left out, put in), each search logging its pool and
    # every set's exact probability for off-policy evaluation (learning/ope.py). 0 serves the ranking's set
    # and logs nothing more. ``explore_seed`` fixes the draws: the same searches serve the same sets.
    explore_serving: float = 0.0
    explore_width: int = 4
    explore_seed: int = 0
    # The store's re-ranker (ranking/rerank.py, learning/rerank_fit.py): "store" records each served memory's
    # re-rank features, fits a model on the store's own answered searches (at 20 of them, then each time they have
    # grown by half) and lets it re-order the head of each ranking; "off" does neither.
    rerank: Literal["off", "store"] = "off"

    def __post_init__(self) -> None:
        if self.retrieval not in ("hybrid", "dense", "lexical"):
            raise UserInputError(f"retrieval must be 'hybrid', 'dense' or 'lexical', got {self.retrieval!r}")
        if self.fusion not in ("rrf", "bonus"):
            raise UserInputError(f"fusion must be 'rrf' or 'bonus', got {self.fusion!r}")
        if self.static_prior not in ("with_evidence", "always"):
            raise UserInputError(f"static_prior must be 'with_evidence' or 'always', got {self.static_prior!r}")
        if not (self.rrf_k >= 0 and self.lexical_weight >= 0):
            raise UserInputError("rrf_k and lexical_weight must be non-negative")
        if not (self.contribution_kappa > 0 and 0 <= self.contribution_other_weight <= 1 and 0 <= self.item_cost < 1):
            raise UserInputError(
                "contribution_kappa must be positive, contribution_other_weight in [0, 1] and item_cost in [0, 1)"
            )
        if not (isinstance(self.contribution_calibration, int | float) and 0 <= self.contribution_calibration < 1e6):
            raise UserInputError("contribution_calibration must be a number in [0, 1e6) (0: no calibration)")
        if not (isinstance(self.contribution_group, int | float) and 0 <= self.contribution_group < 1e6):
            raise UserInputError("contribution_group must be a number in [0, 1e6) (0: every memory starts at 1)")
        if self.p_floor_exempt is not None and not (
            isinstance(self.p_floor_exempt, int | float)
            and not isinstance(self.p_floor_exempt, bool)
            and 0 < self.p_floor_exempt < 1e6
        ):
            raise UserInputError("p_floor_exempt must be None or a number in (0, 1e6)")
        if self.p_floor_reference not in ("absolute", "best"):
            raise UserInputError(f"p_floor_reference must be 'absolute' or 'best', got {self.p_floor_reference!r}")
        if self.rerank not in ("off", "store"):
            raise UserInputError(f"rerank must be 'off' or 'store', got {self.rerank!r}")
        if self.abstain not in ("off", "null"):
            raise UserInputError(f"abstain must be 'off' or 'null', got {self.abstain!r}")
        q, m = self.abstain_quantile, self.abstain_margin
        if not (isinstance(q, int | float) and 0 <= q <= 1 and isinstance(m, int | float) and -2 <= m <= 2):
            raise UserInputError("abstain_quantile must be in [0, 1] and abstain_margin in [-2, 2]")
        for name in ("time_weight", "speaker_weight"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 100):
                raise UserInputError(f"{name} must be a number in [0, 100) (0: it plays no part in fusion)")
        if self.turn_context is not None:
            check_weight(self.turn_context)
        eps, width, seed = self.explore_serving, self.explore_width, self.explore_seed
        if not (isinstance(eps, int | float) and not isinstance(eps, bool) and 0 <= eps < 1):
            raise UserInputError(f"explore_serving must be a number in [0, 1), got {eps!r}")
        if not (isinstance(width, int) and not isinstance(width, bool) and 1 <= width <= 64):
            raise UserInputError(f"explore_width must be an integer in [1, 64], got {width!r}")
        if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63):
            raise UserInputError(f"explore_seed must be a non-negative integer, got {seed!r}")
        if self.lexical_pool is not None and self.lexical_pool < 1:
            raise UserInputError("lexical_pool must be at least 1 (or None)")

    def overriding(self, overrides: Mapping[str, Any]) -> RememConfig:
        """This configuration with ``overrides`` applied: ``{"p_floor": 0.5, "features.groups": ["static"],
        "heuristic_weights": {"similarity": 3}}``; a dotted name reaches into a policy. An unknown field or a
        value of another type than the field's is a ``UserInputError``."""
        if not isinstance(overrides, Mapping):
            raise UserInputError("overrides must be a mapping of field names to values")
        cfg: RememConfig = self
        for dotted, value in overrides.items():
            cfg = _override(cfg, str(dotted), value, dotted=str(dotted))
        return cfg

    @classmethod
    def similarity_only(cls, **overrides: Any) -> RememConfig:
        """System A: cosine ranking only; no guard, no outcome features, no retention or outcome staleness, no
        lift for the times or speakers a query names.

        Ingest-time supersession still applies (it is a property of the ledger, not of ranking).
        """
        base: dict[str, Any] = {
            "utility": "similarity",
            "time_weight": 0.0,
            "speaker_weight": 0.0,
            "guard_top": 0,
            "p_floor": 0.0,
            "selection": "greedy",
            "features": FeatureConfig(groups=("static",)),
            "retention": RetentionPolicy(enabled=False),
            "staleness": StalenessPolicy(outcome_invalidation=False),
        }
        return cls(**{**base, **overrides})

    @functools.cached_property
    def relevance_static(self) -> HeuristicUtility:
        """The static score behind the relevance prior (``ranking.utility.relevance_prior``): the heuristic's
        weights (with ``heuristic_weights`` applied) and cold-start rule, without exploration. Feedback records
        each served memory's prior under it, whichever utility ranks. Built once per config."""
        static = HeuristicUtility(explore="none", prior=self.static_prior)
        if self.heuristic_weights:
            static = replace(static, weights={**static.weights, **self.heuristic_weights})
        return static

    def calibrates(self) -> bool:
        """Whether searches rank with the store's calibrated relevance prior (the contribution utility only)."""
        return self.utility == "contribution" and self.contribution_calibration > 0

    def make_utility(self) -> UtilityModel:
        if self.utility == "heuristic":
            base = HeuristicUtility(explore=self.explore, explore_c=self.explore_c, prior=self.static_prior)
            if self.heuristic_weights:
                unknown = set(self.heuristic_weights) - set(base.weights)
                if unknown:
                    raise UserInputError(f"unknown heuristic weights {sorted(unknown)}; known: {sorted(base.weights)}")
                base = replace(base, weights={**base.weights, **self.heuristic_weights})
            return base
        if self.utility == "contribution":
            return ContributionUtility(
                kappa=self.contribution_kappa,
                other_weight=self.contribution_other_weight,
                evidence_k=self.features.evidence_k,
                static=self.relevance_static,
                explore=self.explore,
                explore_c=self.explore_c,
            )
        if self.utility == "similarity":
            return SimilarityUtility()
        if self.utility == "learned":
            if not self.utility_path:
                raise UserInputError("utility='learned' needs utility_path (a LearnedUtility JSON file)")
            from remem_agent.ranking.learned import LearnedUtility

            return LearnedUtility.load(self.utility_path)
        raise UserInputError(f"unknown utility {self.utility!r}; use 'heuristic' or 'learned'")


def _override(obj: Any, path: str, value: Any, *, dotted: str) -> Any:
    """``obj`` (a frozen dataclass) with the field at ``path`` set to ``value``, type-checked against the field."""
    head, _, rest = path.partition(".")
    names = {f.name for f in fields(obj)}
    if head not in names:
        raise UserInputError(f"unknown config field {dotted!r}")
    current = getattr(obj, head)
    if rest:
        if not is_dataclass(current):
            raise UserInputError(f"config field {dotted!r}: {head!r} has no fields")
        return replace(obj, **{head: _override(current, rest, value, dotted=dotted)})
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    expected = type(current)
    ok = (
        current is None or isinstance(value, expected) or (isinstance(current, Mapping) and isinstance(value, Mapping))
    ) and not (isinstance(value, bool) and not isinstance(current, bool) and current is not None)
    if not ok or is_dataclass(current):
        raise UserInputError(f"config field {dotted!r} takes a {expected.__name__}, got {value!r}")
    return replace(obj, **{head: value})
