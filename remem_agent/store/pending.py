"""Answers waiting for their outcome, kept in the ledger (table ``pending_outcomes``, schema version 6).

An answer given without ground truth waits until its verdict arrives: an explicit feedback, the next turn
of its conversation, a new fact that corrects what it relied on. In one process that state can live in
memory (:class:`~remem_agent.outcomes.pending.PendingOutcomes`); when several processes serve one store
(``remem serve --workers N``, two gateways on one PostgreSQL ledger) the next turn may reach a process that
never saw the answer, so the waiting answer is a ledger row that any process can claim.

The rules, in SQL both backends run alike:

* **one claim**: a verdict first claims its row, ``UPDATE ... WHERE claimed_at IS NULL RETURNING``, in its
  own write transaction; of two processes racing for one answer exactly one gets the row back, the other
  nothing (PostgreSQL re-checks the ``WHERE`` after waiting for the row lock; SQLite has one writer at a
  time). The search's own ``feedback IS NULL`` guard (``LedgerTx.record_feedback``) stays underneath.
* **the latest of a thread**: a thread is a conversation (``conv:<id>``), the point a conversation without
  an id stands at after an answer (``after:<transcript digest>``) or an ``ask`` task class (``task:<class>``)
  inside one scope; the next turn claims the thread's newest row, and only while it
  is unclaimed (an answer already judged by feedback is not judged again, and an older one is not
  reached past it), as the in-process store does.
* **release**: a claim whose feedback the ledger refused is released (``claimed_at`` back to NULL), so the
  answer can be judged again.

What a crash loses: a claim and its feedback are two transactions, so a process that dies between them
leaves the answer claimed and uncredited (never credited twice). Corrections by a
new fact look at the newest :data:`WAITING_LIMIT` unclaimed rows, as the in-process store keeps at most
that many. ``remem migrate`` does not copy this table: a migrated store starts with no waiting answers.

Expiry and pruning (:mod:`remem_agent.store.pruning`): with an answer TTL, the claims below take only answers
created within it (``fresh_after``), a sweep marks older unclaimed rows ``claimed_by = 'expired'``, and rows
past the retention window are deleted; an explicit feedback for an expired answer is told so (:func:`expired`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import from_json

WAITING_LIMIT = 10_000  # unclaimed rows a correction by a new fact looks through (the newest)
EXPIRED_BY = "expired"  # claimed_by of an answer that expired without a verdict (store/pruning.py)

_COLS = "answer_id, scope, thread, turn, search_id, served_ids, cited_ids, used_ids, value, created_at"


@dataclass(frozen=True, kw_only=True)
class PendingRecord:
    """One waiting answer, as the ledger holds it."""

    answer_id: str
    scope: str
    thread: str  # "conv:<scope>|<conversation id>", "after:<scope>|<transcript digest>" or "task:<scope>|<task class>"
    turn: str  # which user turn of the thread the answer belongs to ("" when turns do not apply)
    search_id: str
    served_ids: tuple[str, ...]
    cited_ids: tuple[str, ...]
    used_ids: tuple[str, ...]
    value: Any  # the answer's value (JSON) for value-use credit; None for a chat reply
    created_at: float


def _record(r: Any) -> PendingRecord:
    return PendingRecord(
        answer_id=str(r[0]),
        scope=str(r[1]),
        thread=str(r[2]),
        turn=str(r[3]),
        search_id=str(r[4]),
        served_ids=tuple(from_json(r[5])),
        cited_ids=tuple(from_json(r[6])),
        used_ids=tuple(from_json(r[7])),
        value=from_json(r[8]) if r[8] is not None else None,
        created_at=float(r[9]),
    )


def put(tx: LedgerTx, rec: PendingRecord) -> None:
    """Add a waiting answer, or update the thread, citations and value use of one still waiting (a tool loop's
    later reply of the same turn: the history now ends with that reply); a claimed row is left as it is."""
    tx.run(
        f"INSERT INTO pending_outcomes ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT (answer_id) DO UPDATE SET thread = excluded.thread, cited_ids = excluded.cited_ids, "
        "used_ids = excluded.used_ids, value = excluded.value WHERE pending_outcomes.claimed_at IS NULL",
        (
            rec.answer_id,
            rec.scope,
            rec.thread,
            rec.turn,
            rec.search_id,
            json.dumps(list(rec.served_ids)),
            json.dumps(list(rec.cited_ids)),
            json.dumps(list(rec.used_ids)),
            None if rec.value is None else json.dumps(rec.value, sort_keys=True, default=str),
            rec.created_at,
        ),
    )


def claim(
    tx: LedgerTx, answer_id: str, *, scope: str | None, by: str, at: float, fresh_after: float | None = None
) -> PendingRecord | None:
    """Claim one waiting answer (of ``scope``, when given; created at or after ``fresh_after``, when given:
    an older one has expired); None if unknown, claimed, expired, or of another scope."""
    where = "answer_id = ? AND claimed_at IS NULL" + (" AND scope = ?" if scope is not None else "")
    args: tuple[Any, ...] = (at, by, answer_id) + ((scope,) if scope is not None else ())
    if fresh_after is not None:
        where += " AND created_at >= ?"
        args += (fresh_after,)
    r = tx.run(
        f"UPDATE pending_outcomes SET claimed_at = ?, claimed_by = ? WHERE {where} RETURNING {_COLS}", args
    ).fetchone()
    return _record(r) if r is not None else None


def judged(tx: LedgerTx, answer_id: str, *, scope: str | None) -> PendingRecord | None:
    """The answer (of ``scope``, when given) if a verdict already claimed it; None if waiting, expired or
    unknown."""
    where = "answer_id = ? AND claimed_at IS NOT NULL AND claimed_by <> ?" + (
        " AND scope = ?" if scope is not None else ""
    )
    args: tuple[Any, ...] = (answer_id, EXPIRED_BY) + ((scope,) if scope is not None else ())
    r = tx.run(f"SELECT {_COLS} FROM pending_outcomes WHERE {where}", args).fetchone()
    return _record(r) if r is not None else None


def latest(tx: LedgerTx, thread: str, *, fresh_after: float | None = None) -> PendingRecord | None:
    """The thread's newest answer if it is still waiting (and not expired: created at or after
    ``fresh_after``, when given); None otherwise."""
    r = tx.run(
        f"SELECT {_COLS}, claimed_at FROM pending_outcomes WHERE thread = ? ORDER BY seq DESC LIMIT 1", (thread,)
    ).fetchone()
    if r is None or r[-1] is not None or (fresh_after is not None and float(r[9]) < fresh_after):
        return None
    return _record(r)


def claim_latest(
    tx: LedgerTx, thread: str, *, by: str, at: float, fresh_after: float | None = None
) -> PendingRecord | None:
    """Claim the thread's newest answer if it is still waiting (and not expired, as in :func:`latest`)."""
    fresh = "" if fresh_after is None else " AND created_at >= ?"
    r = tx.run(
        f"UPDATE pending_outcomes SET claimed_at = ?, claimed_by = ? WHERE claimed_at IS NULL{fresh} AND seq = "
        f"(SELECT MAX(seq) FROM pending_outcomes WHERE thread = ?) RETURNING {_COLS}",
        (at, by, *(() if fresh_after is None else (fresh_after,)), thread),
    ).fetchone()
    return _record(r) if r is not None else None


