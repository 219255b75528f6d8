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

import collections
import contextlib
import functools
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import (
    LedgerCorruptError,
    SchemaVersionError,
    StoreBusyError,
    StoreError,
    UserInputError,
)
from remem_agent.store import bm25, lexical, times
from remem_agent.store.base import StoreCommon, backoff_retry
from remem_agent.store.migrations import BACKFILLS, LATEST, MIGRATIONS
from remem_agent.store.sql import (
    CLAIMS_AT,
    CURRENT_FOR_KEY,
    EVENT_INSERT_COLS,
    KEY_STATE_FACTS,
    LEXICAL_RETIRED,
    MEM_COLS,
    MEMORY_INSERT,
    MEMORY_INSERT_COLS,
    MEMORY_INSERT_WIDTH,
    ROW_UPDATE_BY_ID,
    LedgerTx,
    memory_row_key,
    row_to_memory,
)
from remem_agent.types import ALL_TASKS, AttributeInfo, Memory, TaskStats

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


class _ReadCache:
    """What the search hot path keeps between transactions (one per store object): decoded memory rows by id
    and capped match counts of search words (the lexical channel's choice of words).

    Both hold while no other connection has changed a memories row. Another connection's commit changes
    ``PRAGMA data_version``; the caches then survive if ``SQLiteTx.memories_version`` is unchanged (the other
    connection only recorded searches or feedback without a transition: gateway workers, two ``ReMem`` objects
    on one folder), else both are dropped (``SQLiteTx.check_cache``). This connection's own writes keep them
    exact: ``LedgerTx.transition`` (the only statement that updates a memories row) drops the row and, when it
    changed the text, every count (``SQLiteTx.forget_row``); a rolled-back write transaction drops everything
    (it may have read or counted rows that were never committed).

    A word's count changes only when a memory is inserted (``seq`` grows; rows are never deleted) or a text is
    updated, so counts are also kept while the highest ``seq`` is unchanged; when it grew through this
    connection's own inserts, only matches can have been added, and a count that reached its cap still holds.
    """

    def __init__(self, max_rows: int = 100_000, max_counts: int = 50_000) -> None:
        self.rows: dict[str, Memory] = {}
        self.counts: dict[tuple[str, int], int] = {}
        self.counts_seq = -1  # the highest memory seq the counts were read at
        self.ids_by_seq: dict[int, str] = {}  # the full-text index's rowid -> memory id
        # Outcome statistics: every stats row of a memory (of every task) by task, an empty table for a memory
        # with none. Whole memories: a search asks (memory, "*") and (memory, its task), and task classes vary
        # between searches (94% of the memories a 10k benchmark search fetched by key had been fetched already,
        # for another task). By memory, not by (memory, task): a pool's lookups are one per memory in a table of
        # memories, half as many as by key and without building a key tuple each (the lookups of a search's 56
        # candidates: 38 -> 14 us). Unlike the rows, every commit of another connection drops them (its searches
        # and feedback update stats without touching memories); this connection's own stats writes drop the
        # memories they write (``SQLiteTx.run``/``run_many``). ``stats_held`` counts the memories and rows held.
        self.stats: dict[str, dict[str, TaskStats]] = {}
        self.stats_held = 0
        self.attributes: dict[str, AttributeInfo | None] = {}  # the same rules, for the attributes table
        # The lexical channel's postings (store/bm25.py): a token's rows and frequencies and the index's
        # totals, read at memory seq ``postings_seq`` (a new memory may hold any token: dropped when it grows);
        # the token count of each row by seq (-1: not read), which only a text update changes.
        self.postings: dict[str, bm25.Postings] = {}
        self.postings_entries = 0
        self.postings_seq = -1
        self.totals: tuple[int, int] | None = None
        self.sizes = np.full(0, -1, dtype=np.int32)
        self.max_postings = 2_000_000
        self.data_version = -1
        self.memories_version: tuple[int, int] = (-1, -1)
        self.max_rows = max_rows
        self.max_counts = max_counts

    def clear(self) -> None:
        self.rows.clear()
        self.ids_by_seq.clear()
        self.forget_stats()
        self.attributes.clear()
        self.forget_texts()
        self.data_version = -1
        self.memories_version = (-1, -1)

    def remember_rows(self, found: Iterable[Memory]) -> None:
        """Keep ``found`` rows by id, the table emptied first when they would outgrow ``max_rows`` (a caller
        takes its answer before: an emptied table must not drop rows from the read that filled it)."""
        found = list(found)
        if len(self.rows) + len(found) > self.max_rows:
            self.rows.clear()
        self.rows.update((m.id, m) for m in found)

    def forget_stats(self) -> None:
        """Drop every remembered stats row."""
        self.stats.clear()
        self.stats_held = 0

    def forget_stats_of(self, memory_id: str) -> None:
        """Drop the remembered stats rows of one memory (a write may have changed or added one)."""
        table = self.stats.pop(memory_id, None)
        if table is not None:
            self.stats_held -= 1 + len(table)

    def forget_texts(self) -> None:
        """Drop everything derived from the indexed texts (a text changed without a new seq, or anything)."""
        self.counts.clear()
        self.counts_seq = -1
        self.forget_postings()
        self.sizes = np.full(0, -1, dtype=np.int32)

    def hold_sizes_to(self, seq: int) -> None:
        """Grow the row-size array (doubling, -1 = not read) so it holds ``seq``."""
        if len(self.sizes) <= seq:
            grown = np.full(max(seq + 1, 2 * len(self.sizes)), -1, dtype=np.int32)
            grown[: len(self.sizes)] = self.sizes
            self.sizes = grown

    def forget_postings(self) -> None:
        self.postings.clear()
        self.postings_entries = 0
        self.postings_seq = -1
        self.totals = None


