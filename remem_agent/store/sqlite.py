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
* Damage is named, not passed through: a driver error that means a damaged file (unreadable pages,
  "not a database", a missing table) is a ``LedgerCorruptError`` that says what is damaged and how to
  recover; ``verify()`` reports such damage as problems instead of raising.
* A store folder whose ledger was initialised never silently becomes empty: once the schema has
  committed, a marker file (``store.json``) is written next to the ledger. A folder with the marker
  whose ledger is missing, empty or uninitialised is refused (``LedgerCorruptError``); a folder without
  it (a store killed while being created) is initialised again. Stores created before the marker
  existed get it at their next healthy open.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from remem_agent.errors import (
    LedgerCorruptError,
    SchemaVersionError,
    StoreBusyError,
    StoreError,
    UserInputError,
)
from remem_agent.store import erasure, times
from remem_agent.store.base import StoreCommon, backoff_retry
from remem_agent.store.erasure import ScrubReport
from remem_agent.store.migrations import BACKFILLS, LATEST, MIGRATIONS, SQLITE_FIRST_STEPS
from remem_agent.store.sql import (
    LedgerTx,
)
from remem_agent.store.sqlite_cache import ReadCache
from remem_agent.store.sqlite_tx import SQLiteTx

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

LEDGER_FILE = "ledger.db"
MARKER_FILE = "store.json"  # written once the ledger's schema has committed (see the module doc)
TABLES = (
    "meta",
    "memories",
    "events",
    "searches",
    "credits",
    "stats",
    "attributes",
    "memories_fts",
    "pending_outcomes",
    "responses",
    "prior_calibration",
    "memory_times",
    "retrieval_base",
    "search_decisions",
    "group_contribution",
)
TRIGGERS = (
    "events_append_only_u",
    "events_append_only_d",
    "credits_append_only_u",
    "credits_append_only_d",
    "memories_never_deleted",
    "memories_embedding_fixed",
    "memories_scope_fixed",
    "searches_scope_fixed",
    "memories_conversation_fixed",
    "memories_erased_final",
    "search_decisions_fixed",
)
# The triggers that keep the full-text index equal to the served text (schema 5): without them a write
# would leave the lexical channel stale, which verify() reports.
FTS_TRIGGERS = ("memories_fts_insert", "memories_fts_update")


def recovery_hint(path: Path) -> str:
    """How to get the data of a damaged ledger back."""
    return (
        f"restore the store folder from a backup (`remem backup` makes one while the store is in use), or "
        f'salvage the readable rows: sqlite3 {path} ".recover" | sqlite3 NEW_FOLDER/{LEDGER_FILE} and check '
        "the result with `remem verify NEW_FOLDER`"
    )


def is_damage(exc: BaseException) -> bool:
    """True for driver errors that mean a damaged ledger file rather than a busy or misused one.

    Text that is not UTF-8 where SQLite keeps UTF-8 (a schema statement, a row's text) is damage too: the
    library never writes it (every text is checked before it is bound).
    """
    if isinstance(exc, UnicodeDecodeError):
        return True
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB":
        return True
    msg = str(exc).lower()
    return any(
        s in msg
        for s in (
            "malformed",
            "not a database",
            "no such table",
            "no such column",
            "file is encrypted",
            "could not decode to utf-8",
        )
    )