def expired(tx: LedgerTx, answer_id: str, *, scope: str | None, fresh_after: float | None) -> bool:
    """Whether the ledger holds this answer (of ``scope``, when given) and it expired without a verdict: a
    sweep marked it, or it is unclaimed and older than ``fresh_after``."""
    r = tx.run(
        "SELECT claimed_at, claimed_by, created_at, scope FROM pending_outcomes WHERE answer_id = ?", (answer_id,)
    ).fetchone()
    if r is None or (scope is not None and r[3] != scope):
        return False
    if r[0] is not None:
        return bool(r[1] == EXPIRED_BY)
    return fresh_after is not None and float(r[2]) < fresh_after


def release(tx: LedgerTx, answer_id: str) -> None:
    """Undo a claim whose verdict could not be recorded."""
    tx.run("UPDATE pending_outcomes SET claimed_at = NULL, claimed_by = NULL WHERE answer_id = ?", (answer_id,))


def _waiting_where(
    scope: str | None, thread_prefix: str | None, fresh_after: float | None = None
) -> tuple[str, tuple[Any, ...]]:
    where = "claimed_at IS NULL"
    args: list[Any] = []
    if fresh_after is not None:
        where += " AND created_at >= ?"
        args.append(fresh_after)
    if scope is not None:
        where += " AND scope = ?"
        args.append(scope)
    if thread_prefix is not None:  # substr, not LIKE: exact and case-sensitive on both backends
        where += " AND substr(thread, 1, ?) = ?"
        args += [len(thread_prefix), thread_prefix]
    return where, tuple(args)


def waiting(
    tx: LedgerTx,
    *,
    limit: int = WAITING_LIMIT,
    scope: str | None = None,
    thread_prefix: str | None = None,
    fresh_after: float | None = None,
) -> list[PendingRecord]:
    """The newest ``limit`` unclaimed answers (of ``scope``, of threads starting with ``thread_prefix``,
    created at or after ``fresh_after``, when given), newest first."""
    where, args = _waiting_where(scope, thread_prefix, fresh_after)
    rows = tx.run(
        f"SELECT {_COLS} FROM pending_outcomes WHERE {where} ORDER BY seq DESC LIMIT ?", (*args, limit)
    ).fetchall()
    return [_record(r) for r in rows]


def count_waiting(tx: LedgerTx, *, scope: str | None = None, thread_prefix: str | None = None) -> int:
    """How many answers are unclaimed (filtered as in :func:`waiting`)."""
    where, args = _waiting_where(scope, thread_prefix)
    return int(tx.run(f"SELECT count(*) FROM pending_outcomes WHERE {where}", args).fetchone()[0])


def scope_of(tx: LedgerTx, answer_id: str) -> str | None:
    """The scope an answer was given in (waiting or judged); None if the ledger never held it."""
    r = tx.run("SELECT scope FROM pending_outcomes WHERE answer_id = ?", (answer_id,)).fetchone()
    return str(r[0]) if r is not None else None


def problems(tx: LedgerTx, limit: int = 50) -> list[str]:
    """Waiting answers that point at no search, or at a search of another scope (for ``verify``)."""
    rows = tx.run(
        "SELECT p.answer_id, p.search_id, p.scope, s.scope FROM pending_outcomes p "
        "LEFT JOIN searches s ON s.search_id = p.search_id "
        "WHERE s.search_id IS NULL OR s.scope <> p.scope ORDER BY p.seq LIMIT ?",
        (limit,),
    ).fetchall()
    out = []
    for answer_id, search_id, scope, search_scope in rows:
        if search_scope is None:
            out.append(f"pending answer {answer_id} points at search {search_id}, which the ledger does not hold")
        else:
            out.append(
                f"pending answer {answer_id} (scope {scope!r}) points at search {search_id} of scope {search_scope!r}"
            )
    return out