# WAL pages after which a commit checkpoints (SQLite's default is 1,000, 4 MB). Why more: a batch of 1,000
# memories writes about 3 MB of pages, so with the default nearly every batch's commit also checkpointed,
# writing pages into the database file and syncing it; pages that later batches change again (index and
# full-text pages) were written and synced each time. With 10,000 the checkpoint comes every ~10 batches and
# the WAL stays below ~40 MB (adding 100k memories, one interleaved pair on a loaded machine: 3,965 -> 4,489
# adds/s wall, the same CPU). Durability is unchanged: a commit is durable in the WAL either way
# (``synchronous`` decides when that is synced).
WAL_AUTOCHECKPOINT_PAGES = 10_000

# What the buffered rows of ``SQLiteTx`` are recognised by (see ``SQLiteTx.run``).
_MEMORY_ID = 0
_KEY_READS = frozenset({CURRENT_FOR_KEY, CLAIMS_AT, KEY_STATE_FACTS})
_STATE_READ = "SELECT state FROM memories WHERE id = ?"  # LedgerTx.transition (no lock suffix on SQLite)
_EVENT_INSERT_SEQ = f"INSERT INTO events (seq, {EVENT_INSERT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
_NEXT_EVENT_SEQ = (
    "SELECT max(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0), "
    "COALESCE((SELECT MAX(seq) FROM events), 0)) + 1"
)


_STATS_UPSERT = "INSERT INTO stats (memory_id, task,"


def _writes(sql: str, table: str) -> bool:
    """Whether a statement may write ``table`` (the read cache then drops what it remembers of it)."""
    return table in sql and sql.lstrip()[:6].upper() in {"INSERT", "UPDATE", "DELETE", "REPLAC"}


_SEQ_CHUNK = 500
_EXTEND_POSTINGS_ROWS = 1000  # more new memories than this since the postings were read: read them again
# Row sizes are remembered in an array indexed by seq (int32, 4 bytes a seq): past this seq (16.7M memories,
# or seqs imported that high) SQLite ranks the lexical channel itself instead.
_MAX_CACHED_SEQ = 1 << 24


@functools.cache
def _memory_insert(rows: int) -> str:
    """One INSERT of ``rows`` memories rows."""
    one = "(" + ",".join("?" * MEMORY_INSERT_WIDTH) + ")"
    return f"INSERT INTO memories ({MEMORY_INSERT_COLS}) VALUES " + ",".join([one] * rows)


