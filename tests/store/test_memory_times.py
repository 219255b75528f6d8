"""The times each memory speaks of, kept beside it (ledger schema 11, remem_agent/store/times.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _sqlite_downgrades
import pytest
from _sqlite_downgrades import SQLITE_11_TO_10

from remem_agent import MemoryInput, ReMem
from remem_agent.store import migrations, pg_migrations, times
from remem_agent.temporal import RESOLVER_VERSION

StoreLocation = Callable[[str], "str | Path"]
SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # Monday
DAY = 86_400.0


def _turns() -> list[MemoryInput]:
    return [
        MemoryInput("Caroline: I went to a LGBTQ support group yesterday.", role="note", timestamp=SAID),
        MemoryInput("Melanie: We went camping two weekends ago, and yesterday too.", role="note", timestamp=SAID),
        MemoryInput("Caroline: Sounds great, what did you see?", role="note", timestamp=SAID),
        MemoryInput("Melanie: Last month I got hurt; yesterday I was fine.", role="note", timestamp=SAID),
    ]


def _rows(mem: ReMem) -> list[tuple[Any, ...]]:
    with mem.store.read() as tx:
        return [tuple(r) for r in tx.run("SELECT memory_id, lo, hi, grain, expr FROM memory_times ORDER BY 1, 2")]


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d")


def test_a_memory_keeps_the_times_its_text_names(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        ids = mem.add_many(_turns())
        got = {(mid, _day(lo), _day(hi), grain, expr) for mid, lo, hi, grain, expr in _rows(mem)}
        assert got == {
            (ids[0], "2023-05-07", "2023-05-08", "day", "yesterday"),
            (ids[1], "2023-04-29", "2023-05-01", "weekend", "two weekends ago"),
            (ids[1], "2023-05-07", "2023-05-08", "day", "yesterday"),
            (ids[3], "2023-04-01", "2023-05-01", "month", "Last month"),
            (ids[3], "2023-05-07", "2023-05-08", "day", "yesterday"),
        }
        with mem.store.read() as tx:
            assert tx.get_meta(times.META_KEY) == str(RESOLVER_VERSION)
            found = tx.times_of(ids)
            yesterday = datetime(2023, 5, 7, tzinfo=UTC).timestamp()
            assert found[ids[0]] == [(yesterday, yesterday + DAY)]
            assert set(found) == {ids[0], ids[1], ids[3]} and len(found[ids[1]]) == len(found[ids[3]]) == 2
        assert mem.verify().ok


def test_a_repeated_expression_is_one_row(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        (mid,) = mem.add_many([MemoryInput("yesterday, yes, yesterday", role="note", timestamp=SAID)])
        assert [r[0] for r in _rows(mem)] == [mid]


def test_batched_and_one_by_one_adds_store_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = []
    for name in ("batched", "single"):
        counter = iter(range(1, 100))
        monkeypatch.setattr("remem_agent.ingest.new_id", lambda prefix, c=counter: f"{prefix}_{next(c):024x}")
        with ReMem(tmp_path / name) as mem:
            if name == "batched":
                mem.add_many(_turns())
            else:
                for turn in _turns():
                    mem.add_many([turn])
            got.append(_rows(mem))
            assert mem.verify().ok
    assert got[0] == got[1] and len(got[0]) == 5


def test_verify_finds_a_changed_missing_or_foreign_row(tmp_path: Path) -> None:
    loc = tmp_path / "s"
    with ReMem(loc) as mem:
        ids = mem.add_many(_turns())
    conn = sqlite3.connect(loc / "ledger.db")
    conn.execute("UPDATE memory_times SET lo = lo - 86400 WHERE memory_id = ?", (ids[0],))
    conn.execute("DELETE FROM memory_times WHERE memory_id = ? AND grain = 'month'", (ids[3],))
    conn.execute(
        "INSERT INTO memory_times VALUES (?, 0, 86400, 'day', 'yesterday')", (ids[2],)
    )  # a row for a text that names no time
    conn.commit()
    conn.close()
    with ReMem(loc) as mem:
        problems = mem.verify().problems
    assert len([p for p in problems if "time mentions" in p]) == 3
    assert (
        any(ids[0] in p for p in problems) and any(ids[2] in p for p in problems) and any(ids[3] in p for p in problems)
    )


def test_a_store_of_another_resolver_version_is_resolved_again_on_open(tmp_path: Path) -> None:
    loc = tmp_path / "s"
    with ReMem(loc) as mem:
        mem.add_many(_turns())
        want = _rows(mem)
    conn = sqlite3.connect(loc / "ledger.db")
    conn.execute("DELETE FROM memory_times")
    conn.execute("UPDATE meta SET value = '0' WHERE key = ?", (times.META_KEY,))
    conn.commit()
    conn.close()
    with ReMem(loc) as mem:
        assert _rows(mem) == want and mem.verify().ok
        with mem.store.read() as tx:
            assert tx.get_meta(times.META_KEY) == str(RESOLVER_VERSION)


def test_a_version_10_sqlite_store_upgrades_and_resolves_its_memories(tmp_path: Path) -> None:
    assert migrations.LATEST == pg_migrations.LATEST == 16
    loc = tmp_path / "s"
    with ReMem(loc) as mem:
        mem.add_many(_turns())
        want, before = _rows(mem), mem.stats()
    conn = sqlite3.connect(loc / "ledger.db")
    _sqlite_downgrades.downgrade(conn, SQLITE_11_TO_10)
    assert conn.execute("PRAGMA user_version").fetchone() == (10,)
    conn.close()
    with ReMem(loc) as mem:
        assert mem.stats() == before and mem.stats().schema_version == 16
        assert _rows(mem) == want and mem.verify().ok


def test_postgres_stores_the_same_rows_upgrades_and_copies(tmp_path: Path, pg_url: str) -> None:
    import _pg_downgrades
    import psycopg
    from _pg_downgrades import DOWNGRADE_11_TO_10

    from remem_agent.store.copy import copy_store

    with ReMem(pg_url) as pg, ReMem(tmp_path / "lite") as lite:
        pg_ids, lite_ids = pg.add_many(_turns()), lite.add_many(_turns())
        relabel = dict(zip(pg_ids, lite_ids, strict=True))
        assert sorted((relabel[r[0]], *r[1:]) for r in _rows(pg)) == sorted(_rows(lite))
        want = _rows(pg)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _pg_downgrades.downgrade(conn, DOWNGRADE_11_TO_10)
    with ReMem(pg_url) as pg:
        assert pg.stats().schema_version == 16 and _rows(pg) == want and pg.verify().ok
    report = copy_store(pg_url, tmp_path / "back")
    assert report["verify_ok"], report["problems"]
    assert report["rows"]["memory_times"] == len(want) == 5
    with ReMem(tmp_path / "back") as back:
        assert _rows(back) == want
