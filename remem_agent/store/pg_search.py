"""Candidate search on PostgreSQL: which path a query takes, and the HNSW indexes of single large scopes.

pgvector 0.6 cannot filter inside an HNSW index scan: the ledger's index gives the nearest ``hnsw.ef_search`` rows
of the whole ledger, and a scope filter keeps that scope's rows among them. For a scope that holds a small share
of a large ledger few or none pass. So a scope-filtered search takes one of three paths (:func:`choose_path`):

* **exact**: a scope known to hold at most :data:`EXACT_SCOPE_ROWS` memories is ranked exactly, through the
  ``memories_scope`` index (the cost is the scope's size, not the ledger's);
* **scope index**: a scope with an HNSW index of its own (a partial index ``WHERE scope = '...'``) is searched in
  it, like a ledger of its own;
* **ledger index**: otherwise the ledger's index, re-asked at the widest width when too few rows pass and the share
  that passed says the widest would give enough, then the exact scan (whose cost is again the scope's size).

A scope counted past :data:`SCOPE_INDEX_ROWS` that holds at most :data:`SCOPE_INDEX_MAX_SHARE` of the ledger
(:func:`wants_scope_index`) gets its index built in the background (``CREATE INDEX CONCURRENTLY``, so writes go on;
one builder across processes through an advisory lock); until it is valid the scope takes the ledger-index path.
``PostgresStore.index_scopes()`` builds every index that is due at once. The thresholds come from
``evals/perf/tenants.py`` (a million memories in 1,000 Zipf-sized scopes; results/perf/tenants.json).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

import numpy as np
import psycopg
from numpy.typing import NDArray
from psycopg import errors as pg_errors
from psycopg import sql

from remem_agent.store.postgres_tx import PostgresTx, lock_key

log = logging.getLogger("remem_agent.store.postgres")

EF_SEARCH_MAX = 1000  # pgvector's upper bound for hnsw.ef_search
# Scopes known to hold at most this many memories are ranked exactly without asking an HNSW index first. Measured
# at a million memories (results/perf/tenants.json): the exact scan costs about 1.7 ms per 1,000 rows (6.8 ms at
# 4,947, 17.6 at 10,276), a scope's own index 7 to 10 ms whatever its size, the ledger's index 12 to 68 ms for a
# scope that is a small share of the ledger. So up to 5,000 exactly, beyond that the scope's own index.
EXACT_SCOPE_ROWS = 5000
# A scope counted at this many memories or more, holding at most this share of the ledger, gets its own index.
SCOPE_INDEX_ROWS = 5000
SCOPE_INDEX_MAX_SHARE = 0.5
SCOPE_INDEX_PREFIX = "memories_hnsw_scope_"
RECOUNT_S = 300.0  # a scope's size and the list of valid scope indexes are read again after this long
_SCOPE_SIZES_KEPT = 10_000  # scopes whose last known size a store remembers (the oldest are forgotten)
SIM_TIE_EPS = 1e-6  # cosine similarities closer than this are ties (float32 noise is ~6e-8)

SearchPath = Literal["exact", "scope_index", "ledger_index"]


def choose_path(*, k: int, rows: int | None, indexed: bool) -> SearchPath:
    """The path of a search for ``k`` candidates over scopes of ``rows`` memories (None: not counted yet)."""
    if k > EF_SEARCH_MAX or (rows is not None and rows <= EXACT_SCOPE_ROWS):
        return "exact"
    return "scope_index" if indexed else "ledger_index"


def wants_scope_index(rows: int, ledger_rows: int) -> bool:
    """Whether a scope of ``rows`` memories in a ledger of ``ledger_rows`` should have an index of its own: large,
    and a small enough share that the ledger's index would give few of its rows."""
    return rows >= SCOPE_INDEX_ROWS and rows <= SCOPE_INDEX_MAX_SHARE * ledger_rows


def scope_index_name(scope: str) -> str:
    return SCOPE_INDEX_PREFIX + hashlib.sha1(scope.encode()).hexdigest()[:16]


class SearchedStore(Protocol):
    """What the search needs of ``PostgresStore`` (a protocol: the store module imports this one)."""

    ef_search: int
    url: str
    schema: str
    _search_path: str
    _connect_kwargs: dict[str, Any]

    def _statement(self, sql: str, params: Any = None) -> list[Any]: ...

    def _tx(self, isolation: str, *, read_only: bool = False) -> AbstractContextManager[PostgresTx]: ...


