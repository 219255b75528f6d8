"""The ledger's queries, written once for every SQL backend.

``LedgerTx`` holds every read and write the library makes inside one transaction. The SQL is
written in the common subset of SQLite and PostgreSQL with ``?`` placeholders; a backend's
transaction class supplies only the dialect: how a statement runs, how an embedding is stored and
read back, and whether a row read for update must be locked. Ranking, credit, lifecycle and the
middleware see only these methods, so they never know which database they run on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import StoreError, UnknownMemoryError
from remem_agent.store import hashing, lexical, times
from remem_agent.store.lifecycle import LifecycleEvent, next_state
from remem_agent.store.sql_outcomes import OutcomeQueries
from remem_agent.store.sql_rows import (
    _CHUNK,
    _EVENT_JSON,
    _KEY_CHUNK,
    CLAIMS_AT,
    CURRENT_FOR_KEY,
    EVENT_COLS,
    EVENT_INSERT,
    KEY_STATE_FACTS,
    LEXICAL_RETIRED,
    MEM_COLS,
    MEMORY_INSERT,
    Key,
    KeyView,
    _marks,
    _read_back,
    memories_write,
    memory_row_key,
    row_to_event,
    row_to_memory,
)
from remem_agent.types import (
    DEFAULT_SCOPE,
    Event,
    Memory,
    State,
)


class LedgerTx(OutcomeQueries):
    """Reads and writes inside one open transaction (from a store's ``read``/``write``/``transact``)."""

    # -- the lexical channel (schema 5; one tokenizer and one BM25 on both backends, see store/lexical.py) --
    def lexical_candidates(
        self, query: str, *, limit: int, scopes: frozenset[str] | None, current_only: bool = False
    ) -> list[tuple[str, float]]:
        """Memory ids whose text matches words of ``query``, with a lexical relevance score (higher =
        better), best first (ties in insertion order), at most ``limit``, only in ``scopes`` (None = all).

        No state or validity filter unless ``current_only``: then INVALIDATED and ARCHIVED memories are
        left out in SQL (only for present-tense searches; an ``as_of`` search must see retired facts).
        The caller applies ``ranking.pipeline.is_eligible`` as on the dense path either way. A query
        with no searchable word (``lexical.query_terms``) returns []; words are searched rarest first
        within ``lexical.MAX_MATCHES`` matches (a word in more memories than that is left out, and a
        query of only such words returns []). Both backends give the same scores (``store/fts5_bm25.py``).
        """
        terms = lexical.query_terms(query)
        if not terms or limit <= 0 or (scopes is not None and not scopes):
            return []
        counts = self._lexical_counts(terms, lexical.MAX_MATCHES + 1)
        kept = lexical.choose_terms(terms, counts)
        if not kept:
            return []
        # Exact, not capped: a kept word's matches fit the budget, which is below the cap.
        df = [counts[terms.index(t)] for t in kept]
        return self._lexical_query(kept, df=df, scopes=scopes, current_only=current_only, limit=int(limit))

    def _lexical_counts(self, terms: list[str], cap: int) -> list[int]:
        """How many memories (of every scope) match each word, counted up to ``cap``."""
        raise NotImplementedError

    def _lexical_query(
        self, terms: list[str], *, df: list[int], scopes: frozenset[str] | None, current_only: bool, limit: int
    ) -> list[tuple[str, float]]:
        """The backend's full-text query over ``terms``, filtered as ``lexical_candidates`` says; ``df`` is
        each term's number of matching memories in every scope (``_lexical_counts``, exact for kept terms)."""
        raise NotImplementedError

    @staticmethod
    def lexical_filters(scopes: frozenset[str] | None, current_only: bool) -> tuple[list[str], list[Any]]:
        """``lexical_candidates``' filters as SQL conditions on ``memories m`` and their arguments."""
        where: list[str] = []
        args: list[Any] = []
        if scopes is not None:
            ordered = sorted(scopes)
            where.append(f"m.scope IN ({_marks(len(ordered))})")
            args += ordered
        if current_only:
            where.append(f"m.state NOT IN ({_marks(len(LEXICAL_RETIRED))})")
            args += sorted(st.value for st in LEXICAL_RETIRED)
        return where, args

    def lexical_index_problems(self) -> list[str]:
        """Every memory indexed exactly once, with its current text (``verify()``); problems as text."""
        raise NotImplementedError

    # -- memories -------------------------------------------------------------------------------
    def memories(self, ids: Sequence[str]) -> dict[str, Memory]:
        out: dict[str, Memory] = {}
        ids = list(ids)
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            for r in self.run(f"SELECT {MEM_COLS} FROM memories WHERE id IN ({_marks(len(chunk))})", chunk):
                m = row_to_memory(r)
                out[m.id] = m
        return out

    def memory(self, memory_id: str) -> Memory:
        r = self.run(f"SELECT {MEM_COLS} FROM memories WHERE id = ?", (memory_id,)).fetchone()
        if r is None:
            raise UnknownMemoryError(memory_id)
        return row_to_memory(r)

    # -- one key's role-'state' facts (supersession at ingest) --------------------------------------
    # Set by ``prefetch_keys`` (None: every key read queries). The transaction object lives for one transaction
    # (a retried one gets a new object), so the view never outlives the snapshot it was read in.
    key_view: KeyView | None = None

    def lock_attributes(self, attributes: Iterable[str]) -> None:
        """Wait until no other transaction can supersede, reconfirm or count facts of these attributes.

        Called before the transaction locks any memory row, with every attribute it may touch, so that writers
        of one attribute take turns instead of each holding a memory row the other needs while waiting for
        the attribute's counter row (a deadlock on PostgreSQL). SQLite has one writer: nothing to do.
        """

    def prefetch_keys(self, keys: Iterable[Key]) -> None:
        """Read every role-'state' row of ``keys`` in as few statements as the host-parameter limit allows, so
        that ``current_for_key``, ``claims_at`` (of role 'state') and ``current_and_claims`` answer those keys
        without a query, with the same rows in the same order, until a write may change them (``KeyView``).
        ``ReMem.add_many`` calls it before its batch's ``insert_fact`` calls; ``drop_key_view`` ends it."""
        wanted = sorted(set(keys))  # sorted: neighbouring index entries are read one after another
        if not wanted:
            return
        by_key: dict[tuple[Any, ...], list[Memory]] = {k: [] for k in wanted}
        for start in range(0, len(wanted), _KEY_CHUNK):
            chunk = wanted[start : start + _KEY_CHUNK]
            # Padded with its last key to a power of two (at most _KEY_CHUNK keys): a batch's statements are then
            # among a few texts, each prepared once per connection (a batch's 250-key remainder took ~1.6 ms to
            # prepare, longer than to run). A key named twice matches its rows once: the OR is a WHERE clause.
            chunk += [chunk[-1]] * (min(_KEY_CHUNK, 1 << (len(chunk) - 1).bit_length()) - len(chunk))
            cond = " OR ".join(["(scope = ? AND entity = ? AND attribute = ?)"] * len(chunk))
            q = f"SELECT {MEM_COLS} FROM memories WHERE role = 'state' AND ({cond}) ORDER BY valid_from, seq"
            for r in self.run(q, [v for k in chunk for v in k]):
                m = row_to_memory(r)
                held = by_key.get((m.scope, m.entity, m.attribute))
                if held is None:  # the database matched a key Python's equality does not: no view at all
                    self.key_view = None
                    return
                held.append(m)
        self.key_view = KeyView(by_key)

    def drop_key_view(self) -> None:
        self.key_view = None

    def note_write(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Called by a backend before it runs ``sql`` with each of ``rows`` as arguments (every statement of
        ``run``, ``run_many`` and ``update_many``, and each memories row it inserts by other means): drops what
        the key view can no longer answer. A backend's own driver calls write no memories row that was not
        reported here (``SQLiteTx.insert_buffered`` inserts rows reported by ``insert_memory_row``)."""
        view = self.key_view
        if view is None:
            return
        kind = memories_write(sql)
        if kind == "insert":
            for row in rows:
                view.drop(memory_row_key(row))
        elif kind == "row":
            for row in rows:
                view.drop_row(row[-1])
        elif kind:
            self.key_view = None

    def current_for_key(self, entity: str, attribute: str, scope: str = DEFAULT_SCOPE) -> list[Memory]:
        """Role-'state' facts with this key in ``scope`` that are not invalidated, oldest first."""
        if self.key_view is not None and (held := self.key_view.rows(scope, entity, attribute)) is not None:
            return [m for m in held if m.state is not State.INVALIDATED]
        rows = self.run(CURRENT_FOR_KEY, (scope, entity, attribute))
        return [row_to_memory(r) for r in rows]

    def claims_at(self, entity: str, attribute: str, role: str, valid_from: float, scope: str) -> list[Memory]:
        """Memories of one key, role and scope stated at exactly ``valid_from``, in any state (re-add detection)."""
        if (
            role == "state"
            and self.key_view is not None
            and (held := self.key_view.rows(scope, entity, attribute)) is not None
        ):
            return [m for m in held if m.valid_from == valid_from]  # one valid_from: in seq order
        rows = self.run(CLAIMS_AT, (scope, entity, attribute, role, valid_from))
        return [row_to_memory(r) for r in rows]

    def current_and_claims(
        self, entity: str, attribute: str, valid_from: float, scope: str = DEFAULT_SCOPE
    ) -> tuple[list[Memory], list[Memory]]:
        """``current_for_key(entity, attribute, scope)`` and ``claims_at(entity, attribute, 'state', valid_from,
        scope)``, each in its own order, from one read of the key (``insert_fact`` asks both of a timed state fact)."""
        held = self.key_view.rows(scope, entity, attribute) if self.key_view is not None else None
        if held is not None:
            rows = held
        else:
            rows = [row_to_memory(r) for r in self.run(KEY_STATE_FACTS, (scope, entity, attribute, valid_from))]
        current = [m for m in rows if m.state is not State.INVALIDATED]
        claims = [m for m in rows if m.valid_from == valid_from]  # one valid_from: in seq order
        return current, claims

    # When a list, ``insert_memory`` appends (id, embedding, scope) of each memory it inserts (``ReMem.add_many``
    # hands its own new rows to the in-process index instead of reading them back after the commit).
    inserted: list[tuple[str, NDArray[np.float32], str]] | None = None

    def insert_memory(self, m: Memory, embedding: NDArray[np.float32], *, reason: str, at: float) -> Event:
        """Insert a new memory in ACTIVE and log its ``add`` event."""
        state = next_state(None, LifecycleEvent.ADD, memory_id=m.id)
        if self.inserted is not None:
            self.inserted.append((m.id, embedding, m.scope))
        tasks = json.dumps(list(m.tasks)) if m.tasks else "[]"
        content_hash = hashing.memory_hash(
            m.id,
            m.original_text,
            m.entity,
            m.attribute,
            m.role,
            list(m.tasks),
            m.created_at,
            m.valid_from,
            m.speaker,
            m.session,
        )  # the task list itself: the JSON round trip of a list of strings is the identity
        self.insert_memory_row(
            (
                m.id,
                m.text,
                m.original_text,
                m.entity,
                m.attribute,
                m.role,
                tasks,
                m.created_at,
                m.valid_from,
                m.valid_to,
                m.superseded_by,
                state.value,
                m.token_cost,
                m.confidence,
                self.dump_vector(embedding),
                content_hash,
                m.scope,
                m.speaker,
                m.session,
            ),
        )
        time_rows = times.time_rows(m.id, m.original_text, m.valid_from)
        if time_rows:
            self.insert_time_rows(time_rows)
        initial = {
            "text": m.text,
            "token_cost": m.token_cost,
            "confidence": m.confidence,
            "valid_to": m.valid_to,
            "superseded_by": m.superseded_by,
        }
        return self.append_event(m.id, at, LifecycleEvent.ADD, None, state, reason, {}, initial)

    def transition(
        self,
        memory_id: str,
        event: LifecycleEvent,
        *,
        reason: str,
        at: float,
        evidence: Mapping[str, Any] | None = None,
        updates: Mapping[str, Any] | None = None,
    ) -> Event:
        """Apply a lifecycle event: checks legality, updates the row, appends the event."""
        cur = self.run(f"SELECT state FROM memories WHERE id = ?{self.lock_suffix}", (memory_id,)).fetchone()
        if cur is None:
            raise UnknownMemoryError(memory_id)
        return self._transition_from(State(cur[0]), memory_id, event, reason, at, evidence, updates)

    def transition_unless_busy(
        self,
        memory_id: str,
        event: LifecycleEvent,
        *,
        reason: str,
        at: float,
        evidence: Mapping[str, Any] | None = None,
        updates: Mapping[str, Any] | None = None,
    ) -> Event | None:
        """``transition``, or ``None`` without waiting when another open transaction holds the memory's row.

        For moves a later call can make as well (retention's demote, compress, archive, revive). Waiting would
        let a feedback hold its statistics rows while it queues for a fact that an add is superseding, a wait
        that can close a deadlock cycle (PostgreSQL); SQLite has one writer, so there it never skips.
        """
        cur = self.run(f"SELECT state FROM memories WHERE id = ?{self.skip_locked_suffix}", (memory_id,)).fetchone()
        if cur is None:
            if self.run("SELECT 1 FROM memories WHERE id = ?", (memory_id,)).fetchone() is None:
                raise UnknownMemoryError(memory_id)
            return None  # another writer holds the row; the next feedback reconsiders it
        return self._transition_from(State(cur[0]), memory_id, event, reason, at, evidence, updates)

    def _transition_from(
        self,
        from_state: State,
        memory_id: str,
        event: LifecycleEvent,
        reason: str,
        at: float,
        evidence: Mapping[str, Any] | None,
        updates: Mapping[str, Any] | None,
    ) -> Event:
        """The checks and writes of a transition whose row is locked and whose state was just read."""
        to_state = next_state(from_state, event, memory_id=memory_id)
        if event is LifecycleEvent.ERASE:  # an erasure redacts the row and its events: store/erasure.py
            raise StoreError("a memory is erased through ReMem.erase (remem_agent.store.erasure), not transition")
        fields = dict(updates or {})
        allowed = {"valid_to", "superseded_by", "text", "token_cost", "confidence"}
        if not set(fields) <= allowed:
            raise StoreError(f"transition may not update {sorted(set(fields) - allowed)}")
        # Recorded in the event (plain Python values): replaying the events gives the row (verify).
        updates = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in fields.items()} or None
        fields["state"] = to_state.value
        assignments = ", ".join(f"{k} = ?" for k in fields)
        self.run(f"UPDATE memories SET {assignments} WHERE id = ?", (*fields.values(), memory_id))
        self.forget_row(memory_id, text_changed="text" in fields)
        if "text" in fields:
            self.text_updated(memory_id)
        return self.append_event(memory_id, at, event, from_state, to_state, reason, dict(evidence or {}), updates)

    def append_event(
        self,
        memory_id: str,
        at: float,
        event: LifecycleEvent,
        from_state: State | None,
        to_state: State,
        reason: str,
        evidence: Mapping[str, Any],
        updates: Mapping[str, Any] | None = None,
    ) -> Event:
        ev_json = _EVENT_JSON.encode(evidence)
        up_json = None if updates is None else _EVENT_JSON.encode(updates)
        frm = from_state.value if from_state else None
        # As stored and read back: what the hash must be of (decoded once, or known without decoding).
        ev = _read_back(evidence)
        if ev is None:
            ev = json.loads(ev_json)
        up = None
        if updates is not None:
            up = _read_back(updates)
            if up is None:
                up = json.loads(str(up_json))
        ev_hash = hashing.event_hash(memory_id, at, event.value, frm, to_state.value, reason, ev, up)
        seq = self.insert_event_row(
            (memory_id, at, event.value, frm, to_state.value, reason, ev_json, up_json, ev_hash)
        )
        return Event(seq, memory_id, at, event.value, from_state, to_state, reason, ev)

    def insert_memory_row(self, row: tuple[Any, ...]) -> None:
        """Insert one memories row (the columns of ``MEMORY_INSERT_COLS``). A backend may buffer it, as long as
        every later statement that could see it sees it (``SQLiteTx``)."""
        self.run(MEMORY_INSERT, row)

    def insert_time_rows(self, rows: Sequence[times.TimeRow]) -> None:
        """Insert a new memory's ``memory_times`` rows (after its memories row). A backend may buffer them with
        the memory (``SQLiteTx``)."""
        self.run_many(times.TIMES_INSERT, rows)

    def times_of(self, ids: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
        """The time ranges each memory's text mentions (store/times.py); ids without any are absent."""
        return times.times_of(self, ids)

    def insert_event_row(self, row: tuple[Any, ...]) -> int:
        """Append one events row (``EVENT_INSERT_COLS``); returns its seq. A backend may buffer it, as long as
        it gets this seq and every later statement that could see it sees it (``SQLiteTx``)."""
        return int(self.run(EVENT_INSERT + " RETURNING seq", row).fetchone()[0])

    def events(self, memory_id: str) -> list[Event]:
        rows = self.run(f"SELECT {EVENT_COLS} FROM events WHERE memory_id = ? ORDER BY seq", (memory_id,))
        return [row_to_event(r) for r in rows]

    def all_events(self) -> list[Event]:
        return [row_to_event(r) for r in self.run(f"SELECT {EVENT_COLS} FROM events ORDER BY seq")]

    def supersedes(self, memory_id: str) -> list[str]:
        rows = self.run("SELECT id FROM memories WHERE superseded_by = ? ORDER BY seq", (memory_id,))
        return [r[0] for r in rows]

    def list_memories(
        self,
        state: State | None = None,
        role: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        scope: str | None = None,
    ) -> list[Memory]:
        where: list[str] = []
        args: list[Any] = []
        if scope is not None:
            where.append("scope = ?")
            args.append(scope)
        if state is not None:
            where.append("state = ?")
            args.append(state.value)
        if role is not None:
            where.append("role = ?")
            args.append(role)
        q = f"SELECT {MEM_COLS} FROM memories"
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY seq"
        if limit is not None:
            q += " LIMIT ?"
            args.append(limit)
        elif offset:
            q += " LIMIT -1" if self.dialect == "sqlite" else ""
        if offset:
            q += " OFFSET ?"
            args.append(offset)
        return [row_to_memory(r) for r in self.run(q, args)]

    # -- meta, counts, bulk reads --------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        r = self.run("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else str(r[0])

    def set_meta(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what was stored."""
        self.run(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def set_meta_default(self, key: str, value: str) -> str:
        self.run("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING", (key, value))
        return str(self.run("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])

    def max_seq(self) -> int:
        return int(self.run("SELECT COALESCE(MAX(seq), 0) FROM memories").fetchone()[0])

    def embeddings_of(self, ids: Sequence[str]) -> dict[str, NDArray[np.float32]]:
        """The stored embedding of each of ``ids`` (unknown ids are left out)."""
        out: dict[str, NDArray[np.float32]] = {}
        ids = list(ids)
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            for mid, emb in self.run(f"SELECT id, embedding FROM memories WHERE id IN ({_marks(len(chunk))})", chunk):
                out[str(mid)] = self.load_vector(emb)
        return out

    def last_turn_vectors(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], NDArray[np.float32]]:
        """The stored vector of the latest conversation turn (a note with a speaker) of each (scope, session)."""
        out: dict[tuple[str, str], NDArray[np.float32]] = {}
        for scope, session in keys:
            r = self.run(
                "SELECT embedding FROM memories WHERE seq = (SELECT MAX(seq) FROM memories"
                " WHERE scope = ? AND session = ? AND role = 'note' AND speaker IS NOT NULL)",
                (scope, session),
            ).fetchone()
            if r is not None:
                out[(scope, session)] = self.load_vector(r[0])
        return out

    def embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32]]:
        """Embeddings of memories inserted after ``seq``, for (re)building an in-process index."""
        rows = self.run("SELECT seq, id, embedding FROM memories WHERE seq > ? ORDER BY seq", (seq,)).fetchall()
        if not rows:
            return seq, [], np.zeros((0, dim), dtype=np.float32)
        mat = np.stack([self.load_vector(r[2]) for r in rows]).astype(np.float32, copy=False).reshape(len(rows), dim)
        return int(rows[-1][0]), [sys.intern(r[1]) for r in rows], mat  # interned as in ``row_to_memory``

    def scopes_between(self, after: int, upto: int) -> list[str]:
        """The scope of every memory with ``after < seq <= upto``, in seq order (pairs with ``embeddings_after``)."""
        rows = self.run("SELECT scope FROM memories WHERE seq > ? AND seq <= ? ORDER BY seq", (after, upto))
        return [str(r[0]) for r in rows]

    def counts(self, scope: str | None = None) -> dict[str, Any]:
        """Counts of the whole ledger, or of one scope's memories, their events and its searches."""
        mem_where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        by_state = {
            str(k): int(v)
            for k, v in self.run(f"SELECT state, COUNT(*) FROM memories {mem_where} GROUP BY state", args)
        }
        by_role = {
            str(k): int(v) for k, v in self.run(f"SELECT role, COUNT(*) FROM memories {mem_where} GROUP BY role", args)
        }
        if scope is None:
            searches, feedbacks = self.search_counts()
            events = int(self.run("SELECT COUNT(*) FROM events").fetchone()[0])
        else:
            r = self.run("SELECT COUNT(*), COUNT(feedback) FROM searches WHERE scope = ?", args).fetchone()
            searches, feedbacks = int(r[0]), int(r[1])
            events = int(
                self.run(
                    "SELECT COUNT(*) FROM events WHERE memory_id IN (SELECT id FROM memories WHERE scope = ?)", args
                ).fetchone()[0]
            )
        active = "state NOT IN ('INVALIDATED', 'ARCHIVED', 'ERASED')" + (" AND scope = ?" if scope is not None else "")
        return {
            "memories": sum(by_state.values()),
            "by_state": by_state,
            "by_role": by_role,
            "events": events,
            "searches": searches,
            "feedbacks": feedbacks,
            "tokens_active": int(
                self.run(f"SELECT COALESCE(SUM(token_cost), 0) FROM memories WHERE {active}", args).fetchone()[0]
            ),
        }

    def scopes(self) -> dict[str, int]:
        """Every scope that holds memories, with its memory count."""
        return {
            str(k): int(v) for k, v in self.run("SELECT scope, COUNT(*) FROM memories GROUP BY scope ORDER BY scope")
        }
