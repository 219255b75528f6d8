"""The inference rules: what a later event says about an answer that is still waiting for its verdict.

* **A correction fails what relied on the corrected memory.** A new ``state`` fact that supersedes a memory
  is a correction of it; every waiting answer that *relied on* that memory (:func:`blamed`) failed, and the
  failure is blamed on the corrected memory, with full weight.
* **Moving on is a weak success.** The next question of the same thread, with no correction in between, says
  the previous answer was good enough; it is learned with weight :data:`WEAK_SUCCESS_WEIGHT`, because silence
  is weaker evidence than a user's "thanks".
* **The next user turn** of a conversation reads as one or the other (:func:`next_turn`), unless a judge model
  rates it instead.

Pure functions of their inputs: the agent, the gateway and the MCP server apply them alike.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from remem_agent.types import OutcomeSource

WEAK_SUCCESS_WEIGHT = 0.3  # an inferred "moved on without correcting" success counts this much


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A judgement of an earlier answer: a correction, moving on, the next user turn or a judge's rating."""

    success: bool | None  # None: no verdict (the judge was unsure)
    source: OutcomeSource
    weight: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "source": self.source, "weight": self.weight, "reason": self.reason}


class Answered(Protocol):
    """An answer as the rules see it: what it cited, and the served memories whose values it repeated."""

    @property
    def cited_ids(self) -> tuple[str, ...]: ...

    @property
    def used_ids(self) -> tuple[str, ...]: ...


def relied_on(answer: Answered) -> tuple[str, ...]:
    """What an agent's answer relied on: the memories it cited or whose values it repeated. An answer that was
    merely served a memory did not rely on it: a correction of that memory says nothing about the answer."""
    return (*answer.cited_ids, *answer.used_ids)


def blamed(corrected: Collection[str], relied_on: Collection[str]) -> list[str]:
    """The corrected memories an answer relied on, sorted: empty when the correction says nothing about it.

    What an answer relied on is what it cited or whose value it repeated (an agent's answer), or everything it
    was served when the caller reports no use (an MCP recall: the client's model read all of it)."""
    return sorted(set(corrected) & set(relied_on))


def corrected(blamed_ids: Collection[str], *, by: str) -> Verdict:
    """The failure of an answer whose memories ``blamed_ids`` a new fact ``by`` superseded."""
    return Verdict(
        success=False,
        source="inferred",
        weight=1.0,
        reason=f"a new fact ({by}) superseded served memories {sorted(blamed_ids)}",
    )


def moved_on(reason: str = "the next ask moved on") -> Verdict:
    """The weak success of an answer whose thread asked again with no correction in between."""
    return Verdict(success=True, source="inferred", weight=WEAK_SUCCESS_WEIGHT, reason=reason)


def next_turn(correction: bool) -> Verdict:
    """The next user turn's verdict on the previous answer without a judge: a correction, or moving on."""
    if correction:
        return Verdict(success=False, source="inferred", weight=1.0, reason="the next user turn reads as a correction")
    return moved_on("the user moved on")
