"""The SQLite dialect of the ledger's transactions (``SQLiteTx``): float32 vector blobs, buffered inserts, and
the lexical channel ranked in process from FTS5's postings.

:class:`~remem_agent.store.sqlite.SQLiteStore` opens the connection and hands each transaction to a
``SQLiteTx``; the read cache they share is :class:`~remem_agent.store.sqlite_cache.ReadCache`.
"""

from __future__ import annotations

import collections
import functools
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import (
    LedgerCorruptError,
)
from remem_agent.store import fts5_bm25, lexical, times
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import (
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
    memory_row_key,
    row_to_memory,
)
from remem_agent.store.sqlite_cache import ReadCache, read_through
from remem_agent.types import ALL_TASKS, AttributeInfo, Memory, TaskStats

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

    def __init__(self, conn: sqlite3.Connection, cache: ReadCache | None = None) -> None:
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
        and store/fts5_bm25.py count their own document frequencies).

        With the read cache, the matches are scored in process from remembered postings (store/fts5_bm25.py:
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
        cache: ReadCache,
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
        docs = fts5_bm25.union(phrases)
        if len(docs) == 0:
            return []
        n_rows, n_tokens = self._totals(cache)
        scores = fts5_bm25.scores(phrases, rows=n_rows, tokens=n_tokens, sizes=self._sizes(cache, docs), docs=docs)
        # bm25 ascending (best first), then seq: SQLite's ORDER BY. Only the first window is ordered at first
        # (filters rarely leave it short of ``limit``); the rest when a window reaches past it.
        start, window = 0, 2 * limit
        order = fts5_bm25.best_first(scores, window)
        ranked_docs, ranked_scores = docs[order].tolist(), scores[order].tolist()
        out: list[tuple[str, float]] = []
        while start < len(docs):
            if start + window > len(ranked_docs) and len(ranked_docs) < len(docs):
                order = fts5_bm25.best_first(scores, len(docs))
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

    def _extend_postings(self, cache: ReadCache, after: int) -> None:
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
            cache.postings[token] = fts5_bm25.Postings(
                rows=np.concatenate([old.rows, np.array(rows, dtype=np.int64)]),
                freq=np.concatenate([old.freq, np.array(freqs, dtype=np.float64)]),
            )
            cache.postings_entries += len(rows)

    def _postings(self, cache: ReadCache, token: str) -> fts5_bm25.Postings:
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
        posting = fts5_bm25.Postings(
            rows=np.array([d for d, _ in found], dtype=np.int64),
            freq=np.array([f for _, f in found], dtype=np.float64),
        )
        if cache.postings_entries + len(found) > cache.max_postings:
            cache.postings.clear()
            cache.postings_entries = 0
        cache.postings[token] = posting
        cache.postings_entries += len(found)
        return posting

    def _totals(self, cache: ReadCache) -> tuple[int, int]:
        """The index's rows and tokens: FTS5's totals record (``%_data`` block 1), what ``bm25()`` reads."""
        if cache.totals is None:
            row = self.c.execute("SELECT block FROM memories_fts_data WHERE id = 1").fetchone()
            values = fts5_bm25.varints(bytes(row[0])) if row is not None else []
            cache.totals = (values[0], values[1]) if len(values) >= 2 and values[0] > 0 else (1, 0)
        return cache.totals

    def _sizes(self, cache: ReadCache, docs: NDArray[np.int64]) -> NDArray[np.float64]:
        """Token counts of ``docs`` (the index's ``%_docsize`` rows), remembered by seq."""
        cache.hold_sizes_to(int(docs[-1]))
        sizes = cache.sizes[docs]
        missing = docs[sizes < 0].tolist()
        for start in range(0, len(missing), _SEQ_CHUNK):
            chunk = missing[start : start + _SEQ_CHUNK]
            marks = ",".join("?" * len(chunk))
            for seq, blob in self.c.execute(f"SELECT id, sz FROM memories_fts_docsize WHERE id IN ({marks})", chunk):
                cache.sizes[int(seq)] = fts5_bm25.varints(bytes(blob))[0]
        if missing:
            sizes = cache.sizes[docs]
        return sizes.astype(np.float64)

    def _rows_of_seqs(self, cache: ReadCache, seqs: list[int]) -> list[Memory | None]:
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
        ``ReadCache`` (two thirds of the words of the benchmark's queries recur)."""
        q = "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? LIMIT ?)"
        known = self._cache
        if known is None:
            return [int(self.c.execute(q, (lexical.fts5_match([t]), cap)).fetchone()[0]) for t in terms]
        self.check_cache(known)
        seq = self.max_seq()
        if seq != known.counts_seq:  # this connection added memories: only counts at their cap still hold
            known.counts = {key: n for key, n in known.counts.items() if n >= key[1]}
            known.number_counts = {key: n for key, n in known.number_counts.items() if n >= key[1]}
            known.counts_seq = seq
        out: list[int] = []
        for t in terms:
            # numbers (ids, counters) in their own small table: an open vocabulary must not evict the words
            table, bound = (
                (known.number_counts, known.max_number_counts) if t.isdigit() else (known.counts, known.max_counts)
            )
            n = table.get((t, cap))
            if n is None:
                n = int(self.c.execute(q, (lexical.fts5_match([t]), cap)).fetchone()[0])
                if len(table) >= bound:
                    table.clear()
                table[(t, cap)] = n
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

    def check_cache(self, cache: ReadCache) -> None:
        """Drop ``cache`` if another connection changed a memories row since it was last checked (see
        ``ReadCache``); read before the rows it guards, so they are at least as new as its stamp.

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

    def _stats_missing(self, cache: ReadCache, missing: list[str]) -> dict[str, dict[str, TaskStats]]:
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
        found = read_through(cache.attributes, names, super().attributes, bound=cache.max_counts)
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
