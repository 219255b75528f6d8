"""SQLite's lexical query ranks the full-text matches alone and filters the best ``2 * limit`` on cached rows
(``SQLiteTx._lexical_query``), falling back to the query that joins memories when that window holds too few
eligible rows. Either way the answer must be exactly the joined query's: same ids, same scores, same order,
through other scopes, retired memories, text updates and another connection's writes."""

from __future__ import annotations

import random
from pathlib import Path

from remem_agent import ReMem
from remem_agent.learning.lifecycle import LifecycleEvent
from remem_agent.store.sqlite import SQLiteTx

WORDS = ["amber", "cedar", "lotus", "maple", "orbit", "river", "quartz", "willow"]
SCOPES = ["alice", "bob", "carol"]


def _joined(tx: SQLiteTx, query: str, *, limit: int, scopes: frozenset[str] | None, current: bool) -> object:
    """The reference: the same transaction's answer without a row cache (the joined SQL query)."""
    plain = SQLiteTx(tx.c, None)
    return plain.lexical_candidates(query, limit=limit, scopes=scopes, current_only=current)


def _check(mem: ReMem, rng: random.Random, paths: dict[str, int]) -> None:
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        for _ in range(12):
            query = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
            limit = rng.choice([1, 2, 5, 20])
            scopes = rng.choice([None, frozenset({"alice"}), frozenset({"bob", "carol"}), frozenset({"nobody"})])
            current = rng.random() < 0.7
            statements: list[str] = []
            tx.c.set_trace_callback(statements.append)
            try:
                got = tx.lexical_candidates(query, limit=limit, scopes=scopes, current_only=current)
            finally:
                tx.c.set_trace_callback(None)
            assert got == _joined(tx, query, limit=limit, scopes=scopes, current=current), (query, limit, scopes)
            ranked = [s for s in statements if "bm25(" in s]
            if ranked:
                paths["fallback" if any("CROSS JOIN" in s for s in ranked) else "window"] += 1


def test_windowed_lexical_query_equals_the_joined_query(tmp_path: Path) -> None:
    rng = random.Random(11)
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    paths = {"window": 0, "fallback": 0}
    ids: list[str] = []
    for step in range(30):
        writer = mem if rng.random() < 0.7 else other
        batch = []
        for j in range(rng.randint(2, 6)):
            # repeated words give bm25 ties, so the order of equal scores is checked as well
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) + f" note{step}x{j}"
            batch.append((text, rng.choice(SCOPES)))
        for scope in SCOPES:
            texts = [t for t, s in batch if s == scope]
            if texts:
                ids += writer.add_many(texts, scope=scope)
        victim = rng.choice(ids)
        with writer.store.write() as tx:
            state = tx.memory(victim).state.value
            if state == "ACTIVE":
                event = rng.choice([LifecycleEvent.INVALIDATE, LifecycleEvent.DEMOTE])
                tx.transition(victim, event, reason="test", at=2e9)
            elif state == "COMPRESSED":
                tx.transition(victim, LifecycleEvent.ARCHIVE, reason="test", at=2e9)
            elif state == "LOW_VALUE":  # a text update: the full-text entry changes without a new seq
                text = rng.choice(WORDS)
                tx.transition(victim, LifecycleEvent.COMPRESS, reason="test", at=2e9, updates={"text": text})
        _check(mem, rng, paths)
    assert paths["window"] > 0 and paths["fallback"] > 0, paths  # both paths were compared
    mem.close()
    other.close()
