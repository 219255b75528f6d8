"""Erasure: what one ledger transaction does to forget memories (schema 14), on either backend.

The ledger keeps everything, and a user may still demand that their data be erased, or an operator that a
secret pasted into a memory be removed. An erased memory keeps its row and its events, redacted, so that the
history of every other memory (which fact replaced which, when) and every learned statistic stay intact and
``verify()`` still passes:

* the row: state ``ERASED`` (terminal, never served, not even by an ``as_of`` search), empty text and
  original text, a zero vector, no entity, attribute, speaker or session, no token cost; its content hash is
  recomputed over that redacted record; its ``memory_times`` rows and lexical postings are deleted (SQLite's
  full-text triggers replace its entry by the empty text);
* its events: kind, time and states stay; reasons become ``[erased]``, evidence keeps only the ids it names
  (``by``, ``search_id``) and the ``learned`` flag, recorded text becomes empty; each hash is recomputed;
* events of other memories that name it as their replacement (``"by"``): the new fact's text and update
  wording they quote are dropped from evidence and reason;
* answers waiting for their outcome that served it are dropped (their recorded answer may quote it);
* searches of its scope whose query contains its whole text, and stored responses of its scope whose items
  do, are redacted (the query becomes ``[erased]``, the response's items are cleared) when that text is at
  least :data:`MIN_MATCH` characters (a shorter one would match unrelated text); an operator's ``contains``
  string is searched for whatever its length (at least 4 characters, checked by the caller);
* one ``erase`` event records when, and the operator's reason (never the text).

Erasing a whole scope also redacts every query of the scope, drops its waiting answers and clears its stored
responses. Everything happens in the caller's transaction: a crash leaves all of it or none of it. Freed
pages may still hold the bytes until the store's files are rewritten (``Store.scrub``, run by
``ReMem.erase``), and trace files are the caller's (``remem_agent.erasure``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from remem_agent.errors import StoreError, UnknownMemoryError
from remem_agent.store import hashing
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import from_json
from remem_agent.types import State

REDACTED = "[erased]"
MIN_MATCH = 12  # characters: a text shorter than this is not searched for in queries, responses and traces
# What an erased memory's events keep of their evidence: ids and a flag, never text or keys.
_KEPT_EVIDENCE = frozenset({"by", "search_id", "learned"})
# Evidence of another memory's event that quotes the erased memory (its replacement): dropped.
_QUOTING_EVIDENCE = ("new_text", "wording", "text")


@dataclass(frozen=True, kw_only=True)
class Erased:
    """What one erasure transaction did. ``texts`` (the erased strings worth searching for) and the search and
    answer ids are for scrubbing trace files after the commit; they are never stored or reported."""

    memories: tuple[str, ...] = ()
    already_erased: tuple[str, ...] = ()
    events_redacted: int = 0
    answers_dropped: int = 0
    searches_redacted: int = 0
    responses_cleared: int = 0
    texts: frozenset[str] = field(default_factory=frozenset, repr=False)
    search_ids: frozenset[str] = field(default_factory=frozenset, repr=False)
    answer_ids: frozenset[str] = field(default_factory=frozenset, repr=False)


def _like(value: str) -> str:
    """``value`` as a LIKE pattern of itself (``\\`` escapes), for ``LIKE ? ESCAPE '\\'``."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def select_ids(
    tx: LedgerTx,
    *,
    scope: str | None,
    entity: str | None = None,
    attribute: str | None = None,
    speaker: str | None = None,
    session: str | None = None,
    role: str | None = None,
    contains: str | None = None,
) -> list[str]:
    """Ids of the memories (not yet erased) matching every given filter, in insertion order. ``contains`` is
    an exact, case-sensitive substring of the text or the original text."""
    where, args = ["state != 'ERASED'"], []
    for column, value in (
        ("scope", scope),
        ("entity", entity),
        ("attribute", attribute),
        ("speaker", speaker),
        ("session", session),
        ("role", role),
    ):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if contains is not None:  # LIKE narrows (SQLite's ignores ASCII case); the exact test is below
        where.append("(text LIKE ? ESCAPE '\\' OR original_text LIKE ? ESCAPE '\\')")
        args += [f"%{_like(contains)}%"] * 2
    rows = tx.run(f"SELECT id, text, original_text FROM memories WHERE {' AND '.join(where)} ORDER BY seq", args)
    return [str(r[0]) for r in rows if contains is None or contains in str(r[1]) or contains in str(r[2])]


