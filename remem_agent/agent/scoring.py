"""Score: turning an answer into an outcome, tagged with where the verdict came from.

* ``truth``: compared with ground truth by a scorer (exact match after normalisation by default).
* ``user``: a later explicit signal (``MemoryAgent.feedback``).
* ``inferred``: a correction of a served ``state`` memory is a failure blamed on it; the next ask in the
  same task with no correction in between is a weak success.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from remem_agent.types import OutcomeSource


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """A verdict about one answer and where it came from (``source``, the ledger's ``OutcomeSource``)."""

    success: bool
    source: OutcomeSource
    score: float = 1.0  # the scorer's graded score in [0, 1] (success is score >= threshold)
    weight: float = 1.0  # how strongly the outcome counts when learning (inferred ones count less)

    @classmethod
    def from_score(cls, score: float | bool, *, threshold: float = 1.0, source: OutcomeSource = "truth") -> Outcome:
        """The one way a graded score becomes an outcome: success is ``score >= threshold``."""
        value = float(score)
        return cls(success=value >= threshold, source=source, score=value)

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "source": self.source, "score": self.score, "weight": self.weight}


Scorer = Callable[[Mapping[str, Any], Any], float | bool]


def normalise_value(v: Any) -> str:
    s = unicodedata.normalize("NFKC", str(v)).casefold().strip()
    s = re.sub(r"\s+", " ", s)
    return s.strip(" .,;:!?\"'`")


def exact_match(answer: Mapping[str, Any], truth: Any) -> float:
    """Fraction of truth fields the answer matches after normalisation.

    ``truth`` as a mapping compares field by field; a scalar compares with the answer's ``answer`` field
    (or, if absent, its only field). Lists compare as sets of normalised items.
    """
    if isinstance(truth, Mapping):
        if not truth:
            return 1.0
        hits = sum(_same(answer.get(k), v) for k, v in truth.items())
        return hits / len(truth)
    if "answer" in answer:
        return float(_same(answer["answer"], truth))
    if len(answer) == 1:
        return float(_same(next(iter(answer.values())), truth))
    return 0.0


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, list | tuple | set):
        if not isinstance(got, list | tuple | set):
            return False
        return {normalise_value(x) for x in got} == {normalise_value(x) for x in want}
    if got is None:
        return False
    return normalise_value(got) == normalise_value(want)
