"""Utility models: P(memory contributes to a successful outcome | features at retrieval time)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from remem_agent.types import CALIBRATION_BINS, calibration_bins

Features = Mapping[str, NDArray[np.float64]]


class UtilityModel(Protocol):
    """Scores a candidate pool; returns (p, components) where components explain the score."""

    @property
    def name(self) -> str: ...

    def score(self, features: Features) -> tuple[NDArray[np.float64], dict[str, NDArray[np.float64]]]: ...


def _sigmoid(z: NDArray[np.float64]) -> NDArray[np.float64]:
    # np.clip(z, -40, 40) without np.clip's Python-level dispatch (a measurable share of scoring a small pool):
    # the same values for every input, NaN and signed zeros included (the two differ only in the sign of a
    # zero that is itself a bound, and neither bound here is zero)
    return 1.0 / (1.0 + np.exp(-np.minimum(np.maximum(z, -40.0), 40.0)))


@dataclass(frozen=True)
class HeuristicUtility:
    """A documented weighted sum of features, squashed to a probability.

    Each weight is a design choice (set a priori, not fitted). The cold-start rule (``prior``): with
    "with_evidence" (the default) the static prior (recency, confidence, token cost) is scaled by how much
    outcome evidence the ledger holds about the candidate (``evidence_all`` = n / (n + 2) exposures), so a
    candidate nobody has judged is ranked by its retrieval score alone, and the prior only re-orders where
    outcomes have started to say something. "always" applies the prior at full weight (system B, the
    reference's static score). The stale flag is never gated: it is the ledger's own knowledge of a newer
    fact, not an outcome.
    """

    name: str = "heuristic"
    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            # The retrieval score is the prior: without outcome evidence, a better match is more likely useful.
            # (The fused score of RememConfig.retrieval; in "dense" mode it is the cosine similarity.)
            "retrieval": 4.0,
            # The cosine similarity on its own, beside the fused score (0: the fused score already has it).
            "similarity": 0.0,
            # Distance from the best retrieval score: relative closeness matters more than the scale.
            "gap": -3.0,
            # Newer facts are slightly preferred; old-but-true facts are not punished much.
            "recency": 0.3,
            # Low-confidence facts (decayed or extracted with doubt) lose a little.
            "confidence": 0.5,
            # Long memories cost context; a mild penalty per log-token.
            "tokens": -0.1,
            # Outcome evidence, centred at the 0.5 prior and scaled by how much evidence exists
            # (evidence = n / (n + 2) exposures, per class for rate_class and overall for rate_all):
            # the contribution rate for this task class dominates the overall rate.
            "rate_class": 5.0,
            "rate_all": 1.5,
            # Shown and blamed on failures: worse than merely wasted.
            "blame_rate": -2.0,
            # A fact with a newer same-key replacement is a trap for present-tense questions.
            "stale": -3.0,
            # Retrieval frequency is deliberately ignored (weight 0): frequent is not useful.
            "retrievals": 0.0,
        }
    )
    bias: float = -2.0
    # UCB-style exploration bonus: c * posterior std, so rarely-shown memories get tried.
    explore_c: float = 0.1
    # "ucb" (default) adds c * std; "thompson" adds Gaussian noise with that std (seeded, so a run is
    # reproducible); "none" turns exploration off. The reference found Thompson worse than UCB.
    explore: Literal["ucb", "thompson", "none"] = "ucb"
    seed: int = 0
    prior: Literal["with_evidence", "always"] = "with_evidence"
    _rng: np.random.Generator = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rng", np.random.default_rng(self.seed))

    def static_terms(self, features: Features, plain: tuple[str, ...]) -> dict[str, NDArray[np.float64]]:
        """The weighted terms that need no outcome: ``plain`` at full weight, then recency, confidence and
        token cost scaled by the evidence gate of ``prior`` (in that order: the sum's order is the score's)."""
        w = self.weights
        terms: dict[str, NDArray[np.float64]] = {name: w.get(name, 0.0) * features[name] for name in plain}
        gate = features["evidence_all"] if self.prior == "with_evidence" else np.ones_like(features["evidence"])
        for name in ("recency", "confidence", "tokens"):
            terms[name] = w.get(name, 0.0) * gate * features[name]
        return terms

    def score(self, features: Features) -> tuple[NDArray[np.float64], dict[str, NDArray[np.float64]]]:
        w = self.weights
        ev = features["evidence"]
        comps = self.static_terms(features, ("retrieval", "similarity", "gap", "stale", "retrievals"))
        comps["rate_class"] = w.get("rate_class", 0.0) * ev * (features["rate_class"] - 0.5)
        comps["rate_all"] = w.get("rate_all", 0.0) * features["evidence_all"] * (features["rate_all"] - 0.5)
        comps["blame_rate"] = w.get("blame_rate", 0.0) * features["blame_rate"]
        z = self.bias + sum(comps.values(), np.zeros_like(ev))
        p = _sigmoid(z)
        std = self.explore_c * features["post_std"]
        if self.explore == "ucb":
            bonus = std
        elif self.explore == "thompson":
            bonus = self._rng.normal(0.0, 1.0, size=len(std)) * std
        else:
            bonus = np.zeros_like(std)
        comps["explore"] = bonus
        return np.clip(p + bonus, 0.0, 1.0), comps


@dataclass(frozen=True, kw_only=True)
class PriorCalibration:
    """How often served memories of each relevance-prior bin were used: the store's own calibration of the prior.

    The relevance prior is a fixed squashing of the retrieval score; what a given prior means in uses depends on
    the store (its embedder, how alike its memories are). Per bin ``b`` (priors in [b/10, (b+1)/10)), the
    ledger sums the credit (capped at 1) and the exposures of every judged exposure (``prior_calibration``);
    the calibrated prior is the Beta posterior mean ``(strength * mid_b + uses_b) / (strength + exposures_b)``,
    which starts at the bin's middle and moves to the observed use rate as exposures accumulate. On a store
    whose mid-similarity candidates (look-alikes of the right template, facts of a sibling key) are rarely
    used, their prior falls, so an exposure as filler promises few uses and costs a memory's contribution
    factor little, while the prior of the best matches stays high.
    """

    uses: tuple[float, ...] = (0.0,) * CALIBRATION_BINS
    exposures: tuple[int, ...] = (0,) * CALIBRATION_BINS
    strength: float = 5.0

    @classmethod
    def from_rows(cls, rows: Mapping[int, tuple[float, int]], *, strength: float) -> PriorCalibration:
        """From the ledger's ``{bin: (uses, exposures)}`` (``LedgerTx.prior_calibration``)."""
        uses = tuple(float(rows[b][0]) if b in rows else 0.0 for b in range(CALIBRATION_BINS))
        exposures = tuple(int(rows[b][1]) if b in rows else 0 for b in range(CALIBRATION_BINS))
        return cls(uses=uses, exposures=exposures, strength=strength)

    def __call__(self, prior: NDArray[np.float64]) -> NDArray[np.float64]:
        b = calibration_bins(prior)
        mid = (b + 0.5) / CALIBRATION_BINS
        uses = np.asarray(self.uses, dtype=np.float64)[b]
        n = np.asarray(self.exposures, dtype=np.float64)[b]
        return (self.strength * mid + uses) / (self.strength + n)


def group_factors(
    groups: Mapping[str, tuple[float, float]], roles: Sequence[str], strength: float
) -> NDArray[np.float64]:
    """Each role's contribution factor in the scope, ``(strength + uses) / (strength + expected uses)`` over the
    judged exposures of memories of that role (``group_contribution``): 1 for a kind never judged, below 1 for a
    kind used less than its relevance promised (look-alike notes), above 1 for one used more."""
    table = {role: (strength + u) / (strength + e) for role, (u, e) in groups.items()}
    return np.array([table.get(role, 1.0) for role in roles], dtype=np.float64)


def relevance_prior(static: HeuristicUtility, features: Features) -> NDArray[np.float64]:
    """``m0 = sigmoid(bias + static terms)``: how likely a memory this relevant is to be used, before any outcome
    says otherwise (the retrieval score, the gap to the best, the stale flag and the evidence-gated recency,
    confidence and token cost of ``static``)."""
    z = static.bias + np.zeros_like(features["evidence_all"])
    for term in static.static_terms(features, ("retrieval", "similarity", "gap", "stale")).values():
        z = z + term
    return _sigmoid(z)


def prior_of(static: HeuristicUtility, features: Features) -> NDArray[np.float64]:
    """The relevance prior a pool is scored with: the store's calibrated prior where the ranking pipeline computed
    one (``calibrated_prior``, ``RememConfig.contribution_calibration``), else ``relevance_prior``."""
    return features["calibrated_prior"] if "calibrated_prior" in features else relevance_prior(static, features)


def expected_uses(
    features: Features, over: Literal["class", "all"], n: NDArray[np.float64], prior: NDArray[np.float64]
) -> NDArray[np.float64]:
    """The uses a memory's ``n`` judged exposures (in the search's task class, or ``over`` all classes) promised:
    the priors recorded at feedback (``expected_<over>``), and ``prior`` for each exposure judged before the ledger
    recorded them."""
    zero = np.zeros_like(n)
    unrecorded = np.maximum(n - features.get(f"expected_n_{over}", zero), 0.0)
    return features.get(f"expected_{over}", zero) + prior * unrecorded


def counts(
    evidence: NDArray[np.float64], rate: NDArray[np.float64], evidence_k: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """A memory's credit ``a`` and judged exposures ``n``, read back exactly from its outcome features:
    ``evidence = n / (n + evidence_k)`` and ``rate = (1 + a) / (2 + n)``."""
    e = np.minimum(evidence, 1.0 - 1e-12)
    n = evidence_k * e / (1.0 - e)
    a = np.clip(rate * (2.0 + n) - 1.0, 0.0, n)
    return a, n


def own_record(
    features: Features, prior: NDArray[np.float64], *, strength: float = 1.0, evidence_k: float = 2.0
) -> NDArray[np.float64]:
    """Each memory's own record over all its judged exposures, ``(strength + a) / (strength + E)``: the credit it
    earned (``a``) against the uses its exposures promised (``E``: the priors recorded at feedback, and ``prior``
    for exposures judged before the ledger recorded them), starting at 1 with ``strength`` uses. 1 for a memory
    never judged; above 1 for one used more often than its relevance promised, below 1 for one used less. Unlike
    the contribution factor it leaves out the prior of the memory's kind: it is the memory's own evidence."""
    a, n = counts(features["evidence_all"], features["rate_all"], evidence_k)
    return (strength + a) / (strength + expected_uses(features, "all", n, prior))


@dataclass(frozen=True)
class ContributionUtility:
    """Relevance scaled by contribution: ``p = m0 * theta``, P(used | served, this query).

    * **Relevance prior.** ``m0 = sigmoid(z)``, where ``z`` is the heuristic's static score (retrieval score,
      gap to the best, recency / confidence / token cost scaled by evidence, the stale flag; the weights of
      :class:`HeuristicUtility` without its outcome terms): how likely a memory this relevant is to be used.
    * **Contribution factor.** Each memory has a multiplier ``theta`` of that chance, 1 when it behaves as its
      relevance predicts, near 0 for a look-alike that is never used. Uses are Poisson with mean ``theta``
      times the expected uses of its exposures, ``E`` (``m0 * n`` if each was as relevant as this query), and
      ``theta`` has a Gamma(kappa, kappa / g) prior: mean ``g``, the factor of the memory's kind in its scope
      (:func:`group_factors`; 1 without one), worth ``kappa`` uses. The posterior mean is
      ``(kappa + a) / (kappa / g + E)``, with ``a`` the credit earned (a sum of per-exposure credits in [0, 1]:
      cited or its value used, ``learning/credit.py``). The prior's weight is counted in uses, not in expected
      uses: a kind that is rarely used (g small) then asks as many uses of a memory as any other kind before its
      own record outweighs the kind's, so one lucky use does not lift it several times above its peers.
    * **Context.** Counts in the search's task class (``n_c``, ``a_c``, ``E_c``) count fully; those of other
      classes (``n_o``, ``a_o``, ``E_o``) ``other_weight`` each: a note that helps "deploy" questions is weak
      evidence about "billing" ones. And the relevance of *this* query stays a factor, so a memory that
      helped other questions is not served on one it does not match.

    So ``p = m0 * (kappa + a_c + w a_o) / (kappa / g + E_c + w E_o)``, capped at 1. With g = 1, a memory served n
    times in this class, each time with a prior of at least ``m``, and never used has
    ``p <= m0 kappa / (kappa + n m)``: below a never-shown candidate of prior ``m0'`` once
    ``n > kappa (m0 / m0' - 1) / m``, whatever its similarity; one used on every exposure rises towards 1.
    Exploration adds ``explore_c`` times the posterior standard deviation of ``p``,
    ``m0 * sqrt(kappa + a) / (kappa / g + E)``: largest for what has not been shown.

    ``E`` is the sum of each exposure's own prior, recorded at feedback from the search's feature snapshot
    (``TaskStats.expected_sum``): a gold fact served as filler to questions it did not match was expected to
    be used little there, and not being used there does not count against it. With the store's calibration
    (:class:`PriorCalibration`, ``RememConfig.contribution_calibration``), ``m0`` and each recorded prior are
    the calibrated ones (the latter as calibrated when its feedback came). Exposures judged before the
    ledger recorded priors count this query's ``m0`` each. The counts are read back from the outcome
    features, which hold them exactly: ``evidence = n / (n + k)`` (``evidence_k``) and
    ``rate = (1 + a) / (2 + n)`` (the uniform-prior posterior mean of ``TaskStats``).
    """

    name: str = "contribution"
    kappa: float = 1.0
    other_weight: float = 0.5
    evidence_k: float = 2.0
    static: HeuristicUtility = field(default_factory=HeuristicUtility)
    explore_c: float = 0.1
    explore: Literal["ucb", "thompson", "none"] = "ucb"
    seed: int = 0
    _rng: np.random.Generator = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rng", np.random.default_rng(self.seed))

    def _counts(self, evidence: NDArray[np.float64], rate: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        return counts(evidence, rate, self.evidence_k)

    def score(self, features: Features) -> tuple[NDArray[np.float64], dict[str, NDArray[np.float64]]]:
        m0 = prior_of(self.static, features)
        a_c, n_c = self._counts(features["evidence"], features["rate_class"])
        a_all, n_all = self._counts(features["evidence_all"], features["rate_all"])
        # expected uses: the recorded priors of the judged exposures, this query's m0 for those without one
        e_c = expected_uses(features, "class", n_c, m0)
        e_all = expected_uses(features, "all", n_all, m0)
        a_o, n_o, e_o = np.maximum(a_all - a_c, 0.0), np.maximum(n_all - n_c, 0.0), np.maximum(e_all - e_c, 0.0)
        ow = self.other_weight
        # the prior mean of theta is the memory's kind's factor g (group_factors; 1 without one), worth kappa uses
        g = np.maximum(features.get("group_factor", np.ones_like(m0)), 1e-6)
        shape = self.kappa + a_c + ow * a_o
        rate = self.kappa / g + e_c + ow * e_o
        theta = shape / rate
        u = np.minimum(m0 * theta, 1.0)
        std = m0 * np.sqrt(shape) / rate
        if self.explore == "ucb":
            bonus = self.explore_c * std
        elif self.explore == "thompson":
            bonus = self._rng.normal(0.0, 1.0, size=len(std)) * self.explore_c * std
        else:
            bonus = np.zeros_like(std)
        comps = {
            "prior": m0,
            "contribution": theta,
            "posterior": u,
            "exposures": n_c + ow * n_o,
            "expected_uses": e_c + ow * e_o,
            "explore": bonus,
        }
        return np.clip(u + bonus, 0.0, 1.0), comps


@dataclass(frozen=True)
class SimilarityUtility:
    """Rank by the retrieval score alone (system A of the evaluation): p = (1 + retrieval) / 2.

    The retrieval score is the cosine similarity in ``retrieval="dense"`` mode and the fused score of the
    hybrid pool otherwise, so A is "the retriever, no learning" on whichever pool every system ranks.
    """

    name: str = "similarity"

    def score(self, features: Features) -> tuple[NDArray[np.float64], dict[str, NDArray[np.float64]]]:
        ret = features["retrieval"]
        return np.clip((1.0 + ret) / 2.0, 0.0, 1.0), {"retrieval": ret}