def erase(
    tx: LedgerTx,
    ids: Sequence[str],
    *,
    at: float,
    reason: str,
    scope: str | None = None,
    also: Iterable[str] = (),
) -> Erased:
    """Erase the memories ``ids`` (of ``scope`` only, when given: another scope's id is unknown). Every id is
    checked before anything is written: an unknown one raises ``UnknownMemoryError`` and changes nothing. An
    already erased memory is reported, not erased again. ``also``: more strings to redact from the scope's
    queries and responses (an operator's ``contains``)."""
    rows = {}
    for mid in dict.fromkeys(ids):
        r = tx.run(
            "SELECT id, scope, state, text, original_text, role, tasks, created_at, valid_from, embedding "
            f"FROM memories WHERE id = ?{tx.lock_suffix}",
            (mid,),
        ).fetchone()
        if r is None or (scope is not None and r[1] != scope):
            raise UnknownMemoryError(mid)
        rows[mid] = r
    erased, already = [], []
    explicit = {s for s in also if s}  # the operator's own strings: searched for whatever their length
    texts: set[str] = set(explicit)
    by_scope: dict[str, set[str]] = {}
    redacted = 0
    for mid, r in rows.items():
        if r[2] == State.ERASED.value:
            already.append(mid)
            continue
        quoted = _erase_row(tx, r, at=at, reason=reason)
        redacted += quoted[0]
        found = {s for s in (str(r[3]), str(r[4]), *quoted[1]) if len(s) >= MIN_MATCH}
        texts |= found
        by_scope.setdefault(str(r[1]), set()).update(found | explicit)
        erased.append(mid)
    answers, answer_ids = _drop_answers(tx, erased)
    searches = responses = 0
    for sc, strings in by_scope.items():
        searches += _redact_queries(tx, sc, strings)
        responses += _clear_responses(tx, sc, strings)
    return Erased(
        memories=tuple(erased),
        already_erased=tuple(already),
        events_redacted=redacted,
        answers_dropped=answers,
        searches_redacted=searches,
        responses_cleared=responses,
        texts=frozenset(texts),
        answer_ids=frozenset(answer_ids),
    )


def erase_scope_traffic(tx: LedgerTx, scope: str) -> Erased:
    """A whole scope's traffic (run with ``erase`` of all its memories): every query redacted, every waiting
    answer dropped, every stored response cleared. Judged searches keep their served ids and verdicts (the
    statistics they fed stay; they hold no text)."""
    search_ids = {str(r[0]) for r in tx.run("SELECT search_id FROM searches WHERE scope = ?", (scope,))}
    searches = _redact_where(tx, "scope = ? AND query != ?", (scope, REDACTED))
    answer_ids = {str(r[0]) for r in tx.run("SELECT answer_id FROM pending_outcomes WHERE scope = ?", (scope,))}
    answers = tx.run("DELETE FROM pending_outcomes WHERE scope = ?", (scope,)).rowcount
    responses = tx.run("UPDATE responses SET items = NULL WHERE scope = ? AND items IS NOT NULL", (scope,)).rowcount
    return Erased(
        answers_dropped=max(0, int(answers)),
        searches_redacted=searches,
        responses_cleared=max(0, int(responses)),
        search_ids=frozenset(search_ids),
        answer_ids=frozenset(answer_ids),
    )


def _erase_row(tx: LedgerTx, r: Sequence[Any], *, at: float, reason: str) -> tuple[int, set[str]]:
    """Redact one memory's row and events, log its ``erase`` event; returns (events redacted, the texts its
    events and its replaced memories' events quoted)."""
    mid, state = str(r[0]), State(r[2])
    tasks = from_json(r[6]) if isinstance(r[6], str | bytes) else r[6]
    zero = np.zeros(tx.load_vector(r[9]).shape, dtype=np.float32)
    content_hash = hashing.memory_hash(mid, "", None, None, str(r[5]), list(tasks), float(r[7]), float(r[8]))
    tx.run(
        "UPDATE memories SET state = ?, text = ?, original_text = ?, entity = NULL, attribute = NULL, "
        "speaker = NULL, session = NULL, token_cost = 0, embedding = ?, content_hash = ? WHERE id = ?",
        (State.ERASED.value, "", "", tx.dump_vector(zero), content_hash, mid),
    )
    tx.run("DELETE FROM memory_times WHERE memory_id = ?", (mid,))
    tx.forget_row(mid, text_changed=True)
    tx.text_updated(mid)
    quoted: set[str] = set()
    n = _redact_own_events(tx, mid, quoted)
    n += _redact_replaced_events(tx, mid, quoted | {str(r[3]), str(r[4])})
    tx.append_event(mid, at, LifecycleEvent.ERASE, state, State.ERASED, reason, {}, {"text": "", "token_cost": 0})
    return n, quoted


