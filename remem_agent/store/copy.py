"""``remem migrate``: copy a store with its full history into another backend (or folder).

The copy is row for row: memories with their sequence numbers, every event, search, credit row,
statistic and learned attribute, and the meta keys (embedder, dimension, supersession mode). Nothing
is recomputed, so the target's ``verify()`` checks the same history the source recorded. The
target must be empty; the source is only read (one consistent snapshot).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.store.base import Store, is_postgres_url, open_store
from remem_agent.store.sql import TABLES

log = logging.getLogger("remem_agent.store.copy")


def copy_store(source: str | Path, target: str | Path, *, batch: int = 2000) -> dict[str, Any]:
    """Copy ``source`` into the empty store ``target``; returns row counts and the target's verify result."""
    if not is_postgres_url(source):
        source = Path(source).expanduser()
    if not is_postgres_url(target):
        target = Path(target).expanduser()
    if str(source) == str(target):
        raise UserInputError("source and target are the same store")
    src: Store = open_store(source, create=False)
    try:
        dim_text = src.get_meta("dim")
        if dim_text is None:
            raise UserInputError(f"{src.location} has no embedder dimension recorded: open it with ReMem once first")
        dim = int(dim_text)
        dst: Store = open_store(target)
        try:
            with dst.read() as tx:
                if tx.max_seq() or tx.search_counts()[0] or tx.get_meta("dim") is not None:
                    raise UserInputError(f"target {dst.location} is not empty; migrate into a new store")
            copied = _copy_rows(src, dst, batch)
            dst.bind_dimension(dim)  # after the bulk load: building the HNSW index once is faster
            problems = dst.verify(dim)
        finally:
            dst.close()
    finally:
        src.close()
    report = {
        "source": str(src.location),
        "target": str(dst.location),
        "rows": copied,
        "verify_ok": not problems,
        "problems": problems[:20],
    }
    log.info("migrated %s -> %s: %s", src.location, dst.location, copied)
    return report


def _copy_rows(src: Store, dst: Store, batch: int) -> dict[str, int]:
    copied: dict[str, int] = {}

    def load(tx: Any) -> None:
        copied.clear()  # a retried transaction starts over
        with src.read() as stx:  # one snapshot of the source for every table
            for table in TABLES:
                n = 0
                for rows in stx.export_rows(table, batch):
                    tx.import_rows(table, rows)
                    n += len(rows)
                copied[table] = n
        tx.after_import()

    dst.transact(load)
    return copied
