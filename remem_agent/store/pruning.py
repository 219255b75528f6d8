"""Bounded growth: waiting answers expire, and what only recorded traffic is pruned after a retention window.

A gateway that serves chats without feedback writes a search row and a waiting answer per request, forever.
Two limits keep the ledger's size bounded by its traffic over a window, not over its lifetime:

* **Answer TTL** (``answer_ttl_s``): an answer that got no verdict within the TTL *expires*. An expired answer
  has no outcome (never a failure): no later turn, correction or feedback can claim it
  (:mod:`remem_agent.store.pending` refuses claims past the TTL), an explicit feedback for it raises
  :class:`~remem_agent.errors.AnswerExpiredError`, and its search row stays for the record.
* **Retention** (``retention_s``, at least the TTL): rows older than the window that only recorded traffic are
  deleted, in batches, each batch one transaction:

  - searches that never got a verdict (no credit row points at them). How often each one served each memory,
    per task class, is added to ``retrieval_base`` first (ledger schema 13), so every learned statistic is
    kept: ``stats.retrieved`` still equals what the searches served plus that base, and ``verify()`` checks
    exactly that;
  - waiting answers that were settled or expired, and any of the pruned searches;
  - stored Responses-protocol rows whose items were already cleared (``store/responses.py``).

  Searches that got a verdict are the learning record (their credits are hashed and replayed by ``verify()``):
  they are kept, so the ledger grows with judged traffic only. Memories and their events are never pruned.

:func:`prune` is the whole sweep; ``ReMem.prune``, ``remem prune`` and the gateway's periodic sweep
(``remem serve --answer-ttl-days/--retention-days``) call it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from remem_agent.errors import UserInputError
from remem_agent.store.pending import EXPIRED_BY
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import from_json
from remem_agent.types import ALL_TASKS

T = TypeVar("T")
DAY_S = 86_400.0
DEFAULT_ANSWER_TTL_S = 7 * DAY_S  # the gateway's default: a verdict comes within a week or never
DEFAULT_RETENTION_S = 30 * DAY_S  # the gateway's default: unjudged traffic is kept a month
BATCH = 2_000  # searches per pruning transaction (a sweep never holds the writer lock for long)


class Transact(Protocol):
    """A store's ``transact``: run a function in one write transaction (retried on a lost conflict)."""

    def __call__(self, fn: Callable[[LedgerTx], T], /) -> T: ...


