"""The ledger's queries, written once for every SQL backend.

``LedgerTx`` holds every read and write the library makes inside one transaction. The SQL is
written in the common subset of SQLite and PostgreSQL with ``?`` placeholders; a backend's
transaction class supplies only the dialect: how a statement runs, how an embedding is stored and
read back, and whether a row read for update must be locked. Ranking, credit, lifecycle and the
middleware see only these methods, so they never know which database they run on.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import StoreError, UnknownMemoryError
from remem_agent.learning.lifecycle import LifecycleEvent, next_state
from remem_agent.store import hashing, lexical, times
from remem_agent.types import (
    ALL_TASKS,
    DEFAULT_SCOPE,
    AttributeInfo,
    CreditRecord,
    Event,
    Memory,
    SearchRecord,
    State,
    TaskStats,
)

MEM_COLS = (
    "id, text, original_text, entity, attribute, role, tasks, created_at, valid_from, valid_to, "
    "superseded_by, state, token_cost, confidence, scope, speaker, session"
)
STAT_COLS = (
    "retrieved, shown, credited, wasted, blamed, credit_sum, blame_sum, last_retrieved_at, last_credited_at, "
    "expected_sum, expected_n"
)
EVENT_COLS = "seq, memory_id, at, kind, from_state, to_state, reason, evidence"

_STATE_BY_VALUE: dict[str, State] = {s.value: s for s in State}
# What a present-tense (``current_only``) lexical search leaves out, on every backend.
LEXICAL_RETIRED = frozenset({State.INVALIDATED, State.ARCHIVED})

# The statements of the add path that a backend buffering new rows (``SQLiteTx``) recognises: it needs to
# know what a read of memories can see, and it inserts the buffered rows itself (several per statement).
MEMORY_INSERT_COLS = (
    "id, text, original_text, entity, attribute, role, tasks, created_at, valid_from, valid_to, superseded_by, "
    "state, token_cost, confidence, embedding, content_hash, scope, speaker, session"
)
MEMORY_INSERT_WIDTH = MEMORY_INSERT_COLS.count(",") + 1
MEMORY_INSERT = f"INSERT INTO memories ({MEMORY_INSERT_COLS}) VALUES ({','.join('?' * MEMORY_INSERT_WIDTH)})"
EVENT_INSERT_COLS = "memory_id, at, kind, from_state, to_state, reason, evidence, updates, hash"
EVENT_INSERT = f"INSERT INTO events ({EVENT_INSERT_COLS}) VALUES (?,?,?,?,?,?,?,?,?)"
# Reads of one key's memories: their arguments start with (scope, entity, attribute).
CURRENT_FOR_KEY = (
    f"SELECT {MEM_COLS} FROM memories WHERE scope = ? AND entity = ? AND attribute = ? AND role = 'state' "
    "AND state != 'INVALIDATED' ORDER BY valid_from, seq"
)
CLAIMS_AT = (
    f"SELECT {MEM_COLS} FROM memories WHERE scope = ? AND entity = ? AND attribute = ? AND role = ? "
    "AND valid_from = ? ORDER BY seq"
)
KEY_STATE_FACTS = (  # CURRENT_FOR_KEY's rows and CLAIMS_AT's of role 'state', in one read
    f"SELECT {MEM_COLS} FROM memories WHERE scope = ? AND entity = ? AND attribute = ? AND role = 'state' "
    "AND (state != 'INVALIDATED' OR valid_from = ?) ORDER BY valid_from, seq"
)
_CHUNK = 900  # ids per IN (...) list: below SQLite's default 999 host parameters
_KEY_CHUNK = 300  # (scope, entity, attribute) keys per statement: 900 host parameters

Key = tuple[str, str, str]  # (scope, entity, attribute)
# The key of a memories row (MEMORY_INSERT_COLS): its (scope, entity, attribute), by one itemgetter call (a
# generator over the positions cost ~0.5 us, twice per add).
memory_row_key = operator.itemgetter(
    *(MEMORY_INSERT_COLS.split(", ").index(c) for c in ("scope", "entity", "attribute"))
)
# ``transition``'s statement: an update of one row by id. When it sets only these columns (none of scope,
# entity, attribute, role, valid_from), the row stays in its key and no other row changes.
ROW_UPDATE_BY_ID = re.compile(r"UPDATE memories SET ((?:\w+ = \?, )*\w+ = \?) WHERE id = \?")
_KEY_NEUTRAL_COLUMNS = frozenset({"state", "valid_to", "superseded_by", "text", "token_cost", "confidence"})


@functools.lru_cache(maxsize=256)
def memories_write(sql: str) -> str:
    """What a statement can do to memories rows, for ``KeyView``: "" nothing (it does not name the table, or
    it is a SELECT), "insert" (``MEMORY_INSERT``: new rows, each with its key in its arguments), "row" (an
    update by id of key-neutral columns: the row named by the last argument changes, within its key) or "any"
    (anything else that names memories: a row of any key may have changed)."""
    if "memories" not in sql.lower() or sql.lstrip()[:6].upper() == "SELECT":
        return ""
    if sql == MEMORY_INSERT:
        return "insert"
    m = ROW_UPDATE_BY_ID.fullmatch(sql)
    if m is not None and {a.split(" = ")[0] for a in m.group(1).split(", ")} <= _KEY_NEUTRAL_COLUMNS:
        return "row"
    return "any"


class KeyView:
    """Every role-'state' row of some keys, read in one go at the start of ``ReMem.add_many``'s transaction
    (``LedgerTx.prefetch_keys``), each key's rows in ``ORDER BY valid_from, seq`` order; an empty list for a
    key with no such row.

    It answers a key only while no write of the transaction can have changed that key's rows: the
    transaction's statements report themselves (``LedgerTx.note_write``), and an insert of a memory of the
    key, or an update of one of the key's rows, drops the key; any other write to memories drops the whole
    view. Rows of other keys may change without dropping anything (an update by id of a row the view does
    not hold, setting only key-neutral columns: that row is of no held key, and stays of its own).
    """

    __slots__ = ("by_key", "key_of")

    def __init__(self, by_key: dict[tuple[Any, ...], list[Memory]]) -> None:
        self.by_key = by_key
        self.key_of: dict[str, tuple[Any, ...]] = {m.id: k for k, rows in by_key.items() for m in rows}

    def rows(self, scope: str, entity: str, attribute: str) -> list[Memory] | None:
        """The key's role-'state' rows as the ledger holds them now, or None when the view cannot tell."""
        return self.by_key.get((scope, entity, attribute))

    def drop(self, key: tuple[Any, ...]) -> None:
        self.by_key.pop(key, None)

    def drop_row(self, memory_id: Any) -> None:
        key = self.key_of.get(memory_id)
        if key is not None:
            self.by_key.pop(key, None)