# WAL pages after which a commit checkpoints (SQLite's default is 1,000, 4 MB). Why more: a batch of 1,000
# memories writes about 3 MB of pages, so with the default nearly every batch's commit also checkpointed,
# writing pages into the database file and syncing it; pages that later batches change again (index and
# full-text pages) were written and synced each time. With 10,000 the checkpoint comes every ~10 batches and
# the WAL stays below ~40 MB (adding 100k memories, one interleaved pair on a loaded machine: 3,965 -> 4,489
# adds/s wall, the same CPU). Durability is unchanged: a commit is durable in the WAL either way
# (``synchronous`` decides when that is synced).
WAL_AUTOCHECKPOINT_PAGES = 10_000


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


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
        self.marker = self.folder / MARKER_FILE
        self._lock = threading.RLock()
        self._lock_retry_s = lock_retry_s
        self._read_cache = ReadCache()
        initialised = self.marker.is_file()
        if initialised and (not self.path.is_file() or self.path.stat().st_size == 0):
            state = "is missing" if not self.path.exists() else "is empty (0 bytes)"
            raise LedgerCorruptError(
                f"ledger {self.path} {state}, but {self.marker} says this store was initialised: its memories "
                "are gone, refusing to start an empty store in their place",
                recovery_hint(self.path) + f"; to really start over, delete the folder {self.folder}",
            )
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open ledger {self.path}: {exc}") from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone())
            self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            # 64 MiB page cache (default 2 MiB): the id/key/event indexes of a 100k store stay hot.
            self._conn.execute("PRAGMA cache_size = -65536")
            self._conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            if initialised and self.schema_version == 0:
                raise LedgerCorruptError(
                    f"ledger {self.path} holds no ledger schema, but {self.marker} says this store was initialised",
                    recovery_hint(self.path),
                )
            self._migrate()
            self._check_schema()
            self._resolve_times()
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.Error | UnicodeDecodeError):
                raise self._driver_error(exc, "cannot open ledger") from exc
            if isinstance(exc, StoreError) and is_damage(exc.__cause__ or exc):
                raise self._driver_error(exc.__cause__ or exc, "cannot open ledger") from exc
            raise
        if not initialised:
            self._write_marker()

    # -- damage ---------------------------------------------------------------------------------
    def _driver_error(self, exc: BaseException, doing: str = "ledger") -> StoreError:
        """A driver error as the library's error: damage -> LedgerCorruptError, else StoreError."""
        if is_damage(exc):
            return LedgerCorruptError(f"{doing} {self.path}: the file is damaged ({exc})", recovery_hint(self.path))
        return StoreError(f"{doing} {self.path}: {exc}")

    def _check_schema(self) -> None:
        """Every ledger table is there (a dropped table would otherwise fail later, mid-operation)."""
        with self._lock:
            names = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = [t for t in TABLES if t not in names]
        if missing:
            raise LedgerCorruptError(
                f"ledger {self.path} (schema version {self.schema_version}) lacks the tables {missing}",
                recovery_hint(self.path),
            )

    def _write_marker(self) -> None:
        """Record that this folder's ledger is initialised (atomically: write a temp file, then rename)."""
        tmp = self.marker.with_name(f".{MARKER_FILE}.{os.getpid()}.tmp")
        info = {"store": "remem-agent", "ledger": LEDGER_FILE, "initialised_at": time.time()}
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(info, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.marker)
        except OSError:
            tmp.unlink(missing_ok=True)  # a read-only folder: the store still works, unprotected

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def scrub(self) -> ScrubReport:
        """Rewrite the ledger file and empty its WAL, so that no freed page keeps erased bytes
        (store/erasure.py)."""
        with self._lock:
            try:
                report = erasure.scrub_sqlite(self._conn)
            except sqlite3.Error as exc:
                raise self._driver_error(exc, "cannot scrub ledger") from exc
            finally:
                self._read_cache.clear()
        return report

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
                first = SQLITE_FIRST_STEPS.get(number)
                if first is not None:
                    first(tx.c)
                for stmt in _split_sql(sql):
                    tx.c.execute(stmt)
                backfill = BACKFILLS.get(number)
                if backfill is not None:
                    backfill(tx)
                tx.c.execute(f"PRAGMA user_version = {number}")

    def _resolve_times(self) -> None:
        """A store whose time mentions another resolver version wrote has them resolved again, once."""
        with self.read() as rtx:
            current = times.is_current(rtx)
        if not current:
            with self.write() as tx:
                if not times.is_current(tx):
                    times.reindex(tx)

    # -- transactions ---------------------------------------------------------------------------
    def _retry(self, fn: Callable[[], T]) -> T:
        return backoff_retry(
            fn,
            retryable=_is_locked,
            deadline_s=self._lock_retry_s,
            on_give_up=lambda exc, tried: StoreBusyError(f"ledger {self.path} stayed locked ({tried}): {exc}"),
        )

    @contextmanager
    def write(self) -> Iterator[SQLiteTx]:
        """A write transaction (BEGIN IMMEDIATE): all or nothing."""
        with self._lock:
            self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
            tx = SQLiteTx(self._conn, self._read_cache)
            try:
                yield tx
                tx.insert_buffered()  # before the commit: the rows the transaction still buffers
            except sqlite3.Error as exc:
                self._rollback()
                raise self._driver_error(exc) from exc
            except BaseException:
                self._rollback()
                raise
            try:
                self._retry(lambda: self._conn.execute("COMMIT"))
            except sqlite3.Error as exc:
                self._rollback()
                raise self._driver_error(exc, "commit failed: ledger") from exc
            except BaseException:
                self._rollback()
                raise

    def transact(self, fn: Callable[[LedgerTx], T], *, commutative: bool = False) -> T:
        """Run ``fn`` in one write transaction (SQLite has one writer at a time, so it runs once)."""
        with self.write() as tx:
            return fn(tx)

    def _rollback(self) -> None:
        self._read_cache.clear()  # rows and counts read inside the aborted transaction may be of uncommitted rows
        # SQLite may already have rolled back by itself (disk full, I/O error): only roll back what is open.
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    @contextmanager
    def read(self) -> Iterator[SQLiteTx]:
        """A read transaction: a consistent snapshot for several queries."""
        with self._lock:
            self._retry(lambda: self._conn.execute("BEGIN"))
            tx = SQLiteTx(self._conn, self._read_cache)
            try:
                yield tx
                tx.insert_buffered()  # nothing, unless a caller wrote in a read transaction: never lose rows
            except sqlite3.Error as exc:  # typed like write(): a driver error is never raised bare
                if _is_locked(exc):
                    raise StoreBusyError(f"ledger {self.path} stayed locked: {exc}") from exc
                raise self._driver_error(exc) from exc  # damage -> LedgerCorruptError, else StoreError
            except UnicodeEncodeError as exc:  # a lookup value SQLite cannot bind (a lone surrogate)
                raise UserInputError(f"cannot look up a value that is not valid UTF-8 ({exc.reason})") from exc
            finally:
                if self._conn.in_transaction:
                    pending = sys.exc_info()[1]
                    try:
                        self._conn.execute("COMMIT")
                    except sqlite3.Error as exc:  # ending a read on a damaged file: never a raw driver error
                        with contextlib.suppress(sqlite3.Error):
                            self._conn.execute("ROLLBACK")
                        if pending is None:
                            raise self._driver_error(exc) from exc

    # -- the store seam ---------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return str(self.folder)

    def bind_dimension(self, dim: int) -> None:
        """Nothing to do: embeddings are blobs, and the in-process index is built from them."""

    def vector_search(self) -> None:
        return None

    def integrity_problems(self) -> list[str]:
        try:
            with self._lock:
                rows = self._conn.execute("PRAGMA integrity_check").fetchall()
                names = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        except sqlite3.DatabaseError as exc:
            return [f"sqlite integrity_check could not run, the file is damaged ({exc}); {recovery_hint(self.path)}"]
        problems = [f"sqlite integrity_check: {msg}" for (msg,) in rows if msg != "ok"]
        try:  # SQLite writes whole pages: a partial last page means the file was cut (its tail is lost)
            with self._lock:
                page = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
            size = self.path.stat().st_size
        except (sqlite3.DatabaseError, OSError):
            page, size = 0, 0
        if page and size % page:
            problems.append(
                f"the ledger file is {size} bytes, not a whole number of {page}-byte pages: it was truncated"
            )
        if problems:
            problems.append(f"the ledger file is damaged; {recovery_hint(self.path)}")
        problems += [f"trigger {t} is missing: append-only rules are not enforced" for t in TRIGGERS if t not in names]
        problems += [
            f"trigger {t} is missing: the full-text index is not kept up to date with the memories"
            for t in FTS_TRIGGERS
            if t not in names
        ]
        problems += self._fts_integrity_problems()
        return problems

    def _fts_integrity_problems(self) -> list[str]:
        """FTS5's own check of the full-text index against the memories (its structure, and that each
        row's entry holds exactly its text's tokens once: a doubled entry shows only here).

        It is an INSERT command, so it takes the write lock for a moment (nothing is written); a
        read-only ledger file skips it (``verify_ledger``'s read-only comparison still runs).
        """
        with self._lock:
            if self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memories_fts'").fetchone() is None:
                return []  # reported by the lexical index check (and refused at open)
            try:
                self._retry(
                    lambda: self._conn.execute(
                        "INSERT INTO memories_fts (memories_fts, rank) VALUES ('integrity-check', 1)"
                    )
                )
            except StoreBusyError as exc:
                return [f"the full-text index check could not take the write lock ({exc})"]
            except sqlite3.OperationalError as exc:
                if "readonly" in str(exc).lower() or "read-only" in str(exc).lower():
                    return []
                return [f"the full-text index check could not run ({exc})"]
            except sqlite3.DatabaseError as exc:
                return [
                    f"the full-text index memories_fts is damaged (FTS5 integrity-check: {exc}); rebuild it from the "
                    f"memories with: sqlite3 {self.path} \"INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')\""
                ]
        return []

    def verify(self, dim: int | None = None) -> list[str]:
        """As ``StoreCommon.verify``, but a ledger too damaged to read is reported, not raised."""
        problems = self.integrity_problems()
        try:
            with self.read() as tx:
                from remem_agent.store.verify import verify_ledger

                return verify_ledger(tx, dim, problems)
        except (sqlite3.DatabaseError, StoreError) as exc:
            if not any("damaged" in p for p in problems):
                problems.append(f"the ledger could not be read ({exc}); {recovery_hint(self.path)}")
            return problems

    def backup_to(self, path: str | Path) -> None:
        """Write a consistent copy of the ledger to the file ``path`` (SQLite's online backup API).

        One step under this store's lock: readers and writers of other processes go on (WAL), and
        the copy is the snapshot of the moment the step ran.
        """
        target = sqlite3.connect(path)
        try:
            with self._lock:
                self._retry(lambda: self._conn.backup(target))
        except sqlite3.Error as exc:
            raise self._driver_error(exc, "backup of ledger") from exc
        finally:
            target.close()

    def max_seq(self) -> int:
        with self._lock:  # no transaction needed: one statement, called before every search
            return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM memories").fetchone()[0])

    def disk_bytes(self) -> int:
        """The ledger file with its write-ahead log and shared-memory index."""
        files = (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"))
        return sum(f.stat().st_size for f in files if f.is_file())


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
