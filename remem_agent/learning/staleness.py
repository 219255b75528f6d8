"""Supersession at ingest: when a new fact replaces an old one.

The library rule (reference design §6, "Library supersession rule"): two role-``state`` facts with
the same (entity, attribute) key replace each other; ``preference`` and ``note`` never supersede.
Wording is still read, for two reasons: explicit update wording ("moved to", "no longer",
"migrated") is recorded as evidence of the supersession, and wording that reads like an *additional*
value ("also uses Memcached") triggers a UserWarning, because storing a multi-valued attribute as
``state`` silently retires the earlier values.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.types import CreditRecord, Event, Memory, State

_UPDATE_PATTERNS = [
    r"\bmoved (?:to|from|over)\b",
    r"\bno longer\b",
    r"\bnot any ?more\b",
    r"\bmigrat(?:ed|ing|ion)\b",
    r"\bswitched (?:to|from|over)\b",
    r"\bchanged (?:to|from)\b",
    r"\bupdated to\b",
    r"\breplaced (?:by|with)\b",
    r"\binstead of\b",
    r"\bnow (?:is|uses|lives|runs|on|in|at|owned|handled)\b",
    r"\brelocated\b",
    r"\brenamed\b",
    r"\bformerly\b",
    r"\bpreviously\b",
    r"\bas of (?:today|now)\b",
]
_ADDITIVE_PATTERNS = [
    r"\balso\b",
    r"\bas well\b",
    r"\bin addition\b",
    r"\badditionally\b",
    r"\banother\b",
    r"\btoo\s*[.!]?\s*$",
    r"\bbesides\b",
    r"\balongside\b",
]
_UPDATE_RE = re.compile("|".join(_UPDATE_PATTERNS), re.IGNORECASE)
_ADDITIVE_RE = re.compile("|".join(_ADDITIVE_PATTERNS), re.IGNORECASE)


def update_wording(text: str) -> str | None:
    """The explicit update phrase in ``text`` ("moved to", "no longer", ...), if any."""
    m = _UPDATE_RE.search(text)
    return m.group(0).lower() if m else None


def additive_wording(text: str) -> str | None:
    """A phrase suggesting an additional value rather than a replacement ("also", ...)."""
    if update_wording(text):
        return None
    m = _ADDITIVE_RE.search(text)
    return m.group(0).strip().lower() if m else None


# Whitespace is folded by ``" ".join(t.split())``: the same text as ``re.sub(r"\s+", " ", t).strip()`` (both
# take str.isspace's characters as whitespace) in a third of the time; every add folds its fact's entity and
# attribute, and normalises texts to compare.


def normalise(text: str) -> str:
    """Text compared for restatements: NFKC, case-folded, whitespace and end punctuation folded."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).rstrip(" .!;")


# --- outcome-driven staleness and the learned single-valued-attribute schema ----------------------

SupersessionMode = Literal["key", "learned"]