def _rewrite_event(
    tx: LedgerTx, seq: int, head: Sequence[Any], reason: str, evidence: Mapping[str, Any], updates: Any
) -> None:
    """Store an event's redacted reason, evidence and updates with the hash of the redacted record."""
    mid, ev_at, kind, frm, to = head
    ev_json = json.dumps(dict(evidence), sort_keys=True)
    up_json = None if updates is None else json.dumps(updates, sort_keys=True)
    ev_hash = hashing.event_hash(mid, ev_at, kind, frm, to, reason, json.loads(ev_json), updates)
    tx.run(
        "UPDATE events SET reason = ?, evidence = ?, updates = ?, hash = ? WHERE seq = ?",
        (reason, ev_json, up_json, ev_hash, seq),
    )


def _redact_own_events(tx: LedgerTx, mid: str, quoted: set[str]) -> int:
    rows = tx.run(
        "SELECT seq, memory_id, at, kind, from_state, to_state, evidence, updates FROM events "
        "WHERE memory_id = ? ORDER BY seq",
        (mid,),
    ).fetchall()
    for seq, *head, evidence, updates in rows:
        ev = from_json(evidence) if evidence is not None else {}
        up = None if updates is None else (from_json(updates) if isinstance(updates, str | bytes) else dict(updates))
        quoted.update(str(v) for k, v in ev.items() if k in _QUOTING_EVIDENCE and isinstance(v, str))
        if up is not None and isinstance(up.get("text"), str):
            quoted.add(up["text"])
            up["text"] = ""
        kept = {k: v for k, v in ev.items() if k in _KEPT_EVIDENCE}
        _rewrite_event(tx, int(seq), head, REDACTED, kept, up)
    return len(rows)


def _redact_replaced_events(tx: LedgerTx, mid: str, texts: set[str]) -> int:
    """Events of the memories ``mid`` replaced (their evidence names it as "by"): drop what quotes it."""
    rows = tx.run(
        "SELECT e.seq, e.memory_id, e.at, e.kind, e.from_state, e.to_state, e.reason, e.evidence, e.updates "
        "FROM events e JOIN memories m ON m.id = e.memory_id WHERE m.superseded_by = ? ORDER BY e.seq",
        (mid,),
    ).fetchall()
    n = 0
    for seq, *head, reason, evidence, updates in rows:
        ev = from_json(evidence) if evidence is not None else {}
        if ev.get("by") != mid:
            continue
        strings = texts | {str(ev[k]) for k in _QUOTING_EVIDENCE if isinstance(ev.get(k), str)}
        new_reason = str(reason)
        for s in sorted((s for s in strings if s), key=len, reverse=True):
            new_reason = new_reason.replace(s, REDACTED)
        new_ev = {k: v for k, v in ev.items() if k not in _QUOTING_EVIDENCE}
        up = None if updates is None else (from_json(updates) if isinstance(updates, str | bytes) else dict(updates))
        _rewrite_event(tx, int(seq), head, new_reason, new_ev, up)
        n += 1
    return n


def _drop_answers(tx: LedgerTx, ids: Sequence[str]) -> tuple[int, set[str]]:
    """Delete the waiting (or settled) answers whose search served one of ``ids``, in any scope: one read of
    the waiting answers for all of ``ids`` (an erasure of a scope names thousands)."""
    wanted = set(ids)
    if not wanted:
        return 0, set()
    rows = tx.run("SELECT answer_id, served_ids FROM pending_outcomes").fetchall()
    dropped = {str(answer) for answer, served in rows if not wanted.isdisjoint(from_json(served))}
    for answer in sorted(dropped):
        tx.run("DELETE FROM pending_outcomes WHERE answer_id = ?", (answer,))
    return len(dropped), dropped


def variants(strings: Iterable[str]) -> list[str]:
    """Each string, and its JSON-escaped forms (how a JSON column holds it)."""
    out = []
    for s in strings:
        out.append(s)
        escaped = json.dumps(s, ensure_ascii=False)[1:-1]
        if escaped != s:
            out.append(escaped)
        ascii_escaped = json.dumps(s)[1:-1]
        if ascii_escaped not in (s, escaped):
            out.append(ascii_escaped)
    return out


def _redact_queries(tx: LedgerTx, scope: str, strings: Iterable[str]) -> int:
    """Redact the queries of ``scope`` that contain one of ``strings`` (plain text: no escaped forms)."""
    return sum(
        _redact_where(tx, "scope = ? AND query LIKE ? ESCAPE '\\'", (scope, f"%{_like(s)}%"), exact=s) for s in strings
    )


