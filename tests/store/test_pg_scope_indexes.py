"""remem_agent/store/pg_search.py: the path a scope-filtered search takes on PostgreSQL, and the HNSW index a large
scope gets of its own (built at once by ``index_scopes`` or in the background as a scope grows; one builder
across processes; cancelled by ``close``; an interrupted build's invalid index dropped by the next)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
import pytest

from remem_agent import ReMem
from remem_agent.store import pg_search
from remem_agent.store.pg_search import choose_path, scope_index_name, wants_scope_index
from remem_agent.store.postgres_tx import lock_key

WORDS = "amber cedar lotus maple orbit river stone cloud ember frost grove harbor".split()


def test_the_path_of_a_search() -> None:
    small, large = pg_search.EXACT_SCOPE_ROWS, pg_search.EXACT_SCOPE_ROWS + 1
    assert choose_path(k=10, rows=small, indexed=True) == "exact"  # small: exact even with an index
    assert choose_path(k=10, rows=large, indexed=True) == "scope_index"
    assert choose_path(k=10, rows=large, indexed=False) == "ledger_index"
    assert choose_path(k=10, rows=None, indexed=False) == "ledger_index"  # several scopes are not counted
    assert choose_path(k=pg_search.EF_SEARCH_MAX + 1, rows=large, indexed=True) == "exact"  # wider than HNSW gives


@pytest.mark.parametrize(
    ("rows", "ledger", "wanted"),
    [
        (pg_search.SCOPE_INDEX_ROWS, 10 * pg_search.SCOPE_INDEX_ROWS, True),
        (pg_search.SCOPE_INDEX_ROWS - 1, 10 * pg_search.SCOPE_INDEX_ROWS, False),  # small: exact is cheap
        (pg_search.SCOPE_INDEX_ROWS, pg_search.SCOPE_INDEX_ROWS, False),  # the whole ledger: its index serves it
    ],
)
def test_which_scopes_get_an_index_of_their_own(rows: int, ledger: int, wanted: bool) -> None:
    assert wants_scope_index(rows, ledger) is wanted


def test_index_names_are_stable_identifiers_per_scope() -> None:
    names = {scope_index_name(s) for s in ("user:alice", "user:bob", "team 'x'; DROP TABLE memories")}
    assert len(names) == 3 and all(n.isidentifier() and len(n) < 63 for n in names)
    assert scope_index_name("user:alice") == scope_index_name("user:alice")


@pytest.fixture()
def low_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_search, "EXACT_SCOPE_ROWS", 50)
    monkeypatch.setattr(pg_search, "SCOPE_INDEX_ROWS", 200)


@pytest.fixture()
def filled(pg_url: str, low_thresholds: None) -> Iterator[tuple[ReMem, str]]:
    """A store whose scope "big" (300 memories, a fifth of the ledger) is due an index and "most" (900, three
    fifths) is not: the ledger's index serves a scope that large."""
    rng = random.Random(5)
    with ReMem(pg_url, embedder="hash") as mem:
        for scope, n in (("big", 300), ("most", 900), ("small", 300)):
            mem.add_many([f"note {i}: " + " ".join(rng.sample(WORDS, 4)) for i in range(n)], scope=scope)
        yield mem, pg_url