def from_json(value: Any) -> Any:
    """A JSON column as Python: SQLite returns text, PostgreSQL's jsonb arrives decoded."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def row_to_memory(r: Sequence[Any]) -> Memory:
    """A memories row (``MEM_COLS``) as a ``Memory``, its id interned.

    Why interned: a search looks its candidates up by id in several tables (remembered rows and stats, the
    eligible pool, the fused pool's cosines), and their ids come from different places: the dense index's from
    ``embeddings_after`` (interned too) or from ``add_many``'s own inserts (``ingest.new_id`` interns), the rows'
    from here. With one string object per id, a key comparison
    is an identity test instead of comparing two strings, either of which may be out of the CPU's caches.
    """
    tasks = r[6]
    return Memory(
        id=sys.intern(r[0]),
        text=r[1],
        original_text=r[2],
        entity=r[3],
        attribute=r[4],
        role=r[5],
        tasks=() if tasks == "[]" else tuple(from_json(tasks)),
        created_at=r[7],
        valid_from=r[8],
        valid_to=r[9],
        superseded_by=r[10],
        state=_STATE_BY_VALUE[r[11]],
        token_cost=r[12],
        confidence=r[13],
        scope=r[14],
        speaker=r[15],
        session=r[16],
    )


def row_to_event(r: Sequence[Any]) -> Event:
    return Event(
        seq=r[0],
        memory_id=r[1],
        at=r[2],
        kind=r[3],
        from_state=State(r[4]) if r[4] else None,
        to_state=State(r[5]),
        reason=r[6],
        evidence=from_json(r[7]),
    )


def task_rows(task: str | None) -> tuple[str, ...]:
    """The statistics rows a search or credit of ``task`` updates: overall, and its class if named."""
    return (ALL_TASKS,) if task is None or task == ALL_TASKS else (ALL_TASKS, task)


def _marks(n: int) -> str:
    return ",".join("?" * n)


# The encoder ``json.dumps(value, sort_keys=True, default=str)`` builds on every call, built once (same text).
_EVENT_JSON = json.JSONEncoder(sort_keys=True, default=str)
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def _read_back(value: Mapping[str, Any]) -> dict[str, Any] | None:
    """``json.loads(_EVENT_JSON.encode(value))`` without the round trip, where it is known to give back equal
    values: string keys (the result is in sorted key order, as the decoded JSON is) and values that are JSON
    scalars or lists of them (exact types: a tuple, a subclass or a mapping takes the round trip). None
    where that is not known. Every add event and most transitions record such plain values."""
    if not all(type(k) is str for k in value):
        return None
    out: dict[str, Any] = {}
    for k in sorted(value):
        v = value[k]
        t = type(v)
        if t is list:
            if not all(type(x) in _JSON_SCALARS for x in v):
                return None
            v = list(v)
        elif t not in _JSON_SCALARS:
            return None
        out[k] = v
    return out


class LedgerTx:
    """Reads and writes inside one open transaction (from a store's ``read``/``write``/``transact``)."""

    # -- dialect hooks (overridden by each backend) ---------------------------------------------
    dialect: ClassVar[str] = "sql"
    lock_suffix: ClassVar[str] = ""  # appended to a SELECT whose row is about to be updated
    # The same, for an update that is not worth waiting for: the row is skipped while another writer holds it.
    skip_locked_suffix: ClassVar[str] = ""
    search_order: ClassVar[str] = "at"  # insertion order of the searches table

    def run(self, sql: str, args: Sequence[Any] = ()) -> Any:
        """Execute one statement; returns a cursor (``fetchone``/``fetchall``/iteration/``rowcount``)."""
        raise NotImplementedError

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one UPDATE per row (a backend may batch them)."""
        for row in rows:
            self.run(sql, row)

    def dump_vector(self, vec: NDArray[np.float32]) -> Any:
        """An embedding as the backend stores it."""
        raise NotImplementedError

    def load_vector(self, value: Any) -> NDArray[np.float32]:
        """An embedding read back as a float32 vector."""
        raise NotImplementedError

    def forget_row(self, memory_id: str, *, text_changed: bool = False) -> None:
        """Called after a memories row changed (a backend with a row cache drops it; with ``text_changed`` its
        full-text entry changed too, so cached word counts are stale)."""

    def text_updated(self, memory_id: str) -> None:
        """Called after a transition rewrote a memory's text: a backend whose lexical index is not kept by
        the database itself re-indexes the row (SQLite's triggers keep FTS5 current; PostgreSQL's
        ``memory_terms`` are written here)."""

    def after_import(self) -> None:
        """Called after ``import_rows`` filled every table (a backend may advance its id sequences and
        index the copied texts)."""

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
        query of only such words returns []). Both backends give the same scores (``store/bm25.py``).
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
        return self._append_event(m.id, at, LifecycleEvent.ADD, None, state, reason, {}, initial)

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
        return self._append_event(memory_id, at, event, from_state, to_state, reason, dict(evidence or {}), updates)

    def _append_event(
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

    # -- searches and feedback ------------------------------------------------------------------
    def insert_search(
        self,
        search_id: str,
        *,
        at: float,
        query: str,
        task: str | None,
        as_of: float | None,
        now: float | None,
        token_budget: int | None,
        served: Sequence[Mapping[str, Any]],
        scope: str = DEFAULT_SCOPE,
    ) -> None:
        served = list(served)
        # hashed from the list itself: the JSON text read back is the same value (finite floats, ints and
        # strings round-trip exactly), without parsing it again on every search
        served_json, row_hash = hashing.search_row(search_id, at, query, task, as_of, now, token_budget, served)
        self.run(
            "INSERT INTO searches (search_id, at, query, task, as_of, now, token_budget, served, hash, scope) "
            "VALUES (?,?,?,?,?,?,?,?,?,?)",
            (search_id, at, query, task, as_of, now, token_budget, served_json, row_hash, scope),
        )
        tasks = task_rows(task)
        rows = sorted((s["id"], t, at) for s in served for t in tasks)  # one lock order for every writer
        if rows:
            self.run_many(
                "INSERT INTO stats (memory_id, task, retrieved, last_retrieved_at) VALUES (?,?,1,?) "
                "ON CONFLICT (memory_id, task) DO UPDATE SET retrieved = stats.retrieved + 1, "
                "last_retrieved_at = excluded.last_retrieved_at",
                rows,
            )

    def search(self, search_id: str) -> SearchRecord | None:
        r = self.run(
            "SELECT search_id, at, query, task, as_of, now, token_budget, served, feedback, feedback_at, scope "
            "FROM searches WHERE search_id = ?",
            (search_id,),
        ).fetchone()
        if r is None:
            return None
        return SearchRecord(
            search_id=r[0],
            at=r[1],
            query=r[2],
            task=r[3],
            as_of=r[4],
            now=r[5],
            token_budget=r[6],
            served=tuple(from_json(r[7])),
            feedback=from_json(r[8]) if r[8] is not None else None,
            feedback_at=r[9],
            scope=r[10],
        )

    def answered_searches(self) -> Iterator[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
        """(search_id, served, feedback) of every answered search, in the order they were made."""
        rows = self.run(
            f"SELECT search_id, served, feedback FROM searches WHERE feedback IS NOT NULL ORDER BY {self.search_order}"
        ).fetchall()
        for sid, served, feedback in rows:
            yield str(sid), from_json(served), from_json(feedback)

    def search_counts(self) -> tuple[int, int]:
        """(searches, answered searches)."""
        r = self.run("SELECT COUNT(*), COUNT(feedback) FROM searches").fetchone()
        return int(r[0]), int(r[1])

    def record_feedback(self, search_id: str, payload: Mapping[str, Any], at: float) -> bool:
        """Mark a search as answered; False when another writer got there first."""
        fb_json = json.dumps(payload, sort_keys=True)
        cur = self.run(
            "UPDATE searches SET feedback = ?, feedback_at = ?, feedback_hash = ? WHERE search_id = ? "
            "AND feedback IS NULL",
            (fb_json, at, hashing.feedback_hash(search_id, fb_json, at), search_id),
        )
        return bool(cur.rowcount == 1)

    def insert_credits(self, records: Iterable[CreditRecord]) -> None:
        """Append credit rows and fold them into the per-class aggregates with SQL increments."""
        recs = list(records)
        if not recs:
            return
        credit_rows = [
            (
                r.search_id,
                r.memory_id,
                r.task,
                r.at,
                int(r.success),
                int(r.cited),
                int(r.used),
                r.credit,
                r.blame,
                r.prior,
                r.expected,
            )
            for r in recs
        ]
        self.run_many(
            "INSERT INTO credits (search_id, memory_id, task, at, success, cited, used, credit, blame, prior, "
            "expected, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(*row, hashing.credit_hash(*row)) for row in credit_rows],
        )
        rows = []
        for r in recs:
            credited = 1 if r.credit > 0 else 0
            blamed = 1 if r.blame > 0 else 0
            wasted = 1 if (r.credit == 0 and r.blame == 0) else 0
            last_credit = r.at if credited else None
            expected, expected_n = (0.0, 0) if r.expected is None else (r.expected, 1)
            for t in task_rows(r.task):
                rows.append(
                    (r.memory_id, t, credited, wasted, blamed, r.credit, r.blame, last_credit, expected, expected_n)
                )
        rows.sort(key=lambda row: (row[0], row[1]))  # one lock order for every writer: no deadlocks
        self.run_many(
            "INSERT INTO stats (memory_id, task, shown, credited, wasted, blamed, credit_sum, blame_sum, "
            "last_credited_at, expected_sum, expected_n) VALUES (?,?,1,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (memory_id, task) DO UPDATE SET shown = stats.shown + 1, "
            "credited = stats.credited + excluded.credited, wasted = stats.wasted + excluded.wasted, "
            "blamed = stats.blamed + excluded.blamed, credit_sum = stats.credit_sum + excluded.credit_sum, "
            "blame_sum = stats.blame_sum + excluded.blame_sum, "
            "last_credited_at = COALESCE(excluded.last_credited_at, stats.last_credited_at), "
            "expected_sum = stats.expected_sum + excluded.expected_sum, "
            "expected_n = stats.expected_n + excluded.expected_n",
            rows,
        )

    def _credit_rows(self, where: str, arg: str) -> list[CreditRecord]:
        rows = self.run(
            "SELECT search_id, memory_id, task, at, success, cited, used, credit, blame, prior, expected "
            f"FROM credits WHERE {where} = ? ORDER BY seq",
            (arg,),
        )
        return [
            CreditRecord(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[5]), bool(r[6]), r[7], r[8], r[9], r[10])
            for r in rows
        ]

    def prior_calibration(self, scope: str) -> dict[int, tuple[float, int]]:
        """The relevance prior's calibration in ``scope``: ``{bin: (uses, exposures)}`` of its judged exposures."""
        rows = self.run("SELECT bin, uses, exposures FROM prior_calibration WHERE scope = ?", (scope,))
        return {int(b): (float(u), int(n)) for b, u, n in rows}

    def add_to_calibration(self, scope: str, exposures: Iterable[tuple[int, float]]) -> None:
        """Count judged exposures, each ``(bin of its prior, use in [0, 1])``, into ``scope``'s calibration."""
        per_bin: dict[int, list[float]] = {}
        for b, use in exposures:
            acc = per_bin.setdefault(b, [0.0, 0.0])
            acc[0] += use
            acc[1] += 1
        if per_bin:
            self.run_many(
                "INSERT INTO prior_calibration (scope, bin, uses, exposures) VALUES (?,?,?,?) "
                "ON CONFLICT (scope, bin) DO UPDATE SET uses = prior_calibration.uses + excluded.uses, "
                "exposures = prior_calibration.exposures + excluded.exposures",
                [(scope, b, u, int(n)) for b, (u, n) in sorted(per_bin.items())],  # one lock order for every writer
            )

    def credits_for(self, memory_id: str) -> list[CreditRecord]:
        return self._credit_rows("memory_id", memory_id)

    def credits_for_search(self, search_id: str) -> list[CreditRecord]:
        return self._credit_rows("search_id", search_id)

    def credit_values(self) -> Iterator[tuple[str, str, float]]:
        """(search_id, memory_id, credit) of every credit row, oldest first."""
        for sid, mid, cr in self.run("SELECT search_id, memory_id, credit FROM credits ORDER BY seq").fetchall():
            yield str(sid), str(mid), float(cr)

    def stats(self, ids: Sequence[str], tasks: Sequence[str] = (ALL_TASKS,)) -> dict[tuple[str, str], TaskStats]:
        out: dict[tuple[str, str], TaskStats] = {}
        ids = list(ids)
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            q = (
                f"SELECT memory_id, task, {STAT_COLS} FROM stats WHERE memory_id IN ({_marks(len(chunk))}) "
                f"AND task IN ({_marks(len(tasks))})"
            )
            for r in self.run(q, (*chunk, *tasks)):
                out[(r[0], r[1])] = TaskStats(r[1], *r[2:])
        return out

    def all_stats(self, memory_id: str) -> dict[str, TaskStats]:
        rows = self.run(f"SELECT task, {STAT_COLS} FROM stats WHERE memory_id = ?", (memory_id,))
        return {r[0]: TaskStats(r[0], *r[1:]) for r in rows}

    def stats_all_classes(self, ids: Sequence[str]) -> dict[str, dict[str, TaskStats]]:
        out: dict[str, dict[str, TaskStats]] = {i: {} for i in ids}
        ids = list(ids)
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            q = f"SELECT memory_id, task, {STAT_COLS} FROM stats WHERE memory_id IN ({_marks(len(chunk))})"
            for r in self.run(q, chunk):
                out[r[0]][r[1]] = TaskStats(r[1], *r[2:])
        return out

    # -- attributes (learned schema, change counts) --------------------------------------------
    def attributes(self, names: Sequence[str]) -> dict[str, AttributeInfo]:
        names = sorted(set(names))
        if not names:
            return {}
        rows = self.run(
            "SELECT attribute, changes, confirmations, counter, single_valued, decided_at FROM attributes "
            f"WHERE attribute IN ({_marks(len(names))})",
            names,
        )
        return {r[0]: AttributeInfo(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in rows}

    def bump_attribute(self, name: str, *, changes: int = 0, confirmations: int = 0, counter: int = 0) -> None:
        row = self.run(
            "INSERT INTO attributes (attribute, changes, confirmations, counter) VALUES (?,?,?,?) "
            "ON CONFLICT (attribute) DO UPDATE SET changes = attributes.changes + excluded.changes, "
            "confirmations = attributes.confirmations + excluded.confirmations, "
            f"counter = attributes.counter + excluded.counter RETURNING {hashing.ATTRIBUTE_HASH_COLS}",
            (name, changes, confirmations, counter),
        ).fetchone()
        # the row as written, so its hash needs no second read (hashing.rehash_attribute)
        self.run("UPDATE attributes SET hash = ? WHERE attribute = ?", (hashing.attribute_hash(*row), name))

    def mark_single_valued(self, name: str, at: float) -> None:
        self.run("UPDATE attributes SET single_valued = 1, decided_at = ? WHERE attribute = ?", (at, name))
        hashing.rehash_attribute(self, name)

    def current_keys(self, attribute: str) -> list[tuple[str, str]]:
        """(scope, entity) pairs with more than one current role-'state' fact for ``attribute`` (pending conflicts)."""
        rows = self.run(
            "SELECT scope, entity FROM memories WHERE attribute = ? AND role = 'state' AND entity IS NOT NULL "
            "AND state != 'INVALIDATED' GROUP BY scope, entity HAVING COUNT(*) > 1 ORDER BY scope, entity",
            (attribute,),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    def key_summary(self, keys: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], tuple[int, float]]:
        """For each (scope, entity, attribute): (number of current state facts, latest valid_from among them)."""
        keys = sorted(set(keys))
        out: dict[tuple[str, str, str], tuple[int, float]] = {}
        for start in range(0, len(keys), 300):
            chunk = keys[start : start + 300]
            cond = " OR ".join("(scope = ? AND entity = ? AND attribute = ?)" for _ in chunk)
            q = (
                "SELECT scope, entity, attribute, COUNT(*), MAX(valid_from) FROM memories WHERE role = 'state' "
                f"AND state != 'INVALIDATED' AND ({cond}) GROUP BY scope, entity, attribute"
            )
            for r in self.run(q, [v for k in chunk for v in k]):
                out[(r[0], r[1], r[2])] = (int(r[3]), float(r[4]))
        return out

    # -- meta, counts, bulk reads --------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        r = self.run("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else str(r[0])

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
        active = "state != 'INVALIDATED' AND state != 'ARCHIVED'" + (" AND scope = ?" if scope is not None else "")
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