class PgVectorSearch:
    """The candidate search of one ``PostgresStore`` (its ``VectorSearch``): path choice, counts, scope indexes."""

    def __init__(self, store: SearchedStore) -> None:
        self.store = store
        # rows per scope set as last counted, with when (a cost hint only: results are exact either way)
        self._rows: dict[frozenset[str], tuple[int, float]] = {}
        self._lock = threading.Lock()  # searches run on several worker threads
        self._indexes: frozenset[str] = frozenset()  # names of the valid scope indexes
        self._indexes_read = -RECOUNT_S
        self._ledger: tuple[int, float] | None = None
        self._builders: dict[str, threading.Thread] = {}
        self._building: dict[str, psycopg.Connection[Any]] = {}
        self._refused: set[str] = set()  # scopes whose index this role may not build
        self._closed = False

    def __len__(self) -> int:
        # Memories are never deleted, so the highest sequence number bounds the count from above
        # (gaps from rolled-back inserts only make a widening pool stop a little later).
        return int(self.store._statement("SELECT COALESCE(MAX(seq), 0) FROM memories")[0][0])

    # -- the search --------------------------------------------------------------------------------
    def candidates(
        self, query: NDArray[np.float32], k: int, *, scopes: Collection[str] | None = None
    ) -> tuple[list[str], NDArray[np.float32]]:
        """The ``k`` most similar memories (of ``scopes`` only, when given), best first."""
        q = np.asarray(query, dtype=np.float32)
        if scopes is None:
            if k > EF_SEARCH_MAX:
                return ties_in_insertion_order(self._exact(q, k, None))
            return ties_in_insertion_order(self._ledger_index(q, k, max(self.store.ef_search, k), None))
        key = frozenset(scopes)
        rows = self._known_rows(key)
        single = next(iter(key)) if len(key) == 1 else None
        if single is not None and rows is None and k <= EF_SEARCH_MAX:
            rows = self._count(key)  # once per RECOUNT_S: what decides between the paths
        indexed = single is not None and scope_index_name(single) in self._valid_indexes()
        path = choose_path(k=k, rows=rows, indexed=indexed)
        if path == "exact":
            return ties_in_insertion_order(self._exact(q, k, key))
        if path == "scope_index":
            assert single is not None
            return ties_in_insertion_order(self._scope_index(q, k, single))
        if (
            single is not None
            and rows is not None
            and rows >= SCOPE_INDEX_ROWS  # the ledger's size is read only for a scope this large
            and wants_scope_index(rows, self._ledger_rows())
        ):
            self._build_in_background(single)
        return ties_in_insertion_order(self._ledger_index_filtered(q, k, key))

    def _ledger_index_filtered(self, q: NDArray[np.float32], k: int, key: frozenset[str]) -> list[Any]:
        """The ledger's index, then at its widest width if that should give ``k``, then exactly.

        The index scan is forced (its ORDER BY ... LIMIT runs before the filter): with the filter in the same
        query the planner may rank a large scope exactly instead, as it did on a store whose statistics were not
        gathered yet (50 ms instead of about 10 at 10k memories)."""
        width = max(self.store.ef_search, k)
        rows = self._ledger_index(q, k, width, key)
        if len(rows) < k:
            seen = int(rows[0][3]) if rows else 0  # rows the index gave before the scope filter
            if seen == width < EF_SEARCH_MAX and len(rows) * EF_SEARCH_MAX >= 1.5 * k * seen:
                rows = self._ledger_index(q, k, EF_SEARCH_MAX, key)
            if len(rows) < k:
                rows = self._exact(q, k, key)
        return rows

    def _ledger_index(self, q: NDArray[np.float32], k: int, width: int, scopes: frozenset[str] | None) -> list[Any]:
        """(id, similarity, seq, rows before the filter): of the index's nearest ``width`` rows, the best ``k``
        of ``scopes``."""
        params: dict[str, Any] = {"q": q, "k": int(k), "w": int(width)}
        cond = _scope_filter(scopes, params)
        text = (
            "SELECT id, sim, seq, seen FROM (SELECT id, sim, seq, scope, count(*) OVER () AS seen FROM ("
            "SELECT id, 1 - (embedding <=> %(q)s) AS sim, seq, scope FROM memories "
            f"ORDER BY embedding <=> %(q)s LIMIT %(w)s) i) h{cond} ORDER BY sim DESC, seq LIMIT %(k)s"
        )
        return self._at_width(text, params, width)

    def _scope_index(self, q: NDArray[np.float32], k: int, scope: str) -> list[Any]:
        """The best ``k`` of one scope from its own index. The scope is written into the statement as a literal:
        the planner matches a partial index only against a predicate whose value it can see. Sorting is off for
        the statement: the order must come from the index, not from ranking the scope's rows exactly, which the
        planner may prefer where its statistics underrate the scope."""
        text = sql.SQL(
            "SELECT id, 1 - (embedding <=> %(q)s) AS sim, seq FROM memories WHERE scope = {} "
            "ORDER BY embedding <=> %(q)s LIMIT %(k)s"
        ).format(sql.Literal(scope))
        return self._at_width(text.as_string(), {"q": q, "k": int(k)}, max(self.store.ef_search, k), no_sort=True)

    def _at_width(self, text: str, params: dict[str, Any], width: int, *, no_sort: bool = False) -> list[Any]:
        if width <= self.store.ef_search and not no_sort:  # the common case: one statement
            return self.store._statement(text, params)
        with self.store._tx("READ COMMITTED", read_only=True) as tx:
            if no_sort:
                tx.conn.execute("SET LOCAL enable_sort = off")
            if width > self.store.ef_search:
                tx.conn.execute(f"SET LOCAL hnsw.ef_search = {int(width)}")
            return list(tx.conn.execute(text, params).fetchall())

    def _exact(self, q: NDArray[np.float32], k: int, key: frozenset[str] | None) -> list[Any]:
        """The exact best ``k`` of the scopes (OFFSET 0 keeps the filter inside: the ORDER BY cannot use HNSW),
        remembering how many rows the scopes hold."""
        params: dict[str, Any] = {"q": q, "k": int(k)}
        cond = _scope_filter(key, params)
        rows = self.store._statement(
            "SELECT id, 1 - (embedding <=> %(q)s), seq, count(*) OVER () FROM (SELECT id, embedding, seq "
            f"FROM memories{cond} OFFSET 0) s ORDER BY embedding <=> %(q)s, seq LIMIT %(k)s",
            params,
        )
        if key is not None:
            self._remember(key, int(rows[0][3]) if rows else 0)
        return rows

    # -- sizes and indexes -------------------------------------------------------------------------
    def _known_rows(self, key: frozenset[str]) -> int | None:
        with self._lock:
            known = self._rows.get(key)
        if known is None:
            return None
        rows, at = known
        if len(key) == 1 and rows > EXACT_SCOPE_ROWS and time.monotonic() - at > RECOUNT_S:
            return None  # a large scope's size is counted again now and then: it may have grown past a threshold
        return rows

    def _remember(self, key: frozenset[str], rows: int) -> None:
        with self._lock:
            self._rows.pop(key, None)  # re-inserted last: the dict keeps the most recently counted
            self._rows[key] = (rows, time.monotonic())
            while len(self._rows) > _SCOPE_SIZES_KEPT:
                self._rows.pop(next(iter(self._rows)))

    def _count(self, key: frozenset[str]) -> int:
        params: dict[str, Any] = {}
        cond = _scope_filter(key, params)
        rows = int(self.store._statement(f"SELECT count(*) FROM memories{cond}", params)[0][0])
        self._remember(key, rows)
        return rows

    def _ledger_rows(self) -> int:
        """The ledger's size, read again after RECOUNT_S (it only decides when a scope gets an index)."""
        with self._lock:
            known = self._ledger
        if known is None or time.monotonic() - known[1] > RECOUNT_S:
            known = (len(self), time.monotonic())
            with self._lock:
                self._ledger = known
        return known[0]

    def _valid_indexes(self) -> frozenset[str]:
        if time.monotonic() - self._indexes_read > RECOUNT_S:
            self.refresh_indexes()
        return self._indexes

    def refresh_indexes(self) -> frozenset[str]:
        """Read which scope indexes exist and are valid (another process may have built one)."""
        found = self.store._statement(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'memories'::regclass AND i.indisvalid AND c.relname LIKE %s",
            (SCOPE_INDEX_PREFIX + "%",),
        )
        self._indexes = frozenset(str(r[0]) for r in found)
        self._indexes_read = time.monotonic()
        return self._indexes

    def scopes_due(self) -> list[str]:
        """The scopes that should have an index of their own and have none yet (largest first)."""
        ledger = len(self)
        found = self.store._statement(
            "SELECT scope, count(*) AS n FROM memories GROUP BY scope HAVING count(*) >= %s ORDER BY n DESC, scope",
            (SCOPE_INDEX_ROWS,),
        )
        have = self.refresh_indexes()
        return [str(s) for s, n in found if wants_scope_index(int(n), ledger) and scope_index_name(str(s)) not in have]

    def build(self, scope: str) -> bool:
        """Build ``scope``'s index now (in this thread); False when another process is building it or this role
        may not. An invalid index left by an interrupted build is dropped first."""
        name = scope_index_name(scope)
        store = self.store
        with psycopg.connect(store.url, autocommit=True, **store._connect_kwargs) as conn:
            # one builder across processes; the lock goes with this connection
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(f"scope-index:{scope}", store.schema),))
            if not (got.fetchone() or (False,))[0]:
                return False
            with self._lock:
                if self._closed:
                    return False
                self._building[scope] = conn
            try:
                conn.execute(f"SET search_path TO {store._search_path}")
                ident = sql.Identifier(store.schema, name)
                invalid = conn.execute(
                    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE c.relname = %s AND c.relnamespace = %s::regnamespace AND NOT i.indisvalid",
                    (name, store.schema),
                ).fetchone()
                if invalid:
                    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(ident))
                conn.execute(
                    sql.SQL(
                        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON memories "
                        "USING hnsw (embedding vector_cosine_ops) WHERE scope = {}"
                    ).format(sql.Identifier(name), sql.Literal(scope))
                )
            except pg_errors.InsufficientPrivilege as exc:
                log.warning("no index of its own for scope %r: this role may not create indexes (%s)", scope, exc)
                self._refused.add(scope)
                return False
            finally:
                with self._lock:
                    self._building.pop(scope, None)
        self.refresh_indexes()
        return True

    def _build_in_background(self, scope: str) -> None:
        with self._lock:
            if self._closed or scope in self._builders or scope in self._refused:
                return
            thread = threading.Thread(target=self._build_logged, args=(scope,), name="remem-scope-index", daemon=True)
            self._builders[scope] = thread
        thread.start()

    def _build_logged(self, scope: str) -> None:
        try:
            self.build(scope)
        except (psycopg.Error, OSError) as exc:  # a cancelled or failed build: the ledger index keeps serving
            if not self._closed:
                log.warning("building the index of scope %r failed: %s", scope, exc)
        finally:
            with self._lock:
                self._builders.pop(scope, None)

    def close(self) -> None:
        """Cancel the builds under way (an interrupted build leaves an invalid index, dropped by the next build)
        and wait for their threads."""
        with self._lock:
            self._closed = True
            building = list(self._building.values())
            threads = list(self._builders.values())
        for conn in building:
            conn.cancel_safe()
        for thread in threads:
            thread.join()


