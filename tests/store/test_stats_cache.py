"""The SQLite read cache remembers outcome statistics between searches (``SQLiteTx.stats``) and must never
serve a stale one: after this connection's searches and feedback, another connection's searches and
feedback (which change no memories row), an import and a rolled-back write, every cached value equals a
fresh read of the stats table."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _sqlite_trace import traced

from remem_agent import ReMem
from remem_agent.store.sqlite_tx import SQLiteTx
from remem_agent.types import ALL_TASKS

TASKS = (ALL_TASKS, "deploy", "billing")


def _cached_and_fresh(
    mem: ReMem, ids: list[str], tasks: tuple[str, ...] = TASKS
) -> tuple[dict[object, object], dict[object, object], int]:
    """(cached stats, fresh stats, stats statements the cached read needed)."""
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        with traced(tx) as statements:
            got = tx.stats(ids, tasks)
        want = SQLiteTx(tx.c, None).stats(ids, tasks)
    return dict(got), dict(want), sum("FROM stats" in s for s in statements)


def test_cached_stats_equal_fresh_stats_through_every_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    ids = mem.add_many([f"fact {i} about {rng.choice(['deploys', 'billing', 'regions'])}" for i in range(30)])
    reused = 0
    for step in range(60):
        actor = mem if rng.random() < 0.6 else other
        action = rng.random()
        task = rng.choice([None, "deploy", "billing"])
        if action < 0.5:
            actor.search(rng.choice(["deploys", "billing", "regions fact"]), k=4, task=task)
        else:
            res = actor.search(rng.choice(["deploys", "billing"]), k=4, task=task)
            if res.items:
                used = [h.id for h in res.items[: rng.randint(0, len(res.items))]]
                actor.feedback(res.search_id, success=rng.random() < 0.5, used_ids=used)
        got, want, reads = _cached_and_fresh(mem, ids)
        assert got == want, step
        got, want, reads = _cached_and_fresh(mem, ids)
        assert got == want and reads == 0  # nothing changed in between: all remembered
        reused += 1

    # a committed stats write of another shape (an operator's fix, a future writer): everything is dropped
    _cached_and_fresh(mem, ids)
    with mem.store.write() as tx:
        tx.run("UPDATE stats SET wasted = wasted + 1 WHERE task = ?", (ALL_TASKS,))
    got, want, _ = _cached_and_fresh(mem, ids)
    assert got == want

    # a write that updates stats and then rolls back: the cache must not keep what was read inside it
    with pytest.raises(RuntimeError), mem.store.write() as tx:
        tx.run("UPDATE stats SET shown = shown + 100")
        assert isinstance(tx, SQLiteTx)
        tx.stats(ids, TASKS)  # read (and remembered) inside the doomed transaction
        raise RuntimeError("abort")
    got, want, _ = _cached_and_fresh(mem, ids)
    assert got == want
    assert reused == 60
    mem.close()
    other.close()


def test_the_cache_is_checked_once_per_transaction_and_again_in_the_next(tmp_path: Path) -> None:
    """One PRAGMA data_version per transaction (its snapshot cannot change inside it); the next transaction
    checks again and sees another connection's change."""
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    ids = mem.add_many(["amber note", "cedar note", "lotus note"])
    mem.search("amber cedar", k=2)
    with mem.store.read() as tx, traced(tx) as statements:
        assert isinstance(tx, SQLiteTx)
        tx.memories(ids)
        tx.stats(ids, TASKS)
        tx.lexical_candidates("amber lotus", limit=3, scopes=None)
        tx.memories(ids[:1])
    assert sum(s.startswith("PRAGMA data_version") for s in statements) == 1  # (FTS5 runs its own, "-- PRAGMA")
    res = other.search("amber", k=1)  # another connection's search record moves the stats of what it served
    got, want, _ = _cached_and_fresh(mem, ids)
    assert got == want and want[(res.items[0].id, ALL_TASKS)].retrieved == 2
    mem.close()
    other.close()


