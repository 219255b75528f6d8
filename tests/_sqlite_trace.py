"""The SQL statements a SQLite store transaction runs, for tests that check what a cache saved."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from remem_agent.store.sqlite_tx import SQLiteTx


@contextmanager
def traced(tx: object) -> Iterator[list[str]]:
    """Collect the statements ``tx`` (a ``SQLiteTx``) runs inside the block (FTS5's own inner statements too,
    as ``-- ...`` lines)."""
    assert isinstance(tx, SQLiteTx)
    statements: list[str] = []
    tx.c.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        tx.c.set_trace_callback(None)
