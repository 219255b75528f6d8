"""``remem backup STORE DEST``: an online copy of a SQLite store folder into a new store folder.

The copy uses SQLite's backup API on the store's own connection, so it is one consistent snapshot
even while other processes keep writing (WAL readers do not block writers), and it includes every
table, index and trigger. It is written to a temporary file in DEST and renamed into place, so an
interrupted backup never leaves a DEST that looks like a store; DEST is then opened as a store
(which writes its marker file) and verified, and the report lists the row counts of both sides.

Restore: DEST is a complete store folder. Point the application at it (``ReMem(DEST)``), or, to
restore into a fresh folder while keeping DEST as the backup, run ``remem backup DEST NEW_FOLDER``.
To put it back in the original place, stop every process using the store, move the damaged folder
aside and copy DEST there.

A PostgreSQL store is backed up with PostgreSQL's own tools: ``pg_dump`` (the ``remem`` schema)
and ``pg_restore``; this command refuses a ``postgresql://`` URL and says so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.store.base import is_postgres_url
from remem_agent.store.copy import TABLES
from remem_agent.store.sqlite import LEDGER_FILE, MARKER_FILE, SQLiteStore


def pg_dump_hint(where: str, schema: str = "remem") -> str:
    return (
        f"{where} is a PostgreSQL store: back it up with pg_dump, e.g. "
        f"pg_dump --schema={schema} --format=custom --file=remem.dump 'postgresql://...', and restore it into an "
        f"empty database with pg_restore --dbname='postgresql://...' remem.dump (the target needs the pgvector "
        "extension); `remem migrate URL FOLDER` also copies it into a SQLite store folder"
    )


def backup_store(source: str | Path, dest: str | Path) -> dict[str, Any]:
    """Copy the store folder ``source`` into the new folder ``dest``; returns counts and dest's verify result."""
    if is_postgres_url(source):
        from remem_agent.store.postgres import redact

        raise UserInputError(pg_dump_hint(redact(str(source))))
    if is_postgres_url(dest):
        raise UserInputError("remem backup writes a store folder; to copy into PostgreSQL use `remem migrate`")
    src_folder = Path(source).expanduser()
    dst_folder = Path(dest).expanduser()
    if not (src_folder / LEDGER_FILE).is_file():
        raise UserInputError(f"{src_folder} is not a remem store (no {LEDGER_FILE})")
    if dst_folder.exists() and (not dst_folder.is_dir() or any(dst_folder.iterdir())):
        raise UserInputError(f"backup target {dst_folder} exists and is not an empty folder; back up into a new folder")
    if dst_folder.resolve() == src_folder.resolve():
        raise UserInputError("source and backup target are the same folder")
    src = SQLiteStore(src_folder)
    try:
        dst_folder.mkdir(parents=True, exist_ok=True)
        tmp = dst_folder / f".{LEDGER_FILE}.partial"
        try:
            src.backup_to(tmp)
            os.replace(tmp, dst_folder / LEDGER_FILE)
        finally:
            tmp.unlink(missing_ok=True)
        with src.read() as tx:
            src_counts = {t: int(tx.run(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in TABLES}
    finally:
        src.close()
    dst = SQLiteStore(dst_folder)  # WAL mode, schema check, marker file
    try:
        dim = dst.get_meta("dim")
        problems = dst.verify(int(dim) if dim else None)
        with dst.read() as tx:
            dst_counts = {t: int(tx.run(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in TABLES}
    finally:
        dst.close()
    return {
        "source": str(src_folder),
        "backup": str(dst_folder),
        "rows": dst_counts,
        "source_rows_after": src_counts,
        "marker": (dst_folder / MARKER_FILE).is_file(),
        "verify_ok": not problems,
        "problems": problems[:20],
    }
