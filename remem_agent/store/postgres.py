"""The shared ledger: PostgreSQL with pgvector, for several processes on several machines.

Why these choices:

* **Isolation.** Learning writes (``add``, ``feedback``) run at ``SERIALIZABLE``: PostgreSQL then
  guarantees the result equals some one-at-a-time order, which is exactly what the SQLite ledger
  gets from its single writer, so supersession, outcome statistics and lifecycle moves cannot be
  lost or doubled by concurrent workers. A transaction that loses a conflict is rolled back and run
  again (``transact``) with jittered backoff; that is why write bodies are closures without outside
  effects. Search records only append a row and increment counters (commutative), so they run at
  ``READ COMMITTED`` and never conflict. Reads see one ``REPEATABLE READ`` snapshot.
* **Candidates** come from an HNSW index (cosine) on ``vector(dim)`` inside the database, so no
  process holds a copy of the vectors and a memory added on one machine is found by all others at
  once. ``hnsw.ef_search`` (the search width) is ``max(ef_search, pool)``: pgvector returns at most
  ef_search rows, and a wider search finds more of the exact neighbours (measured in
  results/perf/postgres.json: pool recall at 100k memories 0.77 at width 40, 0.91 at 200). Pools
  above 1000 fall back to an exact scan.
* **Connections** come from a ``psycopg_pool.ConnectionPool``; the async API runs these calls in
  worker threads, so the pool size bounds concurrency per process.
* **Errors** are mapped once, here: unreachable server and bad login -> ``StoreConnectionError``,
  no pgvector -> ``MissingExtensionError``, newer schema -> ``SchemaVersionError``, conflicts that
  outlast the retry budget -> ``StoreBusyError``; each message says what to do.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from numpy.typing import NDArray

from remem_agent._extras import require
from remem_agent.errors import (
    MissingExtensionError,
    SchemaVersionError,
    StoreBusyError,
    StoreConnectionError,
    StoreError,
    UserInputError,
)
from remem_agent.store import erasure, times
from remem_agent.store.base import StoreCommon, backoff_retry
from remem_agent.store.erasure import ScrubReport
from remem_agent.store.migrations import BACKFILLS
from remem_agent.store.pg_migrations import LATEST, LEXICAL_POSTINGS_VERSION, MIGRATIONS
from remem_agent.store.sql import (
    LedgerTx,
)

require("psycopg", "postgres", feature="the PostgreSQL store")
require("psycopg_pool", "postgres", feature="the PostgreSQL store")

import psycopg  # noqa: E402
from psycopg import errors as pg_errors  # noqa: E402
from psycopg.adapt import Dumper, Loader  # noqa: E402
from psycopg.pq import Format  # noqa: E402
from psycopg.types import TypeInfo  # noqa: E402
from psycopg_pool import ConnectionPool, PoolTimeout  # noqa: E402

from remem_agent.store.pg_search import EF_SEARCH_MAX, PgVectorSearch  # noqa: E402
from remem_agent.store.postgres_tx import LexicalTotals, PostgresTx, lock_key  # noqa: E402

log = logging.getLogger("remem_agent.store.postgres")
T = TypeVar("T")

_LEVELS = {
    "SERIALIZABLE": psycopg.IsolationLevel.SERIALIZABLE,
    "REPEATABLE READ": psycopg.IsolationLevel.REPEATABLE_READ,
    "READ COMMITTED": psycopg.IsolationLevel.READ_COMMITTED,
}
HNSW_MAX_DIM = 2000  # pgvector 0.6 indexes `vector` columns up to 2000 dimensions


def redact(url: str) -> str:
    """The URL without its password (in the user part or a ``password=`` parameter), for messages.

    Raises UserInputError for a URL that cannot be parsed (bad port, broken IPv6 host).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UserInputError(
            f"invalid PostgreSQL URL ({exc}); expected postgresql://user:password@host:port/db"
        ) from exc
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        netloc = f"{parts.username}:***@{host}"
    del port
    query = "&".join(
        f"{k}=***" if k.lower() == "password" else (f"{k}={v}" if sep else k)
        for k, sep, v in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# -- the vector type on the wire ---------------------------------------------------------------
class _VectorDumper(Dumper):
    """numpy float32 vector -> pgvector binary format (dim, unused, big-endian float32s)."""

    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        arr = np.asarray(obj, dtype=">f4").ravel()
        return struct.pack(">HH", arr.size, 0) + arr.tobytes()


class _VectorTextLoader(Loader):
    format = Format.TEXT

    def load(self, data: Any) -> NDArray[np.float32]:
        text = bytes(data).decode("ascii").strip("[]")
        return np.array(text.split(",") if text else [], dtype=np.float32)


def _register_vector(conn: psycopg.Connection[Any]) -> None:
    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise MissingExtensionError("the vector type is not visible on this connection")
    info.register(conn)
    conn.adapters.register_dumper(np.ndarray, type("VectorDumper", (_VectorDumper,), {"oid": info.oid}))
    conn.adapters.register_loader(info.oid, _VectorTextLoader)


# -- error mapping -----------------------------------------------------------------------------
def _connection_error(exc: BaseException, where: str) -> StoreError:
    msg = str(exc).strip()
    low = msg.lower()
    if (
        "password authentication failed" in low
        or "no password supplied" in low
        or ("role" in low and ("does not exist" in low))
    ):
        return StoreConnectionError(
            f"PostgreSQL at {where} refused the login ({msg}); check the user and password in the URL "
            "(or PGUSER/PGPASSWORD) and that the role exists"
        )
    if "servname not supported" in low or "invalid port" in low:
        return StoreConnectionError(f"invalid port in the PostgreSQL URL {where} ({msg}); use host:port with a number")
    if "database" in low and "does not exist" in low:
        return StoreConnectionError(
            f"PostgreSQL at {where}: {msg}; create it first (e.g. `createdb NAME`) or fix the database name in the URL"
        )
    return StoreConnectionError(
        f"cannot reach PostgreSQL at {where} ({msg}); check host and port in the URL and that the server is running"
    )


def _operational_error(exc: psycopg.OperationalError, where: str) -> StoreError:
    """psycopg's OperationalError covers more than unreachable servers; only those are connection errors.

    A lock or statement timeout, a full disk or an out-of-memory server answered: telling the user to
    check host and port would send them the wrong way. The transaction is rolled back in every case.
    """
    if isinstance(exc, pg_errors.LockNotAvailable):
        return StoreBusyError(
            f"ledger {where}: another transaction held a lock longer than lock_timeout allows ({exc})"
        )
    if isinstance(exc, pg_errors.QueryCanceled):
        return StoreError(
            f"ledger {where}: the server canceled the statement (statement_timeout or a cancel request); "
            f"nothing of the transaction was written: {exc}"
        )
    state = exc.sqlstate or ""
    if state[:2] in ("53", "58") and state != "53300":  # resources (disk, memory) or a server-side I/O error
        return StoreError(
            f"the PostgreSQL server at {where} could not complete the statement (SQLSTATE {state}: {exc}); "
            "nothing of the transaction was written; ask its administrator (disk space, memory, server log)"
        )
    return _connection_error(exc, where)


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, StoreBusyError) and isinstance(
        exc.__cause__, pg_errors.SerializationFailure | pg_errors.DeadlockDetected
    )


