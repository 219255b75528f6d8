"""Ledger backends behind one seam (``Store``): SQLite in a folder, PostgreSQL + pgvector by URL.

``PostgresStore`` loads lazily (extra ``postgres``), so the SQLite default needs no driver.
"""

from __future__ import annotations

from typing import Any

from remem_agent.store.base import Store
from remem_agent.store.factory import open_store
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sqlite import SQLiteStore

__all__ = ["LedgerTx", "PostgresStore", "SQLiteStore", "Store", "open_store"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from remem_agent.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(name)