@dataclass(frozen=True)
class StalenessPolicy:
    """Staleness beyond ingest (reference §6 and §8.3).

    * Outcome-triggered invalidation: a failed action that *used* memory M while a newer fact with the
      same key is current supersedes M.
    * Learned schema (``mode="learned"``): same-key facts only supersede when the attribute is known to
      be single-valued or the new fact uses explicit update wording. An attribute becomes single-valued
      after ``min_confirmations`` confirmations (failed actions that used a stale value, or explicit
      replacement wording) with posterior >= ``min_posterior``; counter-evidence (an older value still
      credited after a newer one arrived) blocks it. Pending conflicts are superseded retroactively.
    * Confidence decays with age only for attributes observed to change, so old-but-true facts are not
      punished for age (applied at ranking time).
    """

    mode: SupersessionMode = "key"
    outcome_invalidation: bool = True
    min_confirmations: int = 2
    min_posterior: float = 0.6
    decay_half_life_days: float = 180.0

    def supersedes_on_key(self, tx: LedgerTx, attribute: str, wording: str | None) -> bool:
        if self.mode == "key" or wording:
            return True
        info = tx.attributes([attribute]).get(attribute)
        return bool(info and info.single_valued)

    @staticmethod
    def acts_on(memory: Memory | None, used: bool) -> bool:
        """Whether ``after_feedback`` may invalidate or count this served memory: a used, keyed 'state' fact."""
        return used and memory is not None and memory.key is not None and memory.role == "state"

    @classmethod
    def attributes_at_stake(cls, memories: Mapping[str, Memory], used: Iterable[str]) -> set[str]:
        """The attributes whose facts or counters a feedback using ``used`` may change (``lock_attributes``)."""
        at_stake: set[str] = set()
        for mid in used:
            m = memories.get(mid)
            if m is not None and m.attribute is not None and cls.acts_on(m, True):
                at_stake.add(m.attribute)
        return at_stake

    def after_feedback(
        self, tx: LedgerTx, memories: Mapping[str, Memory], records: Sequence[CreditRecord], *, at: float
    ) -> list[Event]:
        """Outcome-triggered invalidation and schema evidence. The caller holds ``attributes_at_stake``'s locks."""
        events: list[Event] = []
        for rec in records:
            m = memories.get(rec.memory_id)
            if m is None or not self.acts_on(m, rec.used):
                continue
            m = tx.memory(m.id)  # fresh: an earlier record of this feedback may have retired it already
            if m.state in (State.INVALIDATED, State.ERASED):
                continue
            assert m.entity is not None and m.attribute is not None
            newer = [
                x
                for x in tx.current_for_key(m.entity, m.attribute, m.scope)
                if x.id != m.id and x.valid_from > m.valid_from
            ]
            if not newer:
                continue
            if not rec.success and self.outcome_invalidation:
                repl = min(newer, key=lambda x: x.valid_from)
                events.append(
                    tx.transition(
                        m.id,
                        LifecycleEvent.INVALIDATE,
                        reason=f"outcome-triggered: a failed action used this fact while newer fact {repl.id} "
                        "with the same entity+attribute exists",
                        at=at,
                        evidence={"by": repl.id, "search_id": rec.search_id, "key": [m.entity, m.attribute]},
                        updates={"valid_to": repl.valid_from, "superseded_by": repl.id},
                    )
                )
                tx.bump_attribute(m.attribute, changes=1, confirmations=1)
                events += self.maybe_learn(tx, m.attribute, at=at)
            elif rec.success and rec.credit > 0:
                tx.bump_attribute(m.attribute, counter=1)  # the older value still helped: not single-valued
        return events

    def maybe_learn(self, tx: LedgerTx, attribute: str, *, at: float) -> list[Event]:
        """Mark ``attribute`` single-valued once the evidence suffices; supersede pending conflicts."""
        if self.mode != "learned":
            return []
        info = tx.attributes([attribute]).get(attribute)
        if (
            info is None
            or info.single_valued
            or info.counter > 0
            or info.confirmations < self.min_confirmations
            or info.single_valued_posterior < self.min_posterior
        ):
            return []
        tx.mark_single_valued(attribute, at)
        events: list[Event] = []
        for scope, entity in tx.current_keys(attribute):
            facts = tx.current_for_key(entity, attribute, scope)
            newest = facts[-1]
            for old in facts[:-1]:
                events.append(
                    tx.transition(
                        old.id,
                        LifecycleEvent.INVALIDATE,
                        reason=f"retroactive: attribute {attribute!r} was learned to be single-valued "
                        f"({info.confirmations} confirmations); superseded by {newest.id}",
                        at=at,
                        evidence={"by": newest.id, "key": [entity, attribute], "learned": True},
                        updates={"valid_to": max(newest.valid_from, old.valid_from), "superseded_by": newest.id},
                    )
                )
        return events