class PostgresStore(StoreCommon):
    """The ledger in one PostgreSQL schema (default ``remem``), shared by every process that opens the URL."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "remem",
        create: bool = True,
        pool_size: int = 8,
        ef_search: int = 200,
        connect_timeout_s: float = 10.0,
        retry_s: float = 60.0,
    ) -> None:
        if not schema.isidentifier():
            raise UserInputError(f"schema must be a plain identifier, got {schema!r}")
        if not isinstance(pool_size, int) or pool_size < 1:
            raise UserInputError("pool_size must be a positive integer")
        if not isinstance(ef_search, int) or not 1 <= ef_search <= EF_SEARCH_MAX:
            raise UserInputError(f"ef_search must be an integer in [1, {EF_SEARCH_MAX}]")
        self.ef_search = ef_search
        self.url = url
        self.schema = schema
        self._where = redact(url)
        self._retry_s = retry_s
        self._connect_kwargs: dict[str, Any] = {"connect_timeout": max(1, int(connect_timeout_s))}
        with self._connect() as conn:
            search_path = self._prepare(conn, create=create)
        self._search_path = search_path
        self._lexical_totals = LexicalTotals()
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={**self._connect_kwargs, "autocommit": True},
            configure=self._configure,
            timeout=connect_timeout_s,
            open=False,
            name=f"remem:{self._where}",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            self._pool.close()  # stop its connecting workers: nothing else will
            raise StoreConnectionError(f"cannot open a connection pool to {self._where}: {exc}") from exc
        self._search = PgVectorSearch(self)

    # -- opening ---------------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.url, autocommit=True, **self._connect_kwargs)
        except psycopg.OperationalError as exc:
            raise _connection_error(exc, self._where) from exc
        except psycopg.ProgrammingError as exc:  # a malformed URL
            raise UserInputError(f"invalid PostgreSQL URL {self._where}: {exc}") from exc

    def _prepare(self, conn: psycopg.Connection[Any], *, create: bool) -> str:
        """Check the store, pgvector and the schema version, migrate if needed; returns the search_path.

        Existence and privileges are read from the catalogs (visible to every role), so a role without
        rights on an existing store is told what to grant instead of "no store", and a read-only open
        (``create=False``) of a database without a store changes nothing, not even extensions.
        """
        q = '"' + self.schema + '"'
        found = conn.execute(
            "SELECT has_schema_privilege(n.oid, 'USAGE') FROM pg_namespace n WHERE n.nspname = %s", (self.schema,)
        ).fetchone()
        has_ledger = found is not None and _catalog_has_table(conn, self.schema, "schema_migrations")
        if not has_ledger and not create:
            raise UserInputError(f"{self._where} holds no remem store (no schema {self.schema!r} with a ledger)")
        if found is not None and not found[0]:
            raise StoreConnectionError(self._grant_hint(f"no USAGE privilege on schema {self.schema!r}"))
        try:
            with conn.transaction():
                # One opener at a time across every process; the lock ends with the transaction.
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("migrate", self.schema),))
                ext_schema = self._ensure_vector(conn)
                if not has_ledger:
                    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {q}.schema_migrations "
                        "(version integer PRIMARY KEY, at timestamptz)"
                    )
                row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {q}.schema_migrations").fetchone()
                version = int(row[0]) if row else 0
                if version > LATEST:
                    raise SchemaVersionError(version, LATEST, self._where)
                search_path = f'{q}, "{ext_schema}"' if ext_schema != self.schema else q
                conn.execute(f"SET LOCAL search_path TO {search_path}")
                for number, sql in MIGRATIONS:
                    if number > version:
                        conn.execute(sql)
                        backfill = BACKFILLS.get(number)
                        if backfill is not None:  # the migration's data step, same transaction
                            backfill(PostgresTx(conn))
                        if number == LEXICAL_POSTINGS_VERSION:  # PostgreSQL's own data step
                            PostgresTx(conn).index_unindexed()
                        conn.execute(f"INSERT INTO {q}.schema_migrations VALUES (%s, now())", (number,))
                if not times.is_current(PostgresTx(conn)):  # written by another time resolver: resolved again
                    times.reindex(PostgresTx(conn))
        except pg_errors.InsufficientPrivilege as exc:
            if has_ledger:
                raise StoreConnectionError(self._grant_hint(str(exc).strip())) from exc
            raise StoreConnectionError(
                f"the user of {self._where} may not create the ledger in schema {self.schema!r} ({exc}); "
                "grant it CREATE on the database, or let an administrator open the store once"
            ) from exc
        return search_path

    def _grant_hint(self, what: str) -> str:
        s = '"' + self.schema + '"'
        return (
            f"the user of {self._where} may not use the store in schema {self.schema!r} ({what}); as its owner run: "
            f"GRANT USAGE ON SCHEMA {s} TO <user>; GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {s} "
            f"TO <user>; GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO <user>;"
        )

    def _ensure_vector(self, conn: psycopg.Connection[Any]) -> str:
        """The schema of the pgvector extension, creating it when missing (inside the opener's lock)."""
        row = conn.execute(_EXT_SCHEMA).fetchone()
        if row:
            return str(row[0])
        try:
            with conn.transaction():  # a savepoint: a failure here must not abort the opener's transaction
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except pg_errors.UniqueViolation:
            pass  # another session (not a remem opener) created it at the same moment: use theirs
        except (pg_errors.UndefinedFile, pg_errors.FeatureNotSupported) as exc:
            raise MissingExtensionError(
                f"PostgreSQL at {self._where} does not have the pgvector extension installed ({exc}); "
                "install pgvector on the server (https://github.com/pgvector/pgvector#installation), "
                "then reopen the store"
            ) from exc
        except pg_errors.InsufficientPrivilege as exc:
            raise MissingExtensionError(
                f"the database at {self._where} lacks the pgvector extension and this user may not create it "
                f"({exc}); ask an administrator to run CREATE EXTENSION vector; in that database"
            ) from exc
        row = conn.execute(_EXT_SCHEMA).fetchone()
        assert row is not None
        return str(row[0])

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SET search_path TO {self._search_path}")
        # Session-wide search width, so the usual candidate query is one autocommit statement.
        conn.execute(f"SET hnsw.ef_search = {int(self.ef_search)}")
        _register_vector(conn)

    def disk_bytes(self) -> int:
        """Every table of the ledger's schema with its indexes and TOAST data."""
        rows = self._statement(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'm', 'p')",
            (self.schema,),
        )
        return int(rows[0][0])

    def scrub(self) -> ScrubReport:
        """Rewrite the tables erasures changed, without their old row versions (store/erasure.py)."""

        def run(sql: str) -> list[Any]:
            with self._errors_mapped(), self._pool.connection() as conn:
                cur = conn.execute(sql)
                return cur.fetchall() if cur.description else []

        return erasure.scrub_postgres(run)

    def _statement(self, sql: str, params: Any = None) -> list[Any]:
        """One read statement outside an explicit transaction (a single statement sees one snapshot):
        one round trip instead of BEGIN/statement/COMMIT, for the per-search hot path."""
        with self._errors_mapped(), self._pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    @contextmanager
    def _errors_mapped(self) -> Iterator[None]:
        """Driver and pool errors as the library's typed errors (conflicts become retryable StoreBusyError)."""
        try:
            yield
        except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as exc:
            raise StoreBusyError(f"ledger {self._where}: concurrent transactions conflicted: {exc}") from exc
        except PoolTimeout as exc:
            raise StoreConnectionError(f"no connection to {self._where} became available: {exc}") from exc
        except psycopg.OperationalError as exc:
            raise _operational_error(exc, self._where) from exc
        except psycopg.Error as exc:
            raise StoreError(f"ledger {self._where}: {exc}") from exc
        except UnicodeEncodeError as exc:  # psycopg cannot send a lone surrogate; nothing was sent or written
            raise UserInputError(f"cannot send a value that is not valid UTF-8 ({exc.reason})") from exc

    # -- the store seam ----------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return self._where

    @property
    def schema_version(self) -> int:
        with self.read() as tx:
            return int(tx.run("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0])

    def close(self) -> None:
        self._search.close()  # scope index builds under way are cancelled first
        self._pool.close()

    @contextmanager
    def _tx(self, isolation: str, *, read_only: bool = False) -> Iterator[PostgresTx]:
        with self._errors_mapped(), self._pool.connection() as conn:
            # Set on the idle connection, psycopg puts both into the BEGIN: no extra round trip.
            conn.isolation_level = _LEVELS[isolation]
            conn.read_only = read_only
            with conn.transaction():
                yield PostgresTx(conn, self.schema, self._lexical_totals)

    @contextmanager
    def write(self) -> Iterator[PostgresTx]:
        """One SERIALIZABLE write transaction, not retried (use ``transact`` for automatic retries)."""
        with self._tx("SERIALIZABLE") as tx:
            yield tx

    @contextmanager
    def read(self) -> Iterator[PostgresTx]:
        """A consistent snapshot (REPEATABLE READ, read only) for several queries."""
        with self._tx("REPEATABLE READ", read_only=True) as tx:
            yield tx

    def transact(self, fn: Callable[[LedgerTx], T], *, commutative: bool = False) -> T:
        """Run ``fn`` in a write transaction; rerun it when it lost a serialization conflict."""
        level = "READ COMMITTED" if commutative else "SERIALIZABLE"

        def attempt() -> T:
            with self._tx(level) as tx:
                return fn(tx)

        return backoff_retry(
            attempt,
            retryable=_is_conflict,
            deadline_s=self._retry_s,
            on_give_up=lambda exc, tried: StoreBusyError(
                f"ledger {self._where}: still conflicting after {tried}: {exc}"
            ),
        )

    def bind_dimension(self, dim: int) -> None:
        """Type the vector column as ``vector(dim)`` and build its HNSW index (once per store)."""

        def bind(tx: LedgerTx) -> None:
            assert isinstance(tx, PostgresTx)
            tx.run("SELECT pg_advisory_xact_lock(?)", (lock_key("bind", self.schema),))
            typmod = tx.run(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'memories'::regclass AND attname = 'embedding'"
            ).fetchone()[0]
            if typmod == dim:
                return
            if typmod not in (-1, None):
                raise UserInputError(f"store {self._where} holds {typmod}-dimensional vectors, not {dim}")
            tx.run(f"ALTER TABLE memories ALTER COLUMN embedding TYPE vector({int(dim)})")
            if dim <= HNSW_MAX_DIM:
                tx.run(
                    "CREATE INDEX IF NOT EXISTS memories_embedding_hnsw ON memories "
                    "USING hnsw (embedding vector_cosine_ops)"
                )
            else:
                log.warning("dimension %d > %d: no HNSW index, searches scan exactly", dim, HNSW_MAX_DIM)

        self.transact(bind)

    def vector_search(self) -> PgVectorSearch:
        return self._search

    def candidates(
        self, query: NDArray[np.float32], k: int, *, scopes: Collection[str] | None = None
    ) -> tuple[list[str], NDArray[np.float32]]:
        """The ``k`` most similar memories (of ``scopes`` only, when given), best first (remem_agent/store/pg_search.py
        says which path a search takes)."""
        return self._search.candidates(query, k, scopes=scopes)

    def index_scopes(self) -> list[str]:
        """Build now, one after the other, the HNSW index of every scope that should have its own and has none yet
        (searches build them in the background as scopes grow); returns the scopes indexed by this call."""
        return [scope for scope in self._search.scopes_due() if self._search.build(scope)]


_EXT_SCHEMA = (
    "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
)


def _catalog_has_table(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    ).fetchone()
    return row is not None
