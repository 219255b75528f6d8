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

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import (
    SchemaVersionError,
    StoreBusyError,
    StoreError,
    UserInputError,
)
from remem_agent.store.base import StoreCommon, backoff_retry
from remem_agent.store.migrations import LATEST, MIGRATIONS
from remem_agent.store.sql import LedgerTx
from remem_agent.types import Memory

T = TypeVar("T")

LEDGER_FILE = "ledger.db"


class _RowCache:
    """Decoded memory rows by id, for the search hot path (one per store object).

    Valid while no other connection has committed (``PRAGMA data_version`` unchanged; this
    connection's own commits do not change it) and kept exact for this connection's own writes:
    ``LedgerTx.transition`` (the only statement that updates a memories row) drops the id, and a
    rolled-back write transaction drops everything.
    """

    def __init__(self, max_items: int = 100_000) -> None:
        self.rows: dict[str, Memory] = {}
        self.data_version = -1
        self.max_items = max_items

    def clear(self) -> None:
        self.rows.clear()
        self.data_version = -1


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


class SQLiteTx(LedgerTx):
    """The SQLite dialect of ``LedgerTx``: embeddings as float32 blobs, a row cache for the hot path."""

    dialect = "sqlite"
    search_order = "rowid"

    def __init__(self, conn: sqlite3.Connection, cache: _RowCache | None = None) -> None:
        self.c = conn
        self._cache = cache

    def run(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.c.execute(sql, args)

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.c.executemany(sql, rows)

    def dump_vector(self, vec: NDArray[np.float32]) -> bytes:
        return np.ascontiguousarray(vec, dtype=np.float32).tobytes()

    def load_vector(self, value: Any) -> NDArray[np.float32]:
        return np.frombuffer(value, dtype=np.float32)

    def forget_row(self, memory_id: str) -> None:
        if self._cache is not None:
            self._cache.rows.pop(memory_id, None)

    def memories(self, ids: Sequence[str]) -> dict[str, Memory]:
        cache = self._cache
        if cache is None:
            return super().memories(ids)
        # Read the version before the rows: the rows are then at least as new as the stamp.
        dv = self.c.execute("PRAGMA data_version").fetchone()[0]
        if dv != cache.data_version:
            cache.rows.clear()
            cache.data_version = dv
        rows = cache.rows
        missing = [i for i in ids if i not in rows]
        if missing:
            fetched = super().memories(missing)
            if len(rows) + len(fetched) > cache.max_items:
                rows.clear()
            rows.update(fetched)
        return {i: rows[i] for i in ids if i in rows}


class SQLiteStore(StoreCommon):
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
    def _retry(self, fn: Callable[[], T]) -> T:
        return backoff_retry(
            fn,
            retryable=_is_locked,
            deadline_s=self._lock_retry_s,
            on_give_up=lambda exc: StoreBusyError(f"ledger {self.path} stayed locked: {exc}"),
        )

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

    def transact(self, fn: Callable[[LedgerTx], T], *, commutative: bool = False) -> T:
        """Run ``fn`` in one write transaction (SQLite has one writer at a time, so it runs once)."""
        with self.write() as tx:
            return fn(tx)

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
            except sqlite3.Error as exc:  # typed like write(): a driver error is never raised bare
                if _is_locked(exc):
                    raise StoreBusyError(f"ledger {self.path} stayed locked: {exc}") from exc
                raise StoreError(f"ledger {self.path}: {exc}") from exc
            except UnicodeEncodeError as exc:  # a lookup value SQLite cannot bind (a lone surrogate)
                raise UserInputError(f"cannot look up a value that is not valid UTF-8 ({exc.reason})") from exc
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")

    # -- the store seam ---------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return str(self.folder)

    def bind_dimension(self, dim: int) -> None:
        """Nothing to do: embeddings are blobs, and the in-process index is built from them."""

    def vector_search(self) -> None:
        return None

    def integrity_problems(self) -> list[str]:
        with self._lock:
            rows = self._conn.execute("PRAGMA integrity_check").fetchall()
        return [f"sqlite integrity_check: {msg}" for (msg,) in rows if msg != "ok"]

    def max_seq(self) -> int:
        with self._lock:  # no transaction needed: one statement, called before every search
            return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM memories").fetchone()[0])


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
