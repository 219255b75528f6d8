"""The ledger: durable memories, append-only events, searches, credits and statistics."""

from remem_agent.store.sqlite import SQLiteStore

__all__ = ["SQLiteStore"]