def _is_locked(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


class SQLiteTx(LedgerTx):
    """The SQLite dialect of ``LedgerTx``: embeddings as float32 blobs, a row cache for the hot path, and new
    memories and their events buffered to be inserted several rows per statement.

    Why the buffer: the full-text index is kept by a trigger on memories (migration 5), and once memories_fts
    has been written in a transaction, FTS5 writes its pending entries out as a new index segment at every
    later statement savepoint, which every insert into memories or events opens. Inserted one statement per
    row, each memory cost a segment of its own (a third of add's CPU at 10k memories); inserted as one
    statement of many rows, the trigger's entries of the whole statement become one segment.

    The buffer is invisible: ``run`` inserts it before any statement that could see a buffered row (any
    statement naming memories, a memory_id or events, except three whose arguments show they cannot: a read
    of one key's memories for a key no buffered memory has, and ``transition``'s read and update of a memory
    that is not buffered), and the store inserts it before the transaction commits. Memories keep their order
    (seq as assigned row by row) and so do events: while rows are buffered, every event is buffered too, with
    the seq AUTOINCREMENT would have given it (the transaction holds the write lock: nobody else takes one).
    """

    dialect = "sqlite"
    search_order = "rowid"

    def __init__(self, conn: sqlite3.Connection, cache: _ReadCache | None = None) -> None:
        self.c = conn
        self._cache = cache
        self._new_memories: list[tuple[Any, ...]] = []  # buffered memories rows (MEMORY_INSERT_COLS), in order
        self._new_events: list[tuple[Any, ...]] = []  # buffered events rows, each led by its seq
        self._new_times: list[times.TimeRow] = []  # buffered memory_times rows of the buffered memories
        self._new_ids: set[str] = set()
        self._new_keys: set[tuple[Any, ...]] = set()  # (scope, entity, attribute) of the buffered memories
        self._next_event_seq = 0
        self._changes_at_start = conn.total_changes  # unchanged: this transaction has written nothing
        self._cache_checked = False  # check_cache ran in this transaction (its snapshot cannot change after)
        self._max_seq: tuple[int, int] | None = None  # (total_changes when read, max seq)

    def run(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        if self.key_view is not None:
            self.note_write(sql, (args,))
        # "memor": memories, memories_fts, and the memory_id of events, stats and credits (foreign keys)
        if self._new_memories and ("memor" in sql or "events" in sql) and self._may_see_buffered(sql, args):
            self.insert_buffered()
        if self._cache is not None:
            if _writes(sql, "stats"):
                self._cache.forget_stats()  # a stats write of unknown rows (none in this library's own writers)
            if _writes(sql, "attributes"):
                self._cache.attributes.clear()
        return self.c.execute(sql, args)

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self.key_view is not None:
            self.note_write(sql, rows)
        if self._new_memories and ("memor" in sql or "events" in sql):
            self.insert_buffered()
        if self._cache is not None and _writes(sql, "attributes"):
            self._cache.attributes.clear()
        if self._cache is not None and _writes(sql, "stats"):
            if sql.startswith(_STATS_UPSERT):  # rows lead with (memory_id, task): drop exactly those memories
                for row in rows:
                    self._cache.forget_stats_of(row[0])  # the upsert changes a row or creates one
            else:
                self._cache.forget_stats()
        self.c.executemany(sql, rows)

    def _may_see_buffered(self, sql: str, args: Sequence[Any]) -> bool:
        """False only for statements known not to read or change a buffered row, by their arguments."""
        if sql in _KEY_READS:
            return (args[0], args[1], args[2]) in self._new_keys
        if sql == _STATE_READ or ROW_UPDATE_BY_ID.fullmatch(sql):  # LedgerTx.transition's read and update
            return args[-1] in self._new_ids
        return True

    def insert_memory_row(self, row: tuple[Any, ...]) -> None:
        if self.key_view is not None:
            self.note_write(MEMORY_INSERT, (row,))  # buffered, not run: the key's rows change all the same
        self._new_memories.append(row)
        self._new_ids.add(row[_MEMORY_ID])
        self._new_keys.add(memory_row_key(row))

    def insert_time_rows(self, rows: Sequence[times.TimeRow]) -> None:
        if not self._new_memories:
            super().insert_time_rows(rows)
        else:  # after their memories, in insert_buffered
            self._new_times += rows

    def insert_event_row(self, row: tuple[Any, ...]) -> int:
        if not self._new_memories:
            return super().insert_event_row(row)
        if not self._new_events:
            self._next_event_seq = int(self.c.execute(_NEXT_EVENT_SEQ).fetchone()[0])
        seq = self._next_event_seq
        self._next_event_seq += 1
        self._new_events.append((seq, *row))
        return seq

    def insert_buffered(self) -> None:
        """Insert the buffered rows: the memories (their events and times reference them) in as few statements
        as the host-parameter limit allows, then the events and the times."""
        rows, events, time_rows = self._new_memories, self._new_events, self._new_times
        if not rows:
            return
        self._new_memories, self._new_events, self._new_ids, self._new_keys = [], [], set(), set()
        self._new_times = []
        step = max(1, min(500, self.c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // MEMORY_INSERT_WIDTH))
        for start in range(0, len(rows), step):
            chunk = rows[start : start + step]
            self.c.execute(_memory_insert(len(chunk)), [v for r in chunk for v in r])
        if events:
            self.c.executemany(_EVENT_INSERT_SEQ, events)
        if time_rows:
            self.c.executemany(times.TIMES_INSERT, time_rows)

    def lexical_candidates(self, *args: Any, **kwargs: Any) -> list[tuple[str, float]]:
        """As ``LedgerTx.lexical_candidates``, with this transaction's buffered memories indexed first."""
        self.insert_buffered()
        return super().lexical_candidates(*args, **kwargs)

    def dump_vector(self, vec: NDArray[np.float32]) -> bytes:
        return np.ascontiguousarray(vec, dtype=np.float32).tobytes()

    def load_vector(self, value: Any) -> NDArray[np.float32]:
        return np.frombuffer(value, dtype=np.float32)

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.run_many(sql, rows)

    def embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32]]:
        """As ``LedgerTx``, but an embedding of another width is a typed error naming the memory."""
        try:
            return super().embeddings_after(seq, dim)
        except ValueError as exc:
            bad = [
                str(mid)
                for mid, n in self.c.execute(
                    "SELECT id, length(embedding) FROM memories WHERE seq > ? AND length(embedding) != ? LIMIT 5",
                    (seq, 4 * dim),
                )
            ]
            raise LedgerCorruptError(
                f"ledger embeddings of memories {bad} do not have the store's {dim} floats ({exc}); "
                "`remem verify STORE` lists every damaged row",
                "restore the store folder from a backup",
            ) from exc

    def _lexical_query(
        self, terms: list[str], *, df: list[int], scopes: frozenset[str] | None, current_only: bool, limit: int
    ) -> list[tuple[str, float]]:
        """FTS5 ``bm25()`` (lower is better, so negated), best first, ties by seq (``df`` is unused: FTS5
        and store/bm25.py count their own document frequencies).

        With the read cache, the matches are scored in process from remembered postings (store/bm25.py:
        the same numbers as SQLite's ``bm25()``) and filtered on the cached rows, best first, until ``limit``
        pass: testing scope and state in SQL would join memories once per *match*, and ``bm25()`` in SQL
        reads every match's instances again on every query. SQLite ranks instead when there is no cache, or
        when this transaction has written (FTS5 keeps uncommitted index changes and totals in memory, where
        postings read through ``fts5vocab`` do not see them).
        """
        cache = self._cache
        if cache is not None and self.c.total_changes == self._changes_at_start and self.max_seq() < _MAX_CACHED_SEQ:
            tokens = [lexical.word_token(t) for t in terms]
            return self._lexical_in_process(cache, tokens, scopes, current_only, limit)
        where, args = self.lexical_filters(scopes, current_only)
        cond = "".join(f" AND {w}" for w in where)
        # CROSS JOIN keeps the full-text match the outer loop: the planner must not walk a large scope's rows
        # and probe the index once per row.
        rows = self.c.execute(
            "SELECT m.id, bm25(memories_fts) AS score FROM memories_fts CROSS JOIN memories m "
            f"ON m.seq = memories_fts.rowid WHERE memories_fts MATCH ?{cond} ORDER BY score, m.seq LIMIT ?",
            (lexical.fts5_match(terms), *args, limit),
        )
        return [(str(mid), -float(score)) for mid, score in rows]

    def _lexical_in_process(
        self,
        cache: _ReadCache,
        tokens: list[str],
        scopes: frozenset[str] | None,
        current_only: bool,
        limit: int,
    ) -> list[tuple[str, float]]:
        """``_lexical_query`` from postings: every match scored, then the best filtered in growing windows."""
        self.check_cache(cache)
        seq = self.max_seq()
        if seq != cache.postings_seq:  # new memories may hold any of the tokens
            grown = seq - cache.postings_seq
            if cache.postings and cache.postings_seq >= 0 and 0 < grown <= _EXTEND_POSTINGS_ROWS:
                self._extend_postings(cache, cache.postings_seq)
            else:
                cache.forget_postings()
            cache.postings_seq = seq
            cache.totals = None
        phrases = [self._postings(cache, t) for t in tokens]
        docs = bm25.union(phrases)
        if len(docs) == 0:
            return []
        n_rows, n_tokens = self._totals(cache)
        scores = bm25.scores(phrases, rows=n_rows, tokens=n_tokens, sizes=self._sizes(cache, docs), docs=docs)
        # bm25 ascending (best first), then seq: SQLite's ORDER BY. Only the first window is ordered at first
        # (filters rarely leave it short of ``limit``); the rest when a window reaches past it.
        start, window = 0, 2 * limit
        order = bm25.best_first(scores, window)
        ranked_docs, ranked_scores = docs[order].tolist(), scores[order].tolist()
        out: list[tuple[str, float]] = []
        while start < len(docs):
            if start + window > len(ranked_docs) and len(ranked_docs) < len(docs):
                order = bm25.best_first(scores, len(docs))
                ranked_docs, ranked_scores = docs[order].tolist(), scores[order].tolist()
            seqs = ranked_docs[start : start + window]
            for m, score in zip(self._rows_of_seqs(cache, seqs), ranked_scores[start : start + window], strict=True):
                if m is None or (scopes is not None and m.scope not in scopes):
                    continue
                if current_only and m.state in LEXICAL_RETIRED:
                    continue
                out.append((m.id, -score))
                if len(out) == limit:
                    return out
            start += window
            window *= 4
        return out

    def _extend_postings(self, cache: _ReadCache, after: int) -> None:
        """Add the memories this connection inserted since seq ``after`` to the remembered postings (an agent
        that stores a turn between two searches must not lose every posting to it).

        Only this connection's inserts get here: another connection's drop the whole cache first
        (``check_cache``). Each new text is tokenized by the index's own tokenizer (``lexical.TOKENIZER``), so
        its tokens and its row size are the ones FTS5 stored; new seqs are higher than every remembered row,
        so appending keeps each posting in row order."""
        new = self.c.execute("SELECT seq, text FROM memories WHERE seq > ? ORDER BY seq", (after,)).fetchall()
        grown: dict[str, tuple[list[int], list[float]]] = {}
        cache.hold_sizes_to(int(new[-1][0]) if new else 0)
        for seq, text in new:
            tokens = lexical.text_tokens(str(text))
            cache.sizes[int(seq)] = len(tokens)
            for token, freq in collections.Counter(tokens).items():
                if token in cache.postings:
                    rows, freqs = grown.setdefault(token, ([], []))
                    rows.append(int(seq))
                    freqs.append(float(freq))
        for token, (rows, freqs) in grown.items():
            old = cache.postings[token]
            cache.postings[token] = bm25.Postings(
                rows=np.concatenate([old.rows, np.array(rows, dtype=np.int64)]),
                freq=np.concatenate([old.freq, np.array(freqs, dtype=np.float64)]),
            )
            cache.postings_entries += len(rows)

    def _postings(self, cache: _ReadCache, token: str) -> bm25.Postings:
        """A token's rows and frequencies, through ``fts5vocab`` over the index (remembered)."""
        known = cache.postings.get(token)
        if known is not None:
            return known
        self.c.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.remem_postings USING fts5vocab(main, memories_fts, instance)"
        )
        found = self.c.execute(
            "SELECT doc, count(*) FROM temp.remem_postings WHERE term = ? GROUP BY doc ORDER BY doc", (token,)
        ).fetchall()
        posting = bm25.Postings(
            rows=np.array([d for d, _ in found], dtype=np.int64),
            freq=np.array([f for _, f in found], dtype=np.float64),
        )
        if cache.postings_entries + len(found) > cache.max_postings:
            cache.postings.clear()
            cache.postings_entries = 0
        cache.postings[token] = posting
        cache.postings_entries += len(found)
        return posting

    def _totals(self, cache: _ReadCache) -> tuple[int, int]:
        """The index's rows and tokens: FTS5's totals record (``%_data`` block 1), what ``bm25()`` reads."""
        if cache.totals is None:
            row = self.c.execute("SELECT block FROM memories_fts_data WHERE id = 1").fetchone()
            values = bm25.varints(bytes(row[0])) if row is not None else []
            cache.totals = (values[0], values[1]) if len(values) >= 2 and values[0] > 0 else (1, 0)
        return cache.totals

    def _sizes(self, cache: _ReadCache, docs: NDArray[np.int64]) -> NDArray[np.float64]:
        """Token counts of ``docs`` (the index's ``%_docsize`` rows), remembered by seq."""
        cache.hold_sizes_to(int(docs[-1]))
        sizes = cache.sizes[docs]
        missing = docs[sizes < 0].tolist()
        for start in range(0, len(missing), _SEQ_CHUNK):
            chunk = missing[start : start + _SEQ_CHUNK]
            marks = ",".join("?" * len(chunk))
            for seq, blob in self.c.execute(f"SELECT id, sz FROM memories_fts_docsize WHERE id IN ({marks})", chunk):
                cache.sizes[int(seq)] = bm25.varints(bytes(blob))[0]
        if missing:
            sizes = cache.sizes[docs]
        return sizes.astype(np.float64)

    def _rows_of_seqs(self, cache: _ReadCache, seqs: list[int]) -> list[Memory | None]:
        """The memory row of each of ``seqs`` (the full-text rowids), None for a seq no memory has.

        Ids by seq are remembered beside the rows by id: a seq names one memory forever (rows are never
        deleted; a rolled-back insert's seq, which could be given again, clears the cache with the rollback).
        Usually every row is known: one pass of lookups. Otherwise the rows of the seqs lacking either are
        read by seq in one statement: a seq the lexical channel has not seen is nearly always a row the cache
        lacks too (over 600 new queries at 10k memories, every one), and reading its id and then its row by
        id took two. What is read is remembered as ``memories`` and the ids were, with the same bounds."""
        self.check_cache(cache)
        ids, rows = cache.ids_by_seq, cache.rows
        try:
            return [rows[ids[s]] for s in seqs]
        except KeyError:
            pass
        missing = [s for s in seqs if s not in ids or ids[s] not in rows]
        found: dict[int, Memory] = {}
        for start in range(0, len(missing), _SEQ_CHUNK):
            chunk = missing[start : start + _SEQ_CHUNK]
            marks = ",".join("?" * len(chunk))
            for r in self.c.execute(f"SELECT {MEM_COLS}, seq FROM memories WHERE seq IN ({marks})", chunk):
                found[int(r[-1])] = row_to_memory(r)
        out: list[Memory | None] = []
        for s in seqs:
            m = found.get(s)
            if m is None and s in ids:
                m = rows.get(ids[s])
            out.append(m)
        cache.remember_rows(found.values())
        ids.update((s, m.id) for s, m in found.items())
        if len(ids) > cache.max_rows:
            cache.ids_by_seq = {s: ids[s] for s in seqs if s in ids}
        return out

    def _lexical_counts(self, terms: list[str], cap: int) -> list[int]:
        """One capped count per word: FTS5 stops reading a posting list after ``cap`` rows (cheap; the
        expensive part of a query is scoring the matches). Counts known to be current come from
        ``_ReadCache`` (two thirds of the words of the benchmark's queries recur)."""
        q = "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? LIMIT ?)"
        known = self._cache
        if known is None:
            return [int(self.c.execute(q, (lexical.fts5_match([t]), cap)).fetchone()[0]) for t in terms]
        self.check_cache(known)
        seq = self.max_seq()
        if seq != known.counts_seq:  # this connection added memories: only counts at their cap still hold
            known.counts = {key: n for key, n in known.counts.items() if n >= key[1]}
            known.counts_seq = seq
        out: list[int] = []
        for t in terms:
            n = known.counts.get((t, cap))
            if n is None:
                n = int(self.c.execute(q, (lexical.fts5_match([t]), cap)).fetchone()[0])
                if len(known.counts) >= known.max_counts:
                    known.counts.clear()
                known.counts[(t, cap)] = n
            out.append(n)
        return out

    def lexical_index_problems(self) -> list[str]:
        """The FTS5 index holds every memory once, no other row, and exactly the tokens of its current text.

        Read-only: FTS5's own ``integrity-check`` is an INSERT (it would take the write lock), so the
        index is compared instead with a fresh one built in the connection's TEMP schema from
        ``memories.text`` with the same tokenizer, term by term and position by position (fts5vocab).
        """
        self.insert_buffered()
        c = self.c
        if c.execute("SELECT 1 FROM sqlite_master WHERE name = 'memories_fts'").fetchone() is None:
            return ["the full-text index memories_fts is missing: lexical search cannot run"]
        problems: list[str] = []
        missing = c.execute(
            "SELECT id FROM memories WHERE seq NOT IN (SELECT id FROM memories_fts_docsize) ORDER BY seq"
        ).fetchall()
        problems += [f"{mid}: memory is not in the full-text index" for (mid,) in missing]
        extra = c.execute(
            "SELECT id FROM memories_fts_docsize WHERE id NOT IN (SELECT seq FROM memories) ORDER BY id"
        ).fetchall()
        problems += [f"full-text index entry {seq} belongs to no memory" for (seq,) in extra]
        for name in ("remem_fts_have", "remem_fts_want", "remem_fts_expected"):  # left by an interrupted check
            c.execute(f"DROP TABLE IF EXISTS temp.{name}")
        c.execute(
            f"CREATE VIRTUAL TABLE temp.remem_fts_expected USING fts5(text, tokenize = '{lexical.SQLITE_TOKENIZE}')"
        )
        try:
            c.execute("INSERT INTO temp.remem_fts_expected (rowid, text) SELECT seq, text FROM main.memories")
            c.execute("CREATE VIRTUAL TABLE temp.remem_fts_have USING fts5vocab(main, memories_fts, instance)")
            c.execute("CREATE VIRTUAL TABLE temp.remem_fts_want USING fts5vocab(temp, remem_fts_expected, instance)")
            differ = c.execute(
                "SELECT doc FROM (SELECT term, doc, offset FROM temp.remem_fts_have EXCEPT "
                "SELECT term, doc, offset FROM temp.remem_fts_want) UNION "
                "SELECT doc FROM (SELECT term, doc, offset FROM temp.remem_fts_want EXCEPT "
                "SELECT term, doc, offset FROM temp.remem_fts_have)"
            ).fetchall()
        finally:
            for name in ("remem_fts_have", "remem_fts_want", "remem_fts_expected"):
                c.execute(f"DROP TABLE IF EXISTS temp.{name}")
        ids = dict(c.execute("SELECT seq, id FROM memories").fetchall()) if differ else {}
        for (seq,) in sorted(differ):
            if seq in ids:
                problems.append(f"{ids[seq]}: its full-text index entry does not match its current text")
        return problems

    def memories_version(self) -> tuple[int, int]:
        """(highest event seq, highest memory seq): unchanged means no memories row changed. Every insert
        and every update of a memories row (``transition``) appends an event in the same transaction,
        events are never deleted (triggers) and AUTOINCREMENT never reuses a seq; the memory seq is there
        for rows that arrive with their own history (an import)."""
        r = self.run("SELECT (SELECT COALESCE(MAX(seq), 0) FROM events), (SELECT COALESCE(MAX(seq), 0) FROM memories)")
        row = r.fetchone()
        return int(row[0]), int(row[1])

    def check_cache(self, cache: _ReadCache) -> None:
        """Drop ``cache`` if another connection changed a memories row since it was last checked (see
        ``_ReadCache``); read before the rows it guards, so they are at least as new as its stamp.

        Once per transaction: ``PRAGMA data_version`` opens the transaction's snapshot when it is its first
        statement and changes only when a new snapshot sees another connection's commit, so after the first
        check nothing another connection commits is visible until the transaction ends (this connection's
        own writes keep the cache exact through ``forget_row`` and the rollback)."""
        if self._cache_checked:
            return
        self._cache_checked = True
        dv = self.c.execute("PRAGMA data_version").fetchone()[0]
        if dv != cache.data_version:
            cache.forget_stats()  # another connection committed: its searches and feedback move stats
            cache.attributes.clear()  # and its adds move attribute counts
            version = self.memories_version()
            if version != cache.memories_version:
                cache.clear()
            cache.data_version, cache.memories_version = dv, version

    def max_seq(self) -> int:
        """As ``LedgerTx.max_seq``, read once until this transaction writes (the lexical channel asks twice)."""
        known = self._max_seq
        if known is not None and known[0] == self.c.total_changes and not self._new_memories:
            return known[1]
        seq = super().max_seq()
        self._max_seq = (self.c.total_changes, seq)
        return seq

    def after_import(self) -> None:
        """Imported rows arrive with their own seqs and history: nothing remembered can be trusted."""
        if self._cache is not None:
            self._cache.clear()

    def forget_row(self, memory_id: str, *, text_changed: bool = False) -> None:
        if self._cache is not None:
            self._cache.rows.pop(memory_id, None)
            if text_changed:  # the full-text index changed without a new seq
                self._cache.forget_texts()

    def stats(self, ids: Sequence[str], tasks: Sequence[str] = (ALL_TASKS,)) -> dict[tuple[str, str], TaskStats]:
        """As ``LedgerTx.stats``, remembered in the read cache (a search reads the stats of its whole pool).

        One pass of lookups in C (``map``), one per memory; only the memories the cache lacks go through
        ``_stats_missing`` (nearly every search has a few: memories new to the cache, and the ones the previous
        search's write dropped). The answer is in ``ids`` x ``tasks`` order, as the keys were asked."""
        cache = self._cache
        if cache is None:
            return super().stats(ids, tasks)
        self.check_cache(cache)
        ids = list(ids)  # walked more than once below (a caller's one-shot iterable too, as ``LedgerTx.stats`` takes)
        tables = list(map(cache.stats.get, ids))
        missing = [mid for mid, table in zip(ids, tables, strict=True) if table is None]
        if missing:
            fetched = self._stats_missing(cache, missing)
            tables = [fetched[mid] if table is None else table for mid, table in zip(ids, tables, strict=True)]
        return {
            (mid, t): s
            for mid, table in zip(ids, tables, strict=True)
            if table
            for t in tasks
            if (s := table.get(t)) is not None
        }

    def _stats_missing(self, cache: _ReadCache, missing: list[str]) -> dict[str, dict[str, TaskStats]]:
        """The stats tables (every row of every task, by task) of the ``missing`` memories, read in one statement
        per chunk and remembered. The answer is built apart from the cache, which may be emptied to stay in its
        bound (``max_rows`` memories and rows)."""
        rows = LedgerTx.stats_all_classes(self, list(dict.fromkeys(missing)))
        held = sum(1 + len(table) for table in rows.values())
        if cache.stats_held + held > cache.max_rows:
            cache.forget_stats()
        cache.stats.update(rows)
        cache.stats_held += held
        return rows

    def attributes(self, names: Sequence[str]) -> dict[str, AttributeInfo]:
        """As ``LedgerTx.attributes``, remembered in the read cache (a search asks about its pool's keys)."""
        cache = self._cache
        if cache is None:
            return super().attributes(names)
        self.check_cache(cache)
        found = _read_through(cache.attributes, names, super().attributes, bound=cache.max_counts)
        return {n: info for n in sorted(found) if (info := found[n]) is not None}

    def memories(self, ids: Sequence[str]) -> dict[str, Memory]:
        """As ``LedgerTx.memories``, remembered in the read cache; when every row is known (the usual case
        in a search), one pass of lookups in C builds the answer."""
        cache = self._cache
        if cache is None:
            return super().memories(ids)
        self.check_cache(cache)
        rows = cache.rows
        try:
            return dict(zip(ids, map(rows.__getitem__, ids), strict=True))
        except KeyError:
            pass
        fetched = super().memories([i for i in ids if i not in rows])
        # the answer before the cache may be emptied below: a row it held must not go missing from this read
        out = {i: m for i in ids if (m := rows.get(i, fetched.get(i))) is not None}
        cache.remember_rows(fetched.values())
        return out


def _read_through(
    known: dict[K, V | None], keys: Iterable[K], fetch: Callable[[list[K]], Mapping[K, V]], *, bound: int
) -> dict[K, V | None]:
    """Each of ``keys`` (None: the ledger has no row for it), filling ``known`` with those it lacks from one
    ``fetch`` (absent ones remembered as None); ``known`` is emptied first when it would outgrow ``bound``,
    after the answer was taken from it."""
    wanted = list(dict.fromkeys(keys))
    missing = [k for k in wanted if k not in known]
    fetched = fetch(missing) if missing else {}
    out = {k: known[k] if k in known else fetched.get(k) for k in wanted}
    if missing:
        if len(known) + len(missing) > bound:
            known.clear()
        for k in missing:
            known[k] = fetched.get(k)
    return out


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
        self._read_cache = _ReadCache()
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