def test_cached_attributes_equal_fresh_ones_through_adds_and_updates(tmp_path: Path) -> None:
    """Attribute change counts (the confidence decay of changing attributes) are remembered the same way:
    this connection's supersessions and update wordings, another connection's, never stale."""
    from remem_agent import MemoryInput

    rng = random.Random(9)
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    names = ["region", "owner", "plan", "never-used"]
    for step in range(40):
        actor = mem if rng.random() < 0.6 else other
        attr = rng.choice(names[:3])
        wording = rng.choice(["is", "is now", "moved to"])
        fact = MemoryInput(f"svc{step % 4} {attr} {wording} v{step}", entity=f"svc{step % 4}", attribute=attr)
        actor.add_many([fact])
        for change in (False, True, False):
            if change:  # another connection changes counts without touching a memories row
                with other.store.write() as tx:
                    tx.run("UPDATE attributes SET changes = changes + 1 WHERE attribute = ?", (attr,))
            with mem.store.read() as tx:
                assert isinstance(tx, SQLiteTx)
                got = tx.attributes(names)
                want = SQLiteTx(tx.c, None).attributes(names)
            assert got == want, step
    mem.close()
    other.close()


def test_a_memory_read_for_one_task_class_answers_the_others_from_the_cache(tmp_path: Path) -> None:
    """A search asks (memory, "*") and (memory, its task); the first read keeps every task row of the memory,
    so a search of another task class reads nothing (it used to miss on every memory of its pool)."""
    mem = ReMem(tmp_path / "store")
    ids = mem.add_many(["amber deploy note", "cedar billing note", "lotus region note", "birch deploy note"])
    for task in ("deploy", "billing", "oncall"):
        res = mem.search("note", k=3, task=task)
        mem.feedback(res.search_id, success=True, used_ids=[res.items[0].id])
    mem.store._read_cache.forget_stats()  # type: ignore[attr-defined]
    got, want, reads = _cached_and_fresh(mem, ids, (ALL_TASKS, "deploy"))
    assert got == want and reads == 1
    for task in ("billing", "oncall", "planning"):
        got, want, reads = _cached_and_fresh(mem, ids, (ALL_TASKS, task))
        assert got == want and reads == 0, task
    mem.close()


def test_a_stats_row_created_after_a_complete_read_is_not_hidden(tmp_path: Path) -> None:
    """Completeness must end when this connection's own write may create a row: a memory read whole with no
    "billing" row, then served in a billing search (which inserts that row), shows the new row."""
    mem = ReMem(tmp_path / "store")
    ids = mem.add_many(["amber deploy note", "cedar billing note", "lotus region note"])
    mem.search("note", k=3, task="deploy")
    got, want, _ = _cached_and_fresh(mem, ids, (ALL_TASKS, "billing"))
    assert got == want and not any(task == "billing" for _, task in got)  # type: ignore[misc]
    served = mem.search("note", k=3, task="billing")
    got, want, reads = _cached_and_fresh(mem, ids, (ALL_TASKS, "billing"))
    assert got == want and reads == 1
    assert {mid for mid, task in got if task == "billing"} == {h.id for h in served.items}  # type: ignore[misc]
    mem.close()


def test_stats_past_the_cache_bound_are_still_exact(tmp_path: Path) -> None:
    """When filling the cache would outgrow its bound it is emptied; the answer of that very read must still
    hold every row (it used to read keys dropped by the emptying as absent)."""
    rng = random.Random(3)
    mem = ReMem(tmp_path / "store")
    ids = mem.add_many([f"fact {i} about {rng.choice(['deploys', 'billing', 'regions'])}" for i in range(40)])
    for step in range(30):
        res = mem.search(rng.choice(["deploys", "billing", "regions fact"]), k=5, task=rng.choice(TASKS[1:]))
        if step % 2 and res.items:
            mem.feedback(res.search_id, success=True, used_ids=[res.items[0].id])
    mem.store._read_cache.max_rows = 7  # type: ignore[attr-defined]
    for tasks in [(ALL_TASKS, "deploy"), (ALL_TASKS, "billing"), TASKS, (ALL_TASKS,)]:
        for chunk in (ids[:10], ids, ids[5:30]):
            got, want, _ = _cached_and_fresh(mem, chunk, tasks)
            assert got == want
    mem.close()