def _scope_filter(scopes: Collection[str] | None, params: dict[str, Any]) -> str:
    """The candidate queries' ``WHERE`` on scope (empty for every scope), its argument put in ``params``."""
    if scopes is None:
        return ""
    params["s"] = sorted(scopes)
    return " WHERE scope = ANY(%(s)s)"


def ties_in_insertion_order(rows: Sequence[Sequence[Any]]) -> tuple[list[str], NDArray[np.float32]]:
    """(id, similarity, seq) rows, most similar first, with equally similar rows in insertion order.

    Why: equally similar memories (common with the hashing embedder) came back in HNSW graph order,
    so the similarity guard and equal scores served other memories than the SQLite store (whose
    FlatIndex sorts stably, i.e. by insertion) for the same rows and query. Equal cosines are not
    always equal here: pgvector divides by float norms, so they can differ in the last float32 digit.
    Rows within ``SIM_TIE_EPS`` of the first of a run are one tie: ordered by ``seq`` and given that
    first similarity (else the guard's sort by similarity would undo the order). Done in Python
    because a second ORDER BY key in the SQL would stop pgvector from using the HNSW index.
    """
    ids: list[str] = []
    sims: list[float] = []
    i = 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and float(rows[i][1]) - float(rows[j][1]) <= SIM_TIE_EPS:
            j += 1
        ids += [str(r[0]) for r in sorted(rows[i:j], key=lambda r: int(r[2]))]
        sims += [float(rows[i][1])] * (j - i)
        i = j
    return ids, np.array(sims, dtype=np.float32)