def _statements(mem: ReMem, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The index searches a store runs from now on (the statements of its scope and ledger index paths)."""
    seen: list[str] = []
    search: Any = mem.store.vector_search()  # type: ignore[attr-defined]
    inner = search._at_width

    def recording(text: str, params: Any, width: int, **kw: Any) -> Any:
        seen.append(text)
        return inner(text, params, width, **kw)

    monkeypatch.setattr(search, "_at_width", recording)
    return seen


def _exact_ids(mem: ReMem, q: Any, scope: str, k: int) -> list[str]:
    store: Any = mem.store
    return [str(r[0]) for r in store.vector_search()._exact(np.asarray(q, dtype=np.float32), k, frozenset({scope}))]


def test_index_scopes_builds_the_due_ones_and_searches_use_them(
    filled: tuple[ReMem, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mem, _ = filled
    store: Any = mem.store
    assert store.index_scopes() == ["big", "small"]
    assert store.index_scopes() == []  # built: nothing is due any more
    seen = _statements(mem, monkeypatch)
    q = mem.embedder.embed(["amber cedar river"])[0]
    ids, sims = mem.index.candidates(q, 10, scopes=frozenset({"big"}))
    name = scope_index_name("big")
    assert len(seen) == 1 and "'big'" in seen[0]  # the scope written into the statement: the planner can match
    with store._tx("READ COMMITTED", read_only=True) as tx:  # as the search runs it
        tx.conn.execute("SET LOCAL enable_sort = off")
        plan = "\n".join(str(r[0]) for r in tx.conn.execute("EXPLAIN " + seen[0], {"q": q, "k": 10}).fetchall())
    assert name in plan, plan
    assert ids == _exact_ids(mem, q, "big", 10) and list(sims) == sorted(sims, reverse=True)
    mine = {m.id for m in mem.list(limit=None, scope="big")}
    assert set(ids) <= mine
    seen.clear()
    mem.index.candidates(q, 10, scopes=frozenset({"most"}))  # no index of its own: the ledger's
    assert "LIMIT %(w)s" in seen[0]


def test_a_growing_scope_gets_its_index_in_the_background(
    filled: tuple[ReMem, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mem, _ = filled
    search: Any = mem.store.vector_search()  # type: ignore[attr-defined]
    q = mem.embedder.embed(["amber cedar river"])[0]
    first = mem.index.candidates(q, 10, scopes=frozenset({"big"}))  # counted at 300: due, built in the background
    for thread in list(search._builders.values()):
        thread.join(timeout=120)
    assert scope_index_name("big") in search.refresh_indexes()
    assert scope_index_name("most") not in search.refresh_indexes()
    seen = _statements(mem, monkeypatch)
    again = mem.index.candidates(q, 10, scopes=frozenset({"big"}))
    assert "'big'" in seen[0] and again[0] == first[0]


def test_one_builder_across_processes(filled: tuple[ReMem, str]) -> None:
    mem, url = filled
    store: Any = mem.store
    with psycopg.connect(url, autocommit=True) as other:  # another process is building "big"
        other.execute("SELECT pg_advisory_lock(%s)", (lock_key("scope-index:big", store.schema),))
        assert store.vector_search().build("big") is False
        assert store.index_scopes() == ["small"]
    assert store.index_scopes() == ["big"]


def test_close_cancels_a_build_and_the_next_build_replaces_its_invalid_index(
    filled: tuple[ReMem, str], low_thresholds: None
) -> None:
    mem, url = filled
    store: Any = mem.store
    search = store.vector_search()
    name = scope_index_name("big")
    with psycopg.connect(url, autocommit=True) as blocker:
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE remem.memories IN SHARE ROW EXCLUSIVE MODE")  # CREATE INDEX CONCURRENTLY waits
        search._build_in_background("big")
        _wait_for(lambda: "big" in search._building)
        time.sleep(0.3)  # the CREATE INDEX statement is sent and waits for the lock
        mem.close()  # cancels it and waits for the thread
        assert not search._builders and not [t for t in threading.enumerate() if t.name == "remem-scope-index"]
        blocker.execute("ROLLBACK")
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            (name,),
        ).fetchall()
    assert left in ([], [(False,)])  # nothing, or the invalid index an interrupted build leaves
    with ReMem(url, embedder="hash") as again:
        reopened: Any = again.store
        assert name not in reopened.vector_search().refresh_indexes()
        assert reopened.index_scopes() == ["big", "small"]
        assert name in reopened.vector_search().refresh_indexes()


def _wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.01)
