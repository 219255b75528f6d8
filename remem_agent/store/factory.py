"""``open_store``: a location picks the backend (a folder -> SQLite, a ``postgresql://`` URL -> PostgreSQL).

It lives apart from the ``Store`` protocol so that the protocol module imports no backend and the
backends import the protocol without a cycle.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.store.base import Store, is_postgres_url


def open_store(location: str | Path, *, create: bool = True, **options: Any) -> Store:
    """A folder path opens (or creates) the SQLite ledger; a ``postgresql://`` URL the PostgreSQL one.

    ``create=False`` refuses to create a new ledger (for read-only tools such as ``remem verify``).
    """
    if is_postgres_url(location):
        from remem_agent.store.postgres import PostgresStore

        pg_opts = {k: v for k, v in options.items() if k != "synchronous"}
        _check_options(PostgresStore, pg_opts)
        return PostgresStore(str(location), create=create, **pg_opts)
    from remem_agent.store.sqlite import LEDGER_FILE, SQLiteStore

    _check_options(SQLiteStore, options)
    folder = Path(location).expanduser()
    if not create and not (folder / LEDGER_FILE).is_file():
        raise UserInputError(f"{folder} is not a remem store (no {LEDGER_FILE})")
    return SQLiteStore(folder, **options)


def _check_options(cls: type, options: dict[str, Any]) -> None:
    """Unknown store options are a UserInputError naming the accepted ones, not a TypeError."""
    accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "create")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UserInputError(f"unknown options {unknown} for {cls.__name__}; accepted: {accepted[1:]}")
