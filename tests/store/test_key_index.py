"""The key index of schema 7, ``memories_scope_key_valid_from ON memories (scope, entity, attribute, valid_from)``.

Re-add detection (``sql.CLAIMS_AT``: one key, role and ``valid_from``) seeks to the claims stated at that time
instead of reading every row of the key (measured on batched adds at 100k memories), and the reads of a whole key
(``CURRENT_FOR_KEY``, ``KEY_STATE_FACTS``, ``prefetch_keys``) use its first three columns. These tests pin down,
on both backends, that

* those reads are planned on that index, ``CLAIMS_AT`` with ``valid_from`` in the seek, and SQLite's whole-key
  reads need no sort (SQLite's ``EXPLAIN QUERY PLAN``; PostgreSQL's ``EXPLAIN`` after ``ANALYZE`` and with
  sequential scans disabled, since a test store is too small for the planner to prefer any index);
* a store of schema 6 opens, is migrated (the index of schema 4 and schema 1's ``memories_key`` replaced by the
  new one), and keeps every row, its statistics and a passing ``verify()``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _pg_downgrades
import _sqlite_downgrades
import pytest
from _pg_downgrades import DOWNGRADE_7_TO_6
from _sqlite_downgrades import SQLITE_7_TO_6

from remem_agent import ReMem
from remem_agent.store import migrations, pg_migrations
from remem_agent.store.copy import TABLES, export_rows
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import CLAIMS_AT, CURRENT_FOR_KEY, KEY_STATE_FACTS

StoreLocation = Callable[[str], "str | Path"]
INDEX = "memories_scope_key_valid_from"
OLD_INDEX = "memories_scope_key"  # schema 4-6: (scope, entity, attribute)
OLDEST_INDEX = "memories_key"  # schema 1-6: (entity, attribute); no read used it once every key read had a scope
KEY = ("default", "billing service", "region")


def _store(mem: ReMem) -> dict[str, str]:
    """A store with history on its keys: supersession, a restatement, timed preferences, a note, feedback."""
    ids = {
        "old": mem.add("The billing service runs in us-east-1.", entity=KEY[1], attribute=KEY[2], timestamp=1),
        "new": mem.add("The billing service moved to eu-west-1.", entity=KEY[1], attribute=KEY[2], timestamp=2),
        "tea": mem.add("Alice prefers tea.", entity="alice", attribute="drink", role="preference", timestamp=3),
        "note": mem.add("Deploys happen on Tuesdays.", role="note", timestamp=4),
    }
    mem.add("The billing service moved to eu-west-1.", entity=KEY[1], attribute=KEY[2], timestamp=5)  # restated
    mem.add_many(["Alice prefers coffee in the morning.", "Bob prefers water."])
    res = mem.search("Where does billing run?", now=6)
    mem.feedback(res.search_id, success=True, used_ids=[ids["new"]])
    return ids


# What migration 10 added (each judged exposure's expected uses) and what it changes in a credit row's hash: a
# store undone to schema 6 has neither, so the rows are compared without them (verify() checks the hashes), and
# without the tables summed from them (the prior's calibration, and each kind's contribution of migration 16).
_LATER = {"credits": ("prior", "expected", "hash"), "stats": ("expected_sum", "expected_n")}
_LATER_TABLES = {"prior_calibration", "group_contribution"}


def _dump(mem: ReMem) -> dict[str, list[str]]:
    out = {}
    with mem.store.read() as tx:
        for t in TABLES:
            if t in _LATER_TABLES:
                continue
            keep = [i for i, c in enumerate(TABLES[t]) if c not in _LATER.get(t, ())]
            out[t] = [repr(tuple(r[i] for i in keep)) for rows in export_rows(tx, t) for r in rows]
    return out


def _indexes(mem: ReMem, backend: str) -> dict[str, list[str]]:
    """The memories table's indexes (those of the migrations, not a primary key's or a UNIQUE column's), each
    with its columns in order."""
    with mem.store.read() as tx:
        if backend == "sqlite":
            listed = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'memories' AND sql IS NOT NULL"
            names = [r[0] for r in tx.run(listed)]
            return {n: [str(r[2]) for r in tx.run(f"PRAGMA index_info({n})")] for n in names}
        out: dict[str, list[str]] = {}
        for name, definition in tx.run(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'memories'"
        ):
            m = re.search(r"USING \w+ \(([^)]*)\)", definition)
            assert m is not None, definition
            out[name] = [c.strip() for c in m.group(1).split(",")]
        return out


def _plan(tx: LedgerTx, backend: str, sql: str, args: Any) -> str:
    """The plan of one statement, one line per plan row."""
    if backend == "sqlite":
        return "\n".join(str(r[-1]) for r in tx.run("EXPLAIN QUERY PLAN " + sql, args))
    tx.run("SET LOCAL enable_seqscan = off")  # a few rows: without this, every plan is a sequential scan
    return "\n".join(str(r[0]) for r in tx.run("EXPLAIN " + sql, args))


def _analyze(location: str | Path) -> None:
    """Give PostgreSQL's planner the table's statistics (without them it guesses that ``scope = ?`` alone is
    selective, and plans a key read on ``memories_scope``)."""
    import psycopg

    with psycopg.connect(str(location), autocommit=True) as pg:
        pg.execute("ANALYZE remem.memories")


def _prefetch_statement(tx: LedgerTx, monkeypatch: pytest.MonkeyPatch, keys: list[tuple[str, str, str]]) -> Any:
    """The statement (and its arguments) that ``prefetch_keys`` runs for ``keys``."""
    seen: list[tuple[str, Any]] = []
    run = tx.run

    def spy(sql: str, args: Any = ()) -> Any:
        seen.append((sql, args))
        return run(sql, args)

    monkeypatch.setattr(tx, "run", spy)
    tx.prefetch_keys(keys)
    monkeypatch.undo()
    tx.drop_key_view()
    assert len(seen) == 1, seen
    return seen[0]


def test_the_key_reads_are_planned_on_the_key_index(
    store_location: StoreLocation, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc = store_location("s")
    with ReMem(loc) as mem:
        _store(mem)
        if backend == "postgres":
            # Many other keys in the same scope: in a table of a few rows every plan costs the same (one page),
            # and the planner's choice between them says nothing about how a key is read at scale.
            mem.add_many(
                [
                    {"text": f"Service {i} runs in region {i % 7}.", "entity": f"service {i}", "attribute": "region"}
                    for i in range(2000)
                ]
            )
            _analyze(loc)
        assert INDEX in _indexes(mem, backend) and not {OLD_INDEX, OLDEST_INDEX} & set(_indexes(mem, backend))
        with mem.store.read() as tx:
            claims = _plan(tx, backend, CLAIMS_AT, (*KEY, "preference", 3.0))
            whole_key = [
                _plan(tx, backend, CURRENT_FOR_KEY, KEY),
                _plan(tx, backend, KEY_STATE_FACTS, (*KEY, 2.0)),
                _plan(tx, backend, *_prefetch_statement(tx, monkeypatch, [KEY, ("default", "alice", "drink")])),
            ]
    if backend == "sqlite":
        # valid_from is part of the seek (not a filter over every row of the key), and no sort follows
        assert f"USING INDEX {INDEX} (scope=? AND entity=? AND attribute=? AND valid_from=?)" in claims, claims
        assert "TEMP B-TREE" not in claims, claims
        for plan in whole_key:
            assert f"USING INDEX {INDEX} (scope=? AND entity=? AND attribute=?)" in plan, plan
        assert all("TEMP B-TREE" not in plan for plan in whole_key[:2])  # already in (valid_from, seq) order
    else:
        seek = re.search(rf"Index Scan on {INDEX}.*\n\s+Index Cond: (.*)", claims) or re.search(
            rf"Index Scan using {INDEX} on memories.*\n\s+Index Cond: (.*)", claims
        )
        assert seek is not None and "valid_from = " in seek.group(1), claims
        for plan in whole_key[:2]:
            assert INDEX in plan and "Seq Scan" not in plan, plan
        # The prefetch's OR of keys: one index scan per key (a BitmapOr), never the table.
        assert re.search(rf"Index Scan on {INDEX}\b", whole_key[2]), whole_key[2]
        assert "Seq Scan" not in whole_key[2], whole_key[2]


def _downgrade(location: str | Path, backend: str) -> tuple[int, set[str]]:
    """Turn a store of the latest schema into one of schema 6, as remem-agent wrote it before migration 7, and
    return its schema version and the names of its memories indexes, read on the same raw connection."""
    if backend == "sqlite":
        conn = sqlite3.connect(Path(location) / "ledger.db")
        _sqlite_downgrades.downgrade(conn, SQLITE_7_TO_6)
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        conn.close()
        return version, names
    import psycopg

    with psycopg.connect(str(location), autocommit=True) as pg:
        _pg_downgrades.downgrade(pg, DOWNGRADE_7_TO_6)
        row = pg.execute("SELECT MAX(version) FROM remem.schema_migrations").fetchone()
        found = pg.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'remem'").fetchall()
        return int(row[0]) if row else 0, {r[0] for r in found}


def test_a_version_6_store_opens_with_the_new_key_index_and_unchanged_rows(
    store_location: StoreLocation, backend: str
) -> None:
    assert migrations.LATEST == pg_migrations.LATEST == 16  # a migration 16 must be undone first in _downgrade
    loc = store_location("s")
    with ReMem(loc) as mem:
        ids = _store(mem)
        rows, stats = _dump(mem), mem.stats()
        assert mem.verify().ok
    version, names = _downgrade(loc, backend)
    assert version == 6 and {OLD_INDEX, OLDEST_INDEX} <= names and INDEX not in names  # as version 6 left it
    with ReMem(loc) as mem:
        assert mem.stats() == stats and mem.stats().schema_version == migrations.LATEST
        indexes = _indexes(mem, backend)
        assert indexes[INDEX] == ["scope", "entity", "attribute", "valid_from"]
        assert not {OLD_INDEX, OLDEST_INDEX} & set(indexes)
        assert _dump(mem) == rows
        report = mem.verify()
        assert report.ok, report.problems
        # re-add detection through the new index: a stored claim added again is that memory, nothing written
        tea = mem.add("Alice prefers tea.", entity="alice", attribute="drink", role="preference", timestamp=3)
        old = mem.add("The billing service runs in us-east-1.", entity=KEY[1], attribute=KEY[2], timestamp=1)
        assert (tea, old) == (ids["tea"], ids["old"])
        assert _dump(mem) == rows
