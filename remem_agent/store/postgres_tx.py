"""The PostgreSQL dialect of the ledger's transactions (``PostgresTx``) and the lexical index's totals.

:class:`~remem_agent.store.postgres.PostgresStore` opens the connections (pool, isolation, retries) and hands
each transaction to a ``PostgresTx``: the ledger's queries of :class:`~remem_agent.store.sql.LedgerTx` in
PostgreSQL's placeholders, multi-row inserts, and the lexical channel over ``memory_terms`` (schema 9).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent._extras import require
from remem_agent.store import fts5_bm25, lexical
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import LEXICAL_RETIRED, MEMORY_INSERT, MEMORY_INSERT_COLS, MEMORY_INSERT_WIDTH
from remem_agent.types import State

require("psycopg", "postgres", feature="the PostgreSQL store")
require("psycopg_pool", "postgres", feature="the PostgreSQL store")

import psycopg  # noqa: E402

log = logging.getLogger("remem_agent.store.postgres")


_MAX_PARAMS = 32_000  # below PostgreSQL's 65,535 bind parameters per statement


def lock_key(purpose: str, schema: str) -> int:
    """A stable signed 64-bit advisory-lock key for (purpose, schema)."""
    value = zlib.crc32(f"remem:{purpose}:{schema}".encode())
    return value - (1 << 31)


@functools.lru_cache(maxsize=64)
def _split_values(sql: str) -> tuple[str, str, str]:
    """``INSERT ... VALUES (a,b) ON CONFLICT ...`` -> (head incl. VALUES, "(a,b)", tail)."""
    at = sql.index("VALUES (") + len("VALUES ")
    depth = 0
    for i in range(at, len(sql)):
        depth += {"(": 1, ")": -1}.get(sql[i], 0)
        if depth == 0:
            return sql[:at], sql[at : i + 1], sql[i + 1 :]
    raise ValueError(f"unbalanced VALUES list in {sql!r}")


# The shared memory insert, with the text's token count (schema 9) and the new row's seq.
_PG_MEMORY_INSERT = (
    f"INSERT INTO memories ({MEMORY_INSERT_COLS}, n_terms) VALUES ({','.join(['%s'] * (MEMORY_INSERT_WIDTH + 1))}) "
    "RETURNING seq"
)


@functools.lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """The shared SQL's ``?`` placeholders in psycopg's ``%s`` style."""
    return sql.replace("?", "%s")


class LexicalTotals:
    """The lexical index's totals (memories, tokens: BM25's N and average length), kept between searches.

    Counted over the whole table they cost a scan (22-32 ms at 100k memories, measured with pgserver), so
    a store keeps them with the highest memory and event seq they were read at. A search first reads both
    seqs (two index lookups): unchanged, the totals hold; only new memories (no text rewritten since: no
    event with a ``text`` update), the new rows are added (an index range); otherwise, or when the last full
    count is older than ``max_age_s``, everything is counted again. A transaction that wrote memories counts
    for itself and leaves the kept totals alone (its rows may yet roll back).

    With one writer the totals are exact, so both backends give the same scores. With several, a memory
    whose transaction commits after one with a higher seq can be missing from the totals until the next
    full count (at most ``max_age_s``): BM25's N and average length are then off by a row or so.
    """

    def __init__(self, max_age_s: float = 60.0) -> None:
        self.lock = threading.Lock()
        self.max_age_s = max_age_s
        self.at: tuple[int, int] | None = None  # (highest memory seq, highest event seq) read with the totals
        self.totals = (0, 0)
        self.counted_at = 0.0


class PostgresTx(LedgerTx):
    """The PostgreSQL dialect of ``LedgerTx``."""

    dialect = "postgresql"
    # NO KEY UPDATE: a transition never changes a key column, and the weaker lock does not wait for the
    # KEY SHARE locks that inserting a stats or credits row takes on its memory (foreign-key check).
    # FOR UPDATE did, and a feedback that locked a memory to retire it while another feedback, holding
    # stats rows the first one needed, was inserting rows for that memory deadlocked (seen in CI).
    lock_suffix = " FOR NO KEY UPDATE"
    skip_locked_suffix = " FOR NO KEY UPDATE SKIP LOCKED"  # LedgerTx.transition_unless_busy
    search_order = "seq"

    def __init__(
        self, conn: psycopg.Connection[Any], schema: str = "remem", totals: LexicalTotals | None = None
    ) -> None:
        self.conn = conn
        self.schema = schema
        self.totals = totals
        self.wrote_memories = False  # an insert or text rewrite: the kept lexical totals must not see them

    def lock_attributes(self, attributes: Iterable[str]) -> None:
        """One transaction-scoped advisory lock per attribute (of this store's schema), taken in key order.

        Every writer that may supersede takes all its locks before its first memory-row lock, in one global
        order, so lock waits can no longer form a cycle through the attributes' counter rows.
        """
        for key in sorted({lock_key(f"attribute:{name}", self.schema) for name in attributes}):
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def run(self, sql: str, args: Sequence[Any] = ()) -> Any:
        if self.key_view is not None:
            self.note_write(sql, (args,))
        return self.conn.execute(_pg(sql), list(args) if args else None)

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Send an ``INSERT ... VALUES (...)`` for many rows as multi-row statements.

        Not ``executemany``: psycopg runs that in pipeline mode, which logs "error ignored
        terminating ... pipeline aborted" when the transaction loses a serialization conflict (a
        normal, retried event here); one statement per chunk also saves round trips.
        """
        if self.key_view is not None:
            self.note_write(sql, rows)
        head, values, tail = _split_values(sql)
        width = values.count("?")
        per = max(1, _MAX_PARAMS // max(width, 1))
        for start in range(0, len(rows), per):
            chunk = rows[start : start + per]
            stmt = _pg(head + ",".join([values] * len(chunk)) + tail)
            self.conn.execute(stmt, [v for row in chunk for v in row])

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self.key_view is not None:
            self.note_write(sql, rows)
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(_pg(sql), [list(r) for r in rows])

    def dump_vector(self, vec: NDArray[np.float32]) -> NDArray[np.float32]:
        return np.asarray(vec, dtype=np.float32)

    def load_vector(self, value: Any) -> NDArray[np.float32]:
        return np.asarray(value, dtype=np.float32)

    def insert_memory_row(self, row: tuple[Any, ...]) -> None:
        """The memories row with its token count, then its lexical postings (``memory_terms``)."""
        self.note_write(MEMORY_INSERT, (row,))  # reported as the shared insert: the key view keeps other keys
        self.wrote_memories = True
        tokens = lexical.text_tokens(str(row[1]))
        inserted: Any = self.conn.execute(_PG_MEMORY_INSERT, [*row, len(tokens)])
        seq = inserted.fetchone()[0]
        self._write_terms([(int(seq), tokens)])

    def text_updated(self, memory_id: str) -> None:
        """A transition rewrote the text: its postings and token count follow."""
        row = self.conn.execute("SELECT seq, text FROM memories WHERE id = %s", (memory_id,)).fetchone()
        if row is None:
            return
        seq, tokens = int(row[0]), lexical.text_tokens(str(row[1]))
        self.wrote_memories = True
        self.conn.execute("DELETE FROM memory_terms WHERE seq = %s", (seq,))
        # Directly, not through ``run``: n_terms is no key column, so the key view need not hear of it.
        self.conn.execute("UPDATE memories SET n_terms = %s WHERE seq = %s", (len(tokens), seq))
        self._write_terms([(seq, tokens)])

    def index_unindexed(self, batch: int = 2000) -> int:
        """Postings and token counts for every memory without them (migration 9's data step, and rows a
        copy inserted); returns how many were indexed."""
        done = 0
        while True:
            rows = self.conn.execute(
                "SELECT seq, text FROM memories WHERE n_terms IS NULL ORDER BY seq LIMIT %s", (batch,)
            ).fetchall()
            if not rows:
                return done
            indexed = [(int(seq), lexical.text_tokens(str(text))) for seq, text in rows]
            with self.conn.cursor() as cur:
                cur.executemany(
                    "UPDATE memories SET n_terms = %s WHERE seq = %s", [(len(t), seq) for seq, t in indexed]
                )
            self._write_terms(indexed)
            done += len(rows)

    def _write_terms(self, texts: Sequence[tuple[int, Sequence[str]]]) -> None:
        rows = [
            (term, seq, freq) for seq, tokens in texts for term, freq in sorted(collections.Counter(tokens).items())
        ]
        self.run_many("INSERT INTO memory_terms (term, seq, freq) VALUES (?, ?, ?)", rows)

    def _lexical_query(
        self, terms: list[str], *, df: list[int], scopes: frozenset[str] | None, current_only: bool, limit: int
    ) -> list[tuple[str, float]]:
        """FTS5's ``bm25()`` (negated: higher is better) of the matches, from ``memory_terms``, best first,
        ties by seq: the numbers and order SQLite gives the same ledger (``store/fts5_bm25.py``).

        The postings of the kept words are read whole (``choose_terms`` bounds them to
        ``lexical.MAX_MATCHES`` rows), every match is scored, and the best are filtered by scope and state
        in order until ``limit`` pass. ``df`` is unused: a word's postings are its document frequency.
        """
        tokens = [lexical.word_token(t) for t in terms]
        distinct = sorted(set(tokens))
        found: dict[str, tuple[list[int], list[float]]] = {t: ([], []) for t in distinct}
        for term, seq, freq in self.conn.execute(
            "SELECT term, seq, freq FROM memory_terms WHERE term = ANY(%s) ORDER BY term, seq", (distinct,)
        ):
            rows, freqs = found[str(term)]
            rows.append(int(seq))
            freqs.append(float(freq))
        postings = {
            t: fts5_bm25.Postings(rows=np.array(r, dtype=np.int64), freq=np.array(f, dtype=np.float64))
            for t, (r, f) in found.items()
        }
        phrases = [postings[t] for t in tokens]
        docs = fts5_bm25.union(phrases)
        if len(docs) == 0:
            return []
        n_rows, n_tokens = self._lexical_totals()
        info = {
            int(seq): (str(mid), str(scope), str(state), int(size or 0))
            for seq, mid, scope, state, size in self.conn.execute(
                "SELECT seq, id, scope, state, n_terms FROM memories WHERE seq = ANY(%s)", (docs.tolist(),)
            )
        }
        sizes = np.array([info[int(d)][3] for d in docs], dtype=np.float64)
        scores = fts5_bm25.scores(
            phrases, rows=int(n_rows) if n_rows else 1, tokens=int(n_tokens), sizes=sizes, docs=docs
        )
        out: list[tuple[str, float]] = []
        for at in fts5_bm25.best_first(scores, len(docs)).tolist():
            mid, scope, state, _ = info[int(docs[at])]
            if scopes is not None and scope not in scopes:
                continue
            if current_only and State(state) in LEXICAL_RETIRED:
                continue
            out.append((mid, -float(scores[at])))
            if len(out) == limit:
                break
        return out

    def _lexical_totals(self) -> tuple[int, int]:
        """The index's rows and tokens (``LexicalTotals``)."""
        count = "SELECT count(*), COALESCE(sum(n_terms), 0) FROM memories"
        kept = self.totals
        if kept is None or self.wrote_memories:
            rows, tokens = self.run(count).fetchone()
            return int(rows), int(tokens)
        mem_seq, event_seq = self.run(
            "SELECT (SELECT COALESCE(max(seq), 0) FROM memories), (SELECT COALESCE(max(seq), 0) FROM events)"
        ).fetchone()
        now = time.monotonic()
        with kept.lock:
            at, totals, counted_at = kept.at, kept.totals, kept.counted_at
        if at == (mem_seq, event_seq) and now - counted_at < kept.max_age_s:
            return totals
        if (
            at is not None
            and now - counted_at < kept.max_age_s
            and mem_seq >= at[0]
            and event_seq >= at[1]
            and self.run(
                "SELECT NOT EXISTS (SELECT 1 FROM events "
                "WHERE seq > ? AND seq <= ? AND updates ->> 'text' IS NOT NULL)",
                (at[1], event_seq),
            ).fetchone()[0]
        ):
            rows, tokens = self.run(
                "SELECT count(*), COALESCE(sum(n_terms), 0) FROM memories WHERE seq > ?", (at[0],)
            ).fetchone()
            fresh = (totals[0] + int(rows), totals[1] + int(tokens))
        else:
            rows, tokens = self.run(count).fetchone()
            fresh, counted_at = (int(rows), int(tokens)), now
        with kept.lock:
            kept.at, kept.totals, kept.counted_at = (int(mem_seq), int(event_seq)), fresh, counted_at
        return fresh

    def _lexical_counts(self, terms: list[str], cap: int) -> list[int]:
        """Capped match counts of every word in one statement (each an index scan stopped at ``cap``)."""
        rows = self.run(
            "SELECT n, (SELECT count(*) FROM (SELECT 1 FROM memory_terms WHERE term = x LIMIT ?) s) "
            "FROM unnest(?::text[]) WITH ORDINALITY AS u(x, n) ORDER BY n",
            (cap, [lexical.word_token(t) for t in terms]),
        ).fetchall()
        return [int(r[1]) for r in rows]

    def lexical_index_problems(self) -> list[str]:
        """Every memory's ``memory_terms`` rows and ``n_terms`` are exactly the tokens of its current text."""
        problems: list[str] = []
        held: dict[int, dict[str, int]] = collections.defaultdict(dict)
        for term, seq, freq in self.conn.execute("SELECT term, seq, freq FROM memory_terms ORDER BY seq, term"):
            held[int(seq)][str(term)] = int(freq)
        known: set[int] = set()
        for seq, mid, text, size in self.conn.execute("SELECT seq, id, text, n_terms FROM memories ORDER BY seq"):
            known.add(int(seq))
            tokens = lexical.text_tokens(str(text))
            if size is None:
                problems.append(f"{mid}: not in the lexical index (no token count): lexical search cannot find it")
            elif int(size) != len(tokens) or held.get(int(seq), {}) != dict(collections.Counter(tokens)):
                problems.append(f"{mid}: its lexical postings do not match its current text")
        for seq in sorted(set(held) - known):
            problems.append(f"memory_terms rows of seq {seq}, which is no memory")
        return problems

    def after_import(self) -> None:
        """Rows were copied with their sequence numbers: move the identity sequences past them, and index
        the copied texts (the source's lexical rows are not copied: they are derived)."""
        for table in ("memories", "events", "credits", "searches"):
            self.run(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'), COALESCE(MAX(seq), 1), "
                f"MAX(seq) IS NOT NULL) FROM {table}"
            )
        self.index_unindexed()