def test_rows_and_attributes_past_the_cache_bound_are_all_returned(tmp_path: Path) -> None:
    """The row and attribute caches are emptied when a read would outgrow them; that read still returns every
    row it was asked for (it used to drop the ones the cache held before it was emptied: a search then lost
    those candidates, once per bound's worth of rows)."""
    mem = ReMem(tmp_path / "store")
    ids = mem.add_many(  # two values per key: the second supersedes the first, so the attributes have rows
        [
            {"text": f"Service {i % 6} runs in r{i}.", "entity": f"svc{i % 6}", "attribute": f"region{i % 6}"}
            for i in range(12)
        ]
    )
    cache = mem.store._read_cache  # type: ignore[attr-defined]
    with mem.store.read() as tx:
        fresh_rows = SQLiteTx(tx.c, None).memories(ids)
        fresh_attrs = SQLiteTx(tx.c, None).attributes([f"region{i}" for i in range(6)])
    assert len(fresh_attrs) == 6
    cache.max_rows, cache.max_counts = 5, 3
    for chunk in (ids[:4], ids, ids[2:9], ids):
        with mem.store.read() as tx:
            assert tx.memories(chunk) == {i: fresh_rows[i] for i in chunk}
    names = [f"region{i}" for i in range(6)]
    for chunk in (names[:2], names, names[1:5], names):
        with mem.store.read() as tx:
            assert tx.attributes(chunk) == {n: fresh_attrs[n] for n in sorted(chunk) if n in fresh_attrs}
    mem.close()


def test_the_stats_cache_counts_what_it_holds_and_stays_in_its_bound(tmp_path: Path) -> None:
    """The stats are remembered by memory (every row of the memory, by task); the cache counts the memories and
    rows it holds, through reads, this connection's searches and feedback (which drop the memories they write)
    and emptying at the bound: after a read that fetched, it holds at most its bound or that read's own rows."""
    rng = random.Random(5)
    mem = ReMem(tmp_path / "store")
    ids = mem.add_many([f"fact {i} about {rng.choice(['deploys', 'billing', 'regions'])}" for i in range(40)])
    cache = mem.store._read_cache  # type: ignore[attr-defined]
    cache.max_rows = 25
    for step in range(40):
        res = mem.search(rng.choice(["deploys", "billing", "regions fact"]), k=5, task=rng.choice(TASKS[1:]))
        if step % 2 and res.items:
            mem.feedback(res.search_id, success=True, used_ids=[res.items[0].id])
        chunk = rng.sample(ids, 12)
        got, want, reads = _cached_and_fresh(mem, chunk, TASKS)
        assert got == want
        assert cache.stats_held == sum(1 + len(table) for table in cache.stats.values()), step
        if reads:  # a read that fetched keeps the cache in its bound, or in what it fetched itself
            assert cache.stats_held <= max(cache.max_rows, len(chunk) * (1 + len(TASKS))), step
    mem.close()


def test_cached_stats_take_ids_from_a_one_shot_iterable(tmp_path: Path) -> None:
    """``stats`` walks the ids more than once; ids given as an iterator (``LedgerTx.stats`` takes any) still
    give every row, from the cache as from the ledger."""
    mem = ReMem(tmp_path / "store")
    ids = mem.add_many(["amber deploy note", "cedar billing note", "lotus region note"])
    res = mem.search("note", k=3, task="deploy")
    mem.feedback(res.search_id, success=True, used_ids=[res.items[0].id])
    for _ in range(2):  # the first read fills the cache, the second answers from it
        with mem.store.read() as tx:
            assert isinstance(tx, SQLiteTx)
            got = tx.stats(iter(ids), TASKS)
            want = SQLiteTx(tx.c, None).stats(ids, TASKS)
        assert got == want and len(want) == 6
    mem.close()
