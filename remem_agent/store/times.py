"""The times each memory speaks of, kept beside it: the ``memory_times`` rows (schema 11).

A memory's text is resolved against its own time by :func:`remem_agent.temporal.resolve` when it is inserted
(``LedgerTx.insert_memory``): one row per distinct range the text names, with the words that named it.
The rows are derived from two columns that never change (``original_text`` and ``valid_from``), like the
lexical index from the text, so:

- ``verify()`` resolves every memory again and reports any row that differs (:func:`problems`);
- the meta key ``time_resolver`` records which resolver version wrote them, and a store opened by a
  remem-agent with another version is re-resolved once, in one transaction (:func:`reindex`), as migration
  11's data step does for the memories stored before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from remem_agent.temporal import RESOLVER_VERSION, resolve


class LedgerTx(Protocol):
    """What this module needs of a ledger transaction (``store.sql.LedgerTx`` has it; named here, not imported,
    because that module writes the rows through this one)."""

    def run(self, sql: str, args: Sequence[Any] = ()) -> Any: ...
    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...


META_KEY = "time_resolver"
TIMES_INSERT = "INSERT INTO memory_times (memory_id, lo, hi, grain, expr) VALUES (?, ?, ?, ?, ?)"
TimeRow = tuple[str, float, float, str, str]  # memory_id, lo, hi, grain, expr


def time_rows(memory_id: str, text: str, valid_from: float) -> list[TimeRow]:
    """The rows of one memory: its text's mentions, the first of each distinct range."""
    rows: dict[tuple[float, float], TimeRow] = {}
    for m in resolve(text, valid_from):
        rows.setdefault((m.start, m.end), (memory_id, m.start, m.end, m.grain, m.expr))
    return list(rows.values())


def _all_memories(tx: LedgerTx) -> Iterable[tuple[str, str, float]]:
    cur = tx.run("SELECT id, original_text, valid_from FROM memories ORDER BY seq")
    while batch := cur.fetchmany(2000):
        yield from ((str(i), str(t), float(v)) for i, t, v in batch)


def reindex(tx: LedgerTx) -> None:
    """Resolve every memory again (inside ``tx``) and record this resolver's version."""
    tx.run("DELETE FROM memory_times")
    rows: list[TimeRow] = []
    for mid, text, valid_from in _all_memories(tx):
        rows += time_rows(mid, text, valid_from)
        if len(rows) >= 5000:
            tx.run_many(TIMES_INSERT, rows)
            rows = []
    if rows:
        tx.run_many(TIMES_INSERT, rows)
    tx.set_meta(META_KEY, str(RESOLVER_VERSION))


def is_current(tx: LedgerTx) -> bool:
    """True when this store's rows were written by this resolver version."""
    return tx.get_meta(META_KEY) == str(RESOLVER_VERSION)


def problems(tx: LedgerTx) -> list[str]:
    """Rows that differ from resolving each memory again (none when the store is consistent)."""
    stored: dict[str, set[tuple[Any, ...]]] = {}
    for mid, lo, hi, grain, expr in tx.run("SELECT memory_id, lo, hi, grain, expr FROM memory_times").fetchall():
        stored.setdefault(str(mid), set()).add((float(lo), float(hi), str(grain), str(expr)))
    if tx.get_meta(META_KEY) is None and not stored:
        return []  # written before schema 11 and not opened since: nothing to compare (the open resolves it)
    out: list[str] = []
    seen: set[str] = set()
    for mid, text, valid_from in _all_memories(tx):
        seen.add(mid)
        want = {(lo, hi, grain, expr) for _, lo, hi, grain, expr in time_rows(mid, text, valid_from)}
        have = stored.get(mid, set())
        if have != want:
            out.append(f"{mid}: its time mentions {sorted(have)} differ from its text's {sorted(want)}")
    out += [f"time mentions of {mid}, which is no memory" for mid in stored.keys() - seen]
    return out


def times_of(tx: LedgerTx, ids: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """Each id's mentioned ranges (ids without any are absent)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for start in range(0, len(ids), 500):
        chunk = list(ids[start : start + 500])
        marks = ", ".join("?" * len(chunk))
        for mid, lo, hi in tx.run(f"SELECT memory_id, lo, hi FROM memory_times WHERE memory_id IN ({marks})", chunk):
            out.setdefault(str(mid), []).append((float(lo), float(hi)))
    return out
