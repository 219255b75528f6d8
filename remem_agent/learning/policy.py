"""The settings a feedback transaction reads: the protocol a configuration satisfies to be learned by.

``learning/feedback.py`` takes a :class:`LearningPolicy`, not ``RememConfig``: the package states what it reads,
and the configuration (``config.py``), built from the learning policies below, is the only side that imports
the other. ``RememConfig`` satisfies the protocol as it is.
"""

from __future__ import annotations

from typing import Protocol

from remem_agent.learning.credit import CreditPolicy
from remem_agent.learning.retention import RetentionPolicy
from remem_agent.learning.staleness import StalenessPolicy
from remem_agent.ranking.utility import HeuristicUtility


class LearningPolicy(Protocol):
    """Credit, staleness and retention policies, and how the relevance prior is recorded and calibrated."""

    @property
    def credit(self) -> CreditPolicy: ...

    @property
    def staleness(self) -> StalenessPolicy: ...

    @property
    def retention(self) -> RetentionPolicy: ...

    @property
    def relevance_static(self) -> HeuristicUtility: ...

    @property
    def contribution_calibration(self) -> float: ...
