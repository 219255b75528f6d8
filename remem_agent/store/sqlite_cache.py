"""What a SQLite store keeps in memory between transactions for the search hot path (``ReadCache``).

One per store object (:class:`~remem_agent.store.sqlite.SQLiteStore`), read and kept exact by its
transactions (:class:`~remem_agent.store.sqlite_tx.SQLiteTx`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import numpy as np

from remem_agent.store import fts5_bm25
from remem_agent.types import AttributeInfo, Memory, TaskStats

K = TypeVar("K")
V = TypeVar("V")


class ReadCache:
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
        # Numbers (ids, counters) are an open vocabulary: they are counted apart, in a small table emptied when
        # full, so that a stream of requests each naming its own number neither grows memory nor evicts words.
        self.number_counts: dict[tuple[str, int], int] = {}
        self.max_number_counts = 4_096
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
        # The lexical channel's postings (store/fts5_bm25.py): a token's rows and frequencies and the index's
        # totals, read at memory seq ``postings_seq`` (a new memory may hold any token: dropped when it grows);
        # the token count of each row by seq (-1: not read), which only a text update changes.
        self.postings: dict[str, fts5_bm25.Postings] = {}
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
        self.number_counts.clear()
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


def read_through(
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
