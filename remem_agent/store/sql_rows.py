"""The ledger's vocabulary, shared by every SQL backend: its columns and statements, the decoding of its rows,
and the hooks through which a backend's transaction runs them (:class:`TxHooks`).

:class:`~remem_agent.store.sql.LedgerTx` holds the queries; each backend's transaction class
(``SQLiteTx``, ``PostgresTx``) fills in the hooks.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from remem_agent.types import (
    ALL_TASKS,
    Event,
    Memory,
    State,
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
LEXICAL_RETIRED = frozenset({State.INVALIDATED, State.ARCHIVED, State.ERASED})

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


class TxHooks:
    """What a backend's transaction supplies: how a statement runs, how an embedding is stored and read back,
    and what it must hear when rows change. Every query of the ledger goes through these."""

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
