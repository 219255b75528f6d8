"""The settings ranking reads: the protocol a configuration satisfies to be ranked by.

The ranking modules take a :class:`RankingPolicy`, not ``RememConfig``: the package states what it reads, and
the configuration (``config.py``), which is built from ranking's own types, is the only side that imports the
other. ``RememConfig`` satisfies the protocol as it is; a test-made or wrapping policy can too.
"""

from __future__ import annotations

from typing import Literal, Protocol

from remem_agent.ranking.features import FeatureConfig
from remem_agent.ranking.utility import HeuristicUtility, UtilityModel


class StalenessSettings(Protocol):
    """What ranking reads of the staleness policy: which supersession mode runs, and how fast age decays."""

    @property
    def mode(self) -> str: ...

    @property
    def decay_half_life_days(self) -> float: ...


class RankingPolicy(Protocol):
    """Everything of a configuration that fusion, scoring, selection and exploratory serving read."""

    @property
    def features(self) -> FeatureConfig: ...

    @property
    def staleness(self) -> StalenessSettings: ...

    @property
    def utility(self) -> Literal["heuristic", "contribution", "learned", "similarity"]: ...

    @property
    def contribution_group(self) -> float: ...

    @property
    def relevance_static(self) -> HeuristicUtility: ...

    @property
    def retrieval(self) -> Literal["hybrid", "dense", "lexical"]: ...

    @property
    def fusion(self) -> Literal["rrf", "bonus"]: ...

    @property
    def rrf_k(self) -> float: ...

    @property
    def lexical_weight(self) -> float: ...

    @property
    def static_prior(self) -> Literal["with_evidence", "always"]: ...

    @property
    def p_floor(self) -> float: ...

    @property
    def p_floor_exempt(self) -> float | None: ...

    @property
    def p_floor_reference(self) -> Literal["absolute", "best"]: ...

    @property
    def guard_top(self) -> int: ...

    @property
    def guard_min_shown(self) -> int: ...

    @property
    def guard_max_rate(self) -> float: ...

    @property
    def selection(self) -> Literal["knapsack", "greedy"]: ...

    @property
    def item_cost(self) -> float: ...

    @property
    def explore_serving(self) -> float: ...

    @property
    def explore_width(self) -> int: ...

    @property
    def explore_seed(self) -> int: ...

    @property
    def rerank(self) -> Literal["off", "store"]: ...

    def calibrates(self) -> bool:
        """Whether searches rank with the store's calibrated relevance prior."""
        ...

    def make_utility(self) -> UtilityModel:
        """The utility model that scores a pool under this policy."""
        ...