@dataclass(frozen=True, kw_only=True)
class GrowthLimits:
    """How long waiting answers and unjudged traffic are kept (seconds; ``None``: forever)."""

    answer_ttl_s: float | None = None
    retention_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("answer_ttl_s", "retention_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise UserInputError(f"{name} must be a positive number of seconds or None, got {value!r}")
        if self.retention_s is not None and (self.answer_ttl_s is None or self.retention_s < self.answer_ttl_s):
            raise UserInputError(
                "retention_s needs an answer_ttl_s no longer than itself: a search is pruned only once no answer "
                f"can still wait for it (answer_ttl_s={self.answer_ttl_s!r}, retention_s={self.retention_s!r})"
            )


@dataclass(frozen=True, kw_only=True)
class PruneReport:
    """What one sweep did."""

    expired_answers: int  # waiting answers that expired unjudged now
    pruned_searches: int  # unjudged searches deleted (their retrieval counts kept in retrieval_base)
    pruned_answers: int  # settled or expired waiting answers deleted
    pruned_responses: int  # cleared stored responses deleted


def expire_answers(tx: LedgerTx, *, before: float, at: float) -> int:
    """Mark every answer created before ``before`` that no verdict claimed as expired; how many."""
    cur = tx.run(
        "UPDATE pending_outcomes SET claimed_at = ?, claimed_by = ? WHERE claimed_at IS NULL AND created_at < ?",
        (at, EXPIRED_BY, before),
    )
    return int(cur.rowcount or 0)


def prune_searches(tx: LedgerTx, *, before: float, limit: int = BATCH) -> tuple[int, int, bool]:
    """Delete up to ``limit`` unjudged searches older than ``before`` and the waiting answers that point at
    them, adding what each deleted search served to ``retrieval_base``; (searches, answers, more may be left).

    Only the rows the ``DELETE ... RETURNING`` really removed are counted: a search another sweep deleted
    first, or that got its verdict meanwhile (``feedback IS NULL`` is checked again on the row), adds nothing."""
    ids = [
        str(r[0])
        for r in tx.run(
            "SELECT search_id FROM searches WHERE feedback IS NULL AND at < ? ORDER BY at LIMIT ?", (before, limit)
        ).fetchall()
    ]
    if not ids:
        return 0, 0, False
    marks = ",".join("?" * len(ids))
    answers = int(tx.run(f"DELETE FROM pending_outcomes WHERE search_id IN ({marks})", ids).rowcount or 0)
    tx.run(  # their stored decisions (exploratory serving) go with them
        f"DELETE FROM search_decisions WHERE search_id IN "
        f"(SELECT search_id FROM searches WHERE search_id IN ({marks}) AND feedback IS NULL)",
        ids,
    )
    gone = tx.run(
        f"DELETE FROM searches WHERE search_id IN ({marks}) AND feedback IS NULL RETURNING task, served", ids
    ).fetchall()
    counts: Counter[tuple[str, str]] = Counter()
    for task, served in gone:
        for item in from_json(served):
            counts[(str(item["id"]), ALL_TASKS)] += 1
            if task not in (None, ALL_TASKS):
                counts[(str(item["id"]), str(task))] += 1
    if counts:
        tx.update_many(
            "INSERT INTO retrieval_base (memory_id, task, retrieved) VALUES (?, ?, ?) ON CONFLICT (memory_id, task) "
            "DO UPDATE SET retrieved = retrieval_base.retrieved + excluded.retrieved",
            [(mid, task, n) for (mid, task), n in sorted(counts.items())],
        )
    return len(gone), answers, len(ids) == limit


def prune(transact: Transact, limits: GrowthLimits, *, now: float) -> PruneReport:
    """The whole sweep at time ``now``: expire, then prune in batches of :data:`BATCH` searches, then the settled
    answers and cleared responses; each step one write transaction of ``transact`` (a store's, which retries a
    transaction that lost a conflict with another writer or another sweep)."""
    expired = 0
    if limits.answer_ttl_s is not None:
        ttl = limits.answer_ttl_s
        expired = transact(lambda tx: expire_answers(tx, before=now - ttl, at=now))
    searches = answers = responses = 0
    if limits.retention_s is not None:
        before = now - limits.retention_s
        more = True
        while more:
            n, a, more = transact(lambda tx: prune_searches(tx, before=before))
            searches, answers = searches + n, answers + a

        def rest(tx: LedgerTx) -> tuple[int, int]:
            settled = tx.run("DELETE FROM pending_outcomes WHERE claimed_at IS NOT NULL AND created_at < ?", (before,))
            cleared = tx.run("DELETE FROM responses WHERE items IS NULL AND created_at < ?", (before,))
            return int(settled.rowcount or 0), int(cleared.rowcount or 0)

        settled, responses = transact(rest)
        answers += settled
    return PruneReport(
        expired_answers=expired, pruned_searches=searches, pruned_answers=answers, pruned_responses=responses
    )


def retrieval_base(tx: LedgerTx) -> dict[tuple[str, str], int]:
    """The retrieval counts of pruned searches, by (memory, task class) (for ``verify``)."""
    return {(str(m), str(t)): int(n) for m, t, n in tx.run("SELECT memory_id, task, retrieved FROM retrieval_base")}


def kept(tx: LedgerTx, scope: str | None = None) -> dict[str, int]:
    """What the ledger keeps of its traffic (of ``scope``, when given), for ``stats``: searches judged and
    not, answers waiting, settled and expired, and stored responses."""
    where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
    searches, judged = tx.search_counts(scope)
    waiting, expired, total = (
        int(v or 0)
        for v in tx.run(
            "SELECT SUM(CASE WHEN claimed_at IS NULL THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN claimed_by = ? THEN 1 ELSE 0 END), COUNT(*) FROM pending_outcomes {where}",
            (EXPIRED_BY, *args),
        ).fetchone()
    )
    responses = int(tx.run(f"SELECT COUNT(*) FROM responses {where}", args).fetchone()[0])
    return {
        "searches_judged": judged,
        "searches_unjudged": searches - judged,
        "answers_waiting": waiting,
        "answers_settled": total - waiting - expired,
        "answers_expired": expired,
        "responses": responses,
    }
