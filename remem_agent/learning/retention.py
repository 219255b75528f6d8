"""Adaptive retention: demote what is shown often and never helps, revive what helps again.

The policy reacts to *evidence of uselessness when shown* (exposures with no credit), never to low
retrieval frequency: a rarely needed memory that is never shown is never demoted (reference §5).

* ACTIVE -> LOW_VALUE: shown at least ``min_exposures`` times in the task class of this feedback with a
  posterior contribution rate below ``low_rate`` there, and not helpful in any other class (demotions are
  per task class: "useless for deploys" is not "useless for approvals").
* LOW_VALUE -> COMPRESSED: still useless after ``compress_exposures``; a shorter text is served, the
  original is kept in ``original_text``.
* COMPRESSED -> ARCHIVED: still useless after ``archive_exposures``, and only if the memory has never
  accumulated credit: memories with credit are never archived.
* LOW_VALUE | COMPRESSED | ARCHIVED -> ACTIVE: credited use (credit >= ``revive_credit``) revives it.

Every transition is logged with its reason and the statistics that triggered it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.tokens import count_tokens
from remem_agent.types import ALL_TASKS, CreditRecord, Event, Memory, State, TaskStats

log = logging.getLogger(__name__)

_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "by",
        "with",
        "and",
        "or",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "this",
        "that",
        "it",
        "its",
    ]
)


def compress_text(text: str, ratio: float = 0.5, min_words: int = 6) -> str:
    """A deterministic extractive compression: first sentence, function words dropped, truncated."""
    first = re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]
    words = first.split()
    kept = [w for w in words if w.lower().strip(",;:") not in _STOP] or words
    target = max(min_words, int(len(text.split()) * ratio))
    out = " ".join(kept[:target])
    if len(kept) > target or len(first) < len(text.strip()):
        out = out.rstrip(",;:.") + " …"
    return out if len(out) < len(text) else text


@dataclass(frozen=True)
class RetentionPolicy:
    enabled: bool = True
    min_exposures: int = 5
    low_rate: float = 0.2
    helpful_rate: float = 0.4  # a class with this posterior rate (and >= 1 credit) protects from demotion
    compress_exposures: int = 10
    archive_exposures: int = 20
    revive_credit: float = 0.5
    compress_ratio: float = 0.5

    def after_feedback(
        self,
        tx: LedgerTx,
        memories: Mapping[str, Memory],
        stats: Mapping[str, Mapping[str, TaskStats]],
        records: Sequence[CreditRecord],
        *,
        at: float,
    ) -> list[Event]:
        """Apply the transitions one feedback justifies; returns the logged events."""
        if not self.enabled:
            return []
        events: list[Event] = []
        for rec in records:
            m = memories.get(rec.memory_id)
            if m is None or m.state in (State.INVALIDATED, State.ERASED):
                continue
            by_class = stats.get(rec.memory_id, {})
            ev = self._decide(m, by_class, rec)
            if ev is None:
                continue
            event, reason, evidence, updates = ev
            # Not worth a wait: this feedback holds statistics rows, and the memory's holder may be an add
            # superseding it. A skipped move is made by a later feedback if its statistics still call for it.
            done = tx.transition_unless_busy(m.id, event, reason=reason, at=at, evidence=evidence, updates=updates)
            if done is None:
                log.debug("retention skipped %s of %s: another writer holds its row", event.value, m.id)
            else:
                events.append(done)
        return events

    def _decide(
        self, m: Memory, by_class: Mapping[str, TaskStats], rec: CreditRecord
    ) -> tuple[LifecycleEvent, str, dict[str, object], dict[str, object] | None] | None:
        cls = rec.task or ALL_TASKS
        s = by_class.get(cls)
        overall = by_class.get(ALL_TASKS)
        if s is None or overall is None:
            return None
        evidence: dict[str, object] = {
            "task": cls,
            "shown": s.shown,
            "credit_sum": round(s.credit_sum, 4),
            "rate": round(s.contribution_rate, 4),
            "search_id": rec.search_id,
        }
        if m.state in (State.LOW_VALUE, State.COMPRESSED, State.ARCHIVED):
            if rec.credit >= self.revive_credit:
                updates = {"text": m.original_text, "token_cost": count_tokens(m.original_text)}
                return (
                    LifecycleEvent.REVIVE,
                    f"revived by credited use (credit {rec.credit:g}) in task class {cls!r}",
                    evidence,
                    updates if m.text != m.original_text else None,
                )
            if rec.credit > 0:
                return None
        useless_here = s.shown >= self.min_exposures and s.contribution_rate < self.low_rate
        if not useless_here:
            return None
        helpful_elsewhere = [
            t
            for t, st in by_class.items()
            if t not in (cls, ALL_TASKS) and st.credited > 0 and st.contribution_rate >= self.helpful_rate
        ]
        if helpful_elsewhere:
            return None
        if m.state is State.ACTIVE:
            return (
                LifecycleEvent.DEMOTE,
                f"shown {s.shown}x in task class {cls!r}, posterior contribution rate {s.contribution_rate:.2f} "
                f"< {self.low_rate}",
                evidence,
                None,
            )
        if m.state is State.LOW_VALUE and s.shown >= self.compress_exposures:
            short = compress_text(m.original_text, self.compress_ratio)
            if short == m.original_text:
                return None
            return (
                LifecycleEvent.COMPRESS,
                f"still useless after {s.shown} exposures in {cls!r}: serving a shorter text",
                evidence,
                {"text": short, "token_cost": count_tokens(short)},
            )
        if m.state is State.COMPRESSED and s.shown >= self.archive_exposures and overall.credit_sum == 0:
            return (
                LifecycleEvent.ARCHIVE,
                f"never credited in {overall.shown} exposures; archived (kept, not served)",
                evidence,
                None,
            )
        return None