def _redact_where(tx: LedgerTx, cond: str, args: Sequence[Any], exact: str | None = None) -> int:
    """Set the query of the searches matching ``cond`` (and containing ``exact``) to ``[erased]`` and rehash."""
    rows = tx.run(f"SELECT {hashing.SEARCH_HASH_COLS} FROM searches WHERE {cond}", args).fetchall()
    out = [
        (REDACTED, hashing.search_hash(r[0], r[1], REDACTED, *r[3:8]), r[0])
        for r in rows
        if exact is None or exact in str(r[2])
    ]
    if out:
        tx.update_many("UPDATE searches SET query = ?, hash = ? WHERE search_id = ?", out)
    return len(out)


def _clear_responses(tx: LedgerTx, scope: str, strings: Iterable[str]) -> int:
    n = 0
    for s in variants(strings):
        rows = tx.run(
            "SELECT response_id, items FROM responses WHERE scope = ? AND items LIKE ? ESCAPE '\\'",
            (scope, f"%{_like(s)}%"),
        ).fetchall()
        hit = [(str(r[0]),) for r in rows if s in str(r[1])]
        if hit:
            tx.update_many("UPDATE responses SET items = NULL WHERE response_id = ?", hit)
            n += len(hit)
    return n


@dataclass(frozen=True, kw_only=True)
class ScrubReport:
    """What rewriting a store's files did. ``complete``: the ledger's files were rewritten and its write-ahead
    log emptied, so no file of the store holds the erased bytes; else ``problem`` says what is left to do."""

    complete: bool
    steps: tuple[str, ...]
    problem: str | None = None


def scrub_sqlite(conn: sqlite3.Connection) -> ScrubReport:
    """Merge the full-text index's segments (deleted entries stay in old segments until merged), rebuild the
    database file (``VACUUM``: no free page or free space in a page keeps old bytes) and empty the WAL.
    ``conn``: the store's connection, in autocommit mode, under the store's lock."""
    steps = []
    conn.execute("PRAGMA secure_delete = ON")  # anything freed from now on is zeroed as well
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('optimize')")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    steps.append("full-text index merged")
    conn.execute("VACUUM")
    steps.append("database file rebuilt (VACUUM)")
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        return ScrubReport(
            complete=False,
            steps=tuple(steps),
            problem="another connection was reading: the write-ahead log was not emptied (run the scrub again)",
        )
    steps.append("write-ahead log emptied")
    return ScrubReport(complete=True, steps=tuple(steps))


# The PostgreSQL tables an erasure rewrites rows of (their dead row versions hold the old bytes).
PG_SCRUBBED_TABLES = ("memories", "events", "memory_terms", "memory_times", "pending_outcomes", "searches", "responses")


def scrub_postgres(statement: Callable[[str], Sequence[Any]]) -> ScrubReport:
    """``VACUUM (FULL)`` each table an erasure rewrites (a new file without dead row versions; the old one is
    removed), then end the current WAL segment and ``CHECKPOINT``, so that the segments holding the old rows
    are no longer needed. ``statement`` runs one statement outside a transaction and returns its rows.

    The server decides what happens to a segment no longer needed: with ``wal_recycle = off`` it is deleted,
    else renamed for reuse with its old bytes until they are overwritten (reported as incomplete). WAL archives,
    replicas and base backups are the operator's to expire."""
    steps = []
    for table in PG_SCRUBBED_TABLES:
        statement(f"VACUUM (FULL) {table}")
    steps.append(f"tables rewritten (VACUUM FULL): {', '.join(PG_SCRUBBED_TABLES)}")
    try:
        statement("SELECT pg_switch_wal()")
        statement("CHECKPOINT")
    except StoreError as exc:  # superuser, or pg_checkpoint (PostgreSQL 15+) and EXECUTE on pg_switch_wal
        return ScrubReport(
            complete=False,
            steps=tuple(steps),
            problem=f"the WAL could not be switched and checkpointed ({exc}); the server's next checkpoint does it",
        )
    steps.append("WAL segment switched, checkpoint")
    recycle = statement("SHOW wal_recycle")
    if recycle and str(recycle[0][0]).lower() == "on":
        return ScrubReport(
            complete=False,
            steps=tuple(steps),
            problem="wal_recycle is on: old WAL segments are reused, keeping their bytes until overwritten",
        )
    return ScrubReport(complete=True, steps=tuple(steps))
