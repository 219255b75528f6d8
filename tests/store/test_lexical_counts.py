"""The lexical channel's word counts are remembered between searches (``sqlite_cache.ReadCache``) but are never
stale: after an insert through this or another connection, a text update (compression), or a rolled-back
write, each count equals a fresh count of the full-text index."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from _sqlite_trace import traced

import remem_agent.memory as memory_module
from remem_agent import ReMem
from remem_agent.store import lexical
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sqlite_tx import SQLiteTx

WORDS = ["amber", "cedar", "lotus", "maple", "orbit", "river"]
FRESH = "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? LIMIT ?)"


def _counts(mem: ReMem, cap: int) -> tuple[list[int], list[int], int]:
    """(remembered-or-read counts, fresh counts, count statements the first needed)."""
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        with traced(tx) as statements:
            got = tx._lexical_counts(WORDS, cap)
        want = [int(tx.c.execute(FRESH, (lexical.fts5_match([w]), cap)).fetchone()[0]) for w in WORDS]
    return got, want, sum("memories_fts MATCH" in s for s in statements)


def test_counts_are_reused_and_never_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "store"
    mem = ReMem(folder)
    mem.add_many([f"amber note {i}" for i in range(5)] + ["cedar and lotus", "orbit"])
    got, want, reads = _counts(mem, cap=4)
    assert got == want == [4, 1, 1, 0, 1, 0] and reads == len(WORDS)
    got, want, reads = _counts(mem, cap=4)
    assert got == want and reads == 0  # nothing changed: every count remembered

    mem.add("maple and cedar")  # this connection inserts: counts below the cap are read again
    got, want, reads = _counts(mem, cap=4)
    assert got == want == [4, 2, 1, 1, 1, 0] and reads == len(WORDS) - 1  # amber is at its cap: kept

    other = ReMem(folder)  # another connection commits: everything is read again
    other.add("river river cedar")
    got, want, reads = _counts(mem, cap=4)
    assert got == want == [4, 3, 1, 1, 1, 1] and reads == len(WORDS)
    other.close()

    # a text update without a new seq (compression rewrites a memory's text): no count survives it
    lotus = next(h.id for h in mem.search("lotus", k=3).items if "lotus" in h.text)
    _counts(mem, cap=4)
    with mem.store.write() as tx:
        tx.transition(lotus, LifecycleEvent.DEMOTE, reason="test", at=2e9)
        tx.transition(lotus, LifecycleEvent.COMPRESS, reason="test", at=2e9, updates={"text": "orbit"})
    got, want, reads = _counts(mem, cap=4)
    assert got == want and got[WORDS.index("lotus")] == 0 and reads == len(WORDS)

    # a write that rolls back after counting inside it: counts of uncommitted rows are dropped
    def insert_then_count_then_fail(tx: LedgerTx, *args: Any) -> str:
        real_insert(tx, *args)
        assert isinstance(tx, SQLiteTx)
        # counted inside, at the cap of 2: a count at its cap would be kept across a new seq
        assert tx._lexical_counts(["river"], 2) == [2]
        raise RuntimeError("abort")

    real_insert = memory_module.insert_fact
    monkeypatch.setattr(memory_module, "insert_fact", insert_then_count_then_fail)
    with pytest.raises(RuntimeError):
        mem.add("river again")
    monkeypatch.undo()
    got, want, _ = _counts(mem, cap=2)
    assert got == want and got[WORDS.index("river")] == 1
    mem.close()


def test_counts_match_fresh_counts_through_random_writes(tmp_path: Path) -> None:
    rng = random.Random(5)
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    for step in range(40):
        writer = mem if rng.random() < 0.7 else other
        writer.add_many(
            [" ".join(rng.choice(WORDS) for _ in range(3)) + f" {step} {j}" for j in range(rng.randint(1, 4))]
        )
        for cap in (3, 10):
            got, want, _ = _counts(mem, cap)
            assert got == want, (step, cap)
    mem.close()
    other.close()


def test_another_connections_searches_keep_the_caches_and_its_transitions_drop_them(tmp_path: Path) -> None:
    """Two ReMem objects (or gateway workers) on one folder: a search by one commits a search record, which
    must not empty the other's row cache and word counts (PRAGMA data_version changes on every such commit);
    a change to a memories row by the other (a transition, a new memory) must."""
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    ids = mem.add_many([f"amber note {i}" for i in range(5)] + ["cedar and lotus", "orbit"])
    mem.search("amber cedar")
    _counts(mem, cap=4)
    other.search("amber lotus")  # another connection commits a search record only
    got, want, reads = _counts(mem, cap=4)
    assert got == want and reads == 0
    with mem.store.read() as tx, traced(tx) as statements:
        rows = tx.memories(ids)
    assert set(rows) == set(ids) and not any(s.startswith("SELECT id") for s in statements)  # all cached

    with other.store.write() as tx:  # another connection changes a row: the cached copy must not be served
        tx.transition(ids[0], LifecycleEvent.DEMOTE, reason="test", at=2e9)
    with mem.store.read() as tx:
        assert tx.memories([ids[0]])[ids[0]].state.value == "LOW_VALUE"
    got, want, reads = _counts(mem, cap=4)
    assert got == want and reads == len(WORDS)
    mem.close()
    other.close()


def test_numbers_are_counted_in_their_own_bounded_table(tmp_path: Path) -> None:
    """Numbers (an open vocabulary) are remembered apart: they never evict a word's count, their table stays
    within its bound, and a count is never stale after an insert."""
    mem = ReMem(tmp_path / "store")
    mem.add_many(["ticket 4711 amber", "ticket 4711 cedar", "order 99 amber"])
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx) and tx._cache is not None
        cache = tx._cache
        cache.max_number_counts = 3
        with traced(tx) as statements:
            assert tx._lexical_counts(["amber", "4711", "99"], 8) == [2, 2, 1]
            assert tx._lexical_counts(["amber", "4711", "99"], 8) == [2, 2, 1]
        assert sum("memories_fts MATCH" in s for s in statements) == 3  # the second time: all remembered
        tx._lexical_counts([str(n) for n in range(1000, 1010)], 8)  # a stream of new numbers
        assert len(cache.number_counts) <= 3 and ("amber", 8) in cache.counts
    mem.add("ticket 4711 lotus")
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        fresh = int(tx.c.execute(FRESH, (lexical.fts5_match(["4711"]), 8)).fetchone()[0])
        assert tx._lexical_counts(["4711"], 8) == [fresh] == [3]
    mem.close()
