"""The default ledger: one SQLite file (WAL) in the store folder.

Why these choices:

* WAL lets readers run while one writer commits; ``synchronous=NORMAL`` makes every committed
  transaction survive a killed process (the kill test proves it); ``"FULL"`` also survives power loss.
* Every write transaction starts with ``BEGIN IMMEDIATE``: it takes the write lock up front, so two
  processes never deadlock upgrading a read lock (the classic source of "database is locked" that
  ``busy_timeout`` cannot fix). Lock waits are retried with backoff and end in ``StoreBusyError``.
* Counters are updated with ``SET x = x + ?`` inside the write transaction, so concurrent feedback
  from several processes never loses an update.
* One connection per store object, guarded by a lock, so threads share it safely.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import (
    SchemaVersionError,
    StoreBusyError,
    StoreError,
    UnknownMemoryError,
    UserInputError,
)
from remem_agent.lifecycle import LifecycleEvent, next_state
from remem_agent.store.migrations import LATEST, MIGRATIONS
from remem_agent.types import ALL_TASKS, AttributeInfo, CreditRecord, Event, Memory, State, TaskStats

LEDGER_FILE = "ledger.db"

_MEM_COLS = (
    "id, text, original_text, entity, attribute, role, tasks, created_at, valid_from, valid_to, "
    "superseded_by, state, token_cost, confidence"
)
_STAT_COLS = "retrieved, shown, credited, wasted, blamed, credit_sum, blame_sum, last_retrieved_at, last_credited_at"
_STAT_FIELDS = ("retrieved", "shown", "credited", "wasted", "blamed", "credit_sum", "blame_sum")


_STATE_BY_VALUE: dict[str, State] = {s.value: s for s in State}


def _row_to_memory(r: Sequence[Any]) -> Memory:
    return Memory(
        id=r[0],
        text=r[1],
        original_text=r[2],
        entity=r[3],
        attribute=r[4],
        role=r[5],
        tasks=() if r[6] == "[]" else tuple(json.loads(r[6])),
        created_at=r[7],
        valid_from=r[8],
        valid_to=r[9],
        superseded_by=r[10],
        state=_STATE_BY_VALUE[r[11]],
        token_cost=r[12],
        confidence=r[13],
    )


class _RowCache:
    """Decoded memory rows by id, for the search hot path (one per store object).

    Valid while no other connection has committed (``PRAGMA data_version`` unchanged; this
    connection's own commits do not change it) and kept exact for this connection's own writes:
    ``SQLiteTx.transition`` (the only statement that updates a memories row) drops the id, and a
    rolled-back write transaction drops everything.
    """

    def __init__(self, max_items: int = 100_000) -> None:
        self.rows: dict[str, Memory] = {}
        self.data_version = -1
        self.max_items = max_items

    def clear(self) -> None:
        self.rows.clear()
        self.data_version = -1


def _row_to_event(r: Sequence[Any]) -> Event:
    return Event(
        seq=r[0],
        memory_id=r[1],
        at=r[2],
        kind=r[3],
        from_state=State(r[4]) if r[4] else None,
        to_state=State(r[5]),
        reason=r[6],
        evidence=json.loads(r[7]),
    )


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class SQLiteTx:
    """Reads and writes inside one open transaction (obtained from ``SQLiteStore.write/read``)."""

    def __init__(self, conn: sqlite3.Connection, cache: _RowCache | None = None) -> None:
        self.c = conn
        self._cache = cache

    # -- memories -------------------------------------------------------------------------------
    def memories(self, ids: Sequence[str]) -> dict[str, Memory]:
        cache = self._cache
        if cache is None:
            return self._memories_sql(ids)
        # Read the version before the rows: the rows are then at least as new as the stamp.
        dv = self.c.execute("PRAGMA data_version").fetchone()[0]
        if dv != cache.data_version:
            cache.rows.clear()
            cache.data_version = dv
        rows = cache.rows
        missing = [i for i in ids if i not in rows]
        if missing:
            fetched = self._memories_sql(missing)
            if len(rows) + len(fetched) > cache.max_items:
                rows.clear()
            rows.update(fetched)
        return {i: rows[i] for i in ids if i in rows}

    def _memories_sql(self, ids: Sequence[str]) -> dict[str, Memory]:
        out: dict[str, Memory] = {}
        ids = list(ids)
        for start in range(0, len(ids), 900):
            chunk = ids[start : start + 900]
            q = f"SELECT {_MEM_COLS} FROM memories WHERE id IN ({','.join('?' * len(chunk))})"
            for r in self.c.execute(q, chunk):
                m = _row_to_memory(r)
                out[m.id] = m
        return out

    def memory(self, memory_id: str) -> Memory:
        r = self.c.execute(f"SELECT {_MEM_COLS} FROM memories WHERE id = ?", (memory_id,)).fetchone()
        if r is None:
            raise UnknownMemoryError(memory_id)
        return _row_to_memory(r)

    def current_for_key(self, entity: str, attribute: str) -> list[Memory]:
        """Role-'state' facts with this key that are not invalidated, oldest first."""
        rows = self.c.execute(
            f"SELECT {_MEM_COLS} FROM memories WHERE entity = ? AND attribute = ? AND role = 'state' "
            "AND state != 'INVALIDATED' ORDER BY valid_from, seq",
            (entity, attribute),
        )
        return [_row_to_memory(r) for r in rows]

    def insert_memory(self, m: Memory, embedding: NDArray[np.float32], *, reason: str, at: float) -> Event:
        """Insert a new memory in ACTIVE and log its ``add`` event."""
        state = next_state(None, LifecycleEvent.ADD, memory_id=m.id)
        self.c.execute(
            "INSERT INTO memories (id, text, original_text, entity, attribute, role, tasks, created_at, "
            "valid_from, valid_to, superseded_by, state, token_cost, confidence, embedding) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                m.id,
                m.text,
                m.original_text,
                m.entity,
                m.attribute,
                m.role,
                json.dumps(list(m.tasks)),
                m.created_at,
                m.valid_from,
                m.valid_to,
                m.superseded_by,
                state.value,
                m.token_cost,
                m.confidence,
                np.ascontiguousarray(embedding, dtype=np.float32).tobytes(),
            ),
        )
        return self._append_event(m.id, at, LifecycleEvent.ADD, None, state, reason, {})

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
        cur = self.c.execute("SELECT state FROM memories WHERE id = ?", (memory_id,)).fetchone()
        if cur is None:
            raise UnknownMemoryError(memory_id)
        from_state = State(cur[0])
        to_state = next_state(from_state, event, memory_id=memory_id)
        fields = dict(updates or {})
        allowed = {"valid_to", "superseded_by", "text", "token_cost", "confidence"}
        if not set(fields) <= allowed:
            raise StoreError(f"transition may not update {sorted(set(fields) - allowed)}")
        fields["state"] = to_state.value
        assignments = ", ".join(f"{k} = ?" for k in fields)
        self.c.execute(f"UPDATE memories SET {assignments} WHERE id = ?", (*fields.values(), memory_id))
        if self._cache is not None:
            self._cache.rows.pop(memory_id, None)
        return self._append_event(memory_id, at, event, from_state, to_state, reason, dict(evidence or {}))

    def _append_event(
        self,
        memory_id: str,
        at: float,
        event: LifecycleEvent,
        from_state: State | None,
        to_state: State,
        reason: str,
        evidence: Mapping[str, Any],
    ) -> Event:
        ev_json = json.dumps(evidence, sort_keys=True, default=str)
        cur = self.c.execute(
            "INSERT INTO events (memory_id, at, kind, from_state, to_state, reason, evidence) VALUES (?,?,?,?,?,?,?)",
            (memory_id, at, event.value, from_state.value if from_state else None, to_state.value, reason, ev_json),
        )
        seq = cur.lastrowid
        assert seq is not None
        return Event(seq, memory_id, at, event.value, from_state, to_state, reason, json.loads(ev_json))

    def events(self, memory_id: str) -> list[Event]:
        rows = self.c.execute(
            "SELECT seq, memory_id, at, kind, from_state, to_state, reason, evidence FROM events "
            "WHERE memory_id = ? ORDER BY seq",
            (memory_id,),
        )
        return [_row_to_event(r) for r in rows]

    def supersedes(self, memory_id: str) -> list[str]:
        rows = self.c.execute("SELECT id FROM memories WHERE superseded_by = ? ORDER BY seq", (memory_id,))
        return [r[0] for r in rows]

    def list_memories(
        self, state: State | None = None, role: str | None = None, limit: int | None = None, offset: int = 0
    ) -> list[Memory]:
        where, args = [], []
        if state is not None:
            where.append("state = ?")
            args.append(state.value)
        if role is not None:
            where.append("role = ?")
            args.append(role)
        q = f"SELECT {_MEM_COLS} FROM memories"
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY seq LIMIT ? OFFSET ?"
        return [_row_to_memory(r) for r in self.c.execute(q, (*args, -1 if limit is None else limit, offset))]

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
    ) -> None:
        self.c.execute(
            "INSERT INTO searches (search_id, at, query, task, as_of, now, token_budget, served) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (search_id, at, query, task, as_of, now, token_budget, json.dumps(list(served))),
        )
        tasks = _task_rows(task)
        rows = [(s["id"], t, at) for s in served for t in tasks]
        self.c.executemany(
            "INSERT INTO stats (memory_id, task, retrieved, last_retrieved_at) VALUES (?,?,1,?) "
            "ON CONFLICT (memory_id, task) DO UPDATE SET retrieved = retrieved + 1, "
            "last_retrieved_at = excluded.last_retrieved_at",
            rows,
        )

    def search(self, search_id: str) -> dict[str, Any] | None:
        r = self.c.execute(
            "SELECT search_id, at, query, task, as_of, now, token_budget, served, feedback, feedback_at "
            "FROM searches WHERE search_id = ?",
            (search_id,),
        ).fetchone()
        if r is None:
            return None
        return {
            "search_id": r[0],
            "at": r[1],
            "query": r[2],
            "task": r[3],
            "as_of": r[4],
            "now": r[5],
            "token_budget": r[6],
            "served": json.loads(r[7]),
            "feedback": json.loads(r[8]) if r[8] is not None else None,
            "feedback_at": r[9],
        }

    def record_feedback(self, search_id: str, payload: Mapping[str, Any], at: float) -> bool:
        """Mark a search as answered; False when another writer got there first."""
        cur = self.c.execute(
            "UPDATE searches SET feedback = ?, feedback_at = ? WHERE search_id = ? AND feedback IS NULL",
            (json.dumps(payload, sort_keys=True), at, search_id),
        )
        return cur.rowcount == 1

    def insert_credits(self, records: Iterable[CreditRecord]) -> None:
        """Append credit rows and fold them into the per-class aggregates."""
        recs = list(records)
        self.c.executemany(
            "INSERT INTO credits (search_id, memory_id, task, at, success, cited, used, credit, blame) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            [
                (r.search_id, r.memory_id, r.task, r.at, int(r.success), int(r.cited), int(r.used), r.credit, r.blame)
                for r in recs
            ],
        )
        rows = []
        for r in recs:
            credited = 1 if r.credit > 0 else 0
            blamed = 1 if r.blame > 0 else 0
            wasted = 1 if (r.credit == 0 and r.blame == 0) else 0
            last_credit = r.at if credited else None
            for t in _task_rows(r.task):
                rows.append((r.memory_id, t, credited, wasted, blamed, r.credit, r.blame, last_credit))
        self.c.executemany(
            "INSERT INTO stats (memory_id, task, shown, credited, wasted, blamed, credit_sum, blame_sum, "
            "last_credited_at) VALUES (?,?,1,?,?,?,?,?,?) "
            "ON CONFLICT (memory_id, task) DO UPDATE SET shown = shown + 1, "
            "credited = credited + excluded.credited, wasted = wasted + excluded.wasted, "
            "blamed = blamed + excluded.blamed, credit_sum = credit_sum + excluded.credit_sum, "
            "blame_sum = blame_sum + excluded.blame_sum, "
            "last_credited_at = COALESCE(excluded.last_credited_at, last_credited_at)",
            rows,
        )

    def credits_for(self, memory_id: str) -> list[CreditRecord]:
        rows = self.c.execute(
            "SELECT search_id, memory_id, task, at, success, cited, used, credit, blame FROM credits "
            "WHERE memory_id = ? ORDER BY seq",
            (memory_id,),
        )
        return [CreditRecord(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[5]), bool(r[6]), r[7], r[8]) for r in rows]

    def stats(self, ids: Sequence[str], tasks: Sequence[str] = (ALL_TASKS,)) -> dict[tuple[str, str], TaskStats]:
        out: dict[tuple[str, str], TaskStats] = {}
        ids = list(ids)
        for start in range(0, len(ids), 900):
            chunk = ids[start : start + 900]
            q = (
                f"SELECT memory_id, task, {_STAT_COLS} FROM stats WHERE memory_id IN "
                f"({','.join('?' * len(chunk))}) AND task IN ({','.join('?' * len(tasks))})"
            )
            for r in self.c.execute(q, (*chunk, *tasks)):
                out[(r[0], r[1])] = TaskStats(r[1], *r[2:])
        return out

    def all_stats(self, memory_id: str) -> dict[str, TaskStats]:
        rows = self.c.execute(f"SELECT task, {_STAT_COLS} FROM stats WHERE memory_id = ?", (memory_id,))
        return {r[0]: TaskStats(r[0], *r[1:]) for r in rows}

    # -- attributes (learned schema, change counts) --------------------------------------------
    def attributes(self, names: Sequence[str]) -> dict[str, AttributeInfo]:
        names = sorted(set(names))
        if not names:
            return {}
        rows = self.c.execute(
            "SELECT attribute, changes, confirmations, counter, single_valued, decided_at FROM attributes "
            f"WHERE attribute IN ({','.join('?' * len(names))})",
            names,
        )
        return {r[0]: AttributeInfo(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in rows}

    def bump_attribute(self, name: str, *, changes: int = 0, confirmations: int = 0, counter: int = 0) -> None:
        self.c.execute(
            "INSERT INTO attributes (attribute, changes, confirmations, counter) VALUES (?,?,?,?) "
            "ON CONFLICT (attribute) DO UPDATE SET changes = changes + excluded.changes, "
            "confirmations = confirmations + excluded.confirmations, counter = counter + excluded.counter",
            (name, changes, confirmations, counter),
        )

    def mark_single_valued(self, name: str, at: float) -> None:
        self.c.execute("UPDATE attributes SET single_valued = 1, decided_at = ? WHERE attribute = ?", (at, name))

    def current_keys(self, attribute: str) -> list[str]:
        """Entities with more than one current role-'state' fact for ``attribute`` (pending conflicts)."""
        rows = self.c.execute(
            "SELECT entity FROM memories WHERE attribute = ? AND role = 'state' AND entity IS NOT NULL "
            "AND state != 'INVALIDATED' GROUP BY entity HAVING COUNT(*) > 1 ORDER BY entity",
            (attribute,),
        )
        return [r[0] for r in rows]

    def key_summary(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, float]]:
        """For each key: (number of current state facts, latest valid_from among them)."""
        keys = sorted(set(keys))
        out: dict[tuple[str, str], tuple[int, float]] = {}
        for start in range(0, len(keys), 400):
            chunk = keys[start : start + 400]
            cond = " OR ".join("(entity = ? AND attribute = ?)" for _ in chunk)
            q = (
                "SELECT entity, attribute, COUNT(*), MAX(valid_from) FROM memories WHERE role = 'state' "
                f"AND state != 'INVALIDATED' AND ({cond}) GROUP BY entity, attribute"
            )
            for r in self.c.execute(q, [v for k in chunk for v in k]):
                out[(r[0], r[1])] = (int(r[2]), float(r[3]))
        return out

    def stats_all_classes(self, ids: Sequence[str]) -> dict[str, dict[str, TaskStats]]:
        out: dict[str, dict[str, TaskStats]] = {i: {} for i in ids}
        if not ids:
            return out
        q = f"SELECT memory_id, task, {_STAT_COLS} FROM stats WHERE memory_id IN ({','.join('?' * len(ids))})"
        for r in self.c.execute(q, list(ids)):
            out[r[0]][r[1]] = TaskStats(r[1], *r[2:])
        return out


def _task_rows(task: str | None) -> tuple[str, ...]:
    return (ALL_TASKS,) if task is None or task == ALL_TASKS else (ALL_TASKS, task)


class SQLiteStore:
    """The SQLite ledger of one store folder."""

    def __init__(
        self,
        folder: str | Path,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 30.0,
        lock_retry_s: float = 120.0,
    ) -> None:
        if synchronous.upper() not in {"NORMAL", "FULL", "EXTRA"}:
            raise UserInputError("synchronous must be NORMAL, FULL or EXTRA")
        self.folder = Path(folder).expanduser()
        if self.folder.exists() and not self.folder.is_dir():
            raise UserInputError(f"store path {self.folder} exists and is not a folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / LEDGER_FILE
        self._lock = threading.RLock()
        self._lock_retry_s = lock_retry_s
        self._row_cache = _RowCache()
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone())
            self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            # 64 MiB page cache (default 2 MiB): the id/key/event indexes of a 100k store stay hot.
            self._conn.execute("PRAGMA cache_size = -65536")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open ledger {self.path}: {exc}") from exc
        self._migrate()

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version
        if version > LATEST:
            raise SchemaVersionError(version, LATEST, str(self.path))
        for number, sql in MIGRATIONS:
            if number <= version:
                continue
            with self.write() as tx:
                # Re-check under the write lock: another process may have migrated meanwhile.
                current = int(tx.c.execute("PRAGMA user_version").fetchone()[0])
                if current >= number:
                    continue
                for stmt in _split_sql(sql):
                    tx.c.execute(stmt)
                tx.c.execute(f"PRAGMA user_version = {number}")

    # -- transactions ---------------------------------------------------------------------------
    def _retry(self, fn: Any) -> Any:
        deadline = time.monotonic() + self._lock_retry_s
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() > deadline:
                    if _is_locked(exc):
                        raise StoreBusyError(f"ledger {self.path} stayed locked: {exc}") from exc
                    raise
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    @contextmanager
    def write(self) -> Iterator[SQLiteTx]:
        """A write transaction (BEGIN IMMEDIATE): all or nothing."""
        with self._lock:
            self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
            try:
                yield SQLiteTx(self._conn, self._row_cache)
            except sqlite3.Error as exc:
                self._rollback()
                raise StoreError(f"ledger {self.path}: {exc}") from exc
            except BaseException:
                self._rollback()
                raise
            try:
                self._retry(lambda: self._conn.execute("COMMIT"))
            except sqlite3.Error as exc:
                self._rollback()
                raise StoreError(f"ledger {self.path}: commit failed: {exc}") from exc
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        self._row_cache.clear()  # rows read or changed inside the aborted transaction may be stale
        # SQLite may already have rolled back by itself (disk full, I/O error): only roll back what is open.
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    @contextmanager
    def read(self) -> Iterator[SQLiteTx]:
        """A read transaction: a consistent snapshot for several queries."""
        with self._lock:
            self._retry(lambda: self._conn.execute("BEGIN"))
            try:
                yield SQLiteTx(self._conn, self._row_cache)
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")

    # -- meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self.read() as tx:
            r = tx.c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else str(r[0])

    def set_meta_default(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is already stored; return the stored one."""
        with self.write() as tx:
            tx.c.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, value))
            return str(tx.c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])

    # -- bulk reads -----------------------------------------------------------------------------
    def max_seq(self) -> int:
        with self._lock:
            r = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM memories").fetchone()
        return int(r[0])

    def embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32]]:
        """Embeddings of memories inserted after ``seq``, for (re)building an index."""
        with self.read() as tx:
            rows = tx.c.execute("SELECT seq, id, embedding FROM memories WHERE seq > ? ORDER BY seq", (seq,)).fetchall()
        if not rows:
            return seq, [], np.zeros((0, dim), dtype=np.float32)
        mat = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(len(rows), dim)
        return int(rows[-1][0]), [r[1] for r in rows], mat

    def counts(self) -> dict[str, Any]:
        with self.read() as tx:
            c = tx.c
            by_state = dict(c.execute("SELECT state, COUNT(*) FROM memories GROUP BY state").fetchall())
            by_role = dict(c.execute("SELECT role, COUNT(*) FROM memories GROUP BY role").fetchall())
            return {
                "memories": sum(by_state.values()),
                "by_state": by_state,
                "by_role": by_role,
                "events": c.execute("SELECT COUNT(*) FROM events").fetchone()[0],
                "searches": c.execute("SELECT COUNT(*) FROM searches").fetchone()[0],
                "feedbacks": c.execute("SELECT COUNT(*) FROM searches WHERE feedback IS NOT NULL").fetchone()[0],
                "tokens_active": c.execute(
                    "SELECT COALESCE(SUM(token_cost), 0) FROM memories WHERE state != 'INVALIDATED' "
                    "AND state != 'ARCHIVED'"
                ).fetchone()[0],
            }

    # -- integrity ------------------------------------------------------------------------------
    def verify(self, dim: int | None = None) -> list[str]:
        """Check the ledger's invariants; return human-readable violations (empty = healthy)."""
        from remem_agent.store.verify import verify_sqlite

        with self.read() as tx:
            return verify_sqlite(tx.c, dim)


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (triggers contain ';' inside BEGIN...END)."""
    out, buf = [], ""
    for line in script.splitlines():
        if line.strip().startswith("--"):
            continue
        buf += line + "\n"
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
