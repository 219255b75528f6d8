"""Dense candidates of one scope in a shared store: ranked exactly over that scope, read once, on both backends;
and PostgreSQL's lexical statement counts each word once, not once per matching memory.

Why: one user's memories are a small share of a store many users write. pgvector 0.6 filters an HNSW search
after the index scan, so the ledger's index returned a handful of that user's rows and the search widened its
pool ×4 per round until it scanned every memory of every scope. Measured ad hoc on PostgreSQL before the fix
(12k memories, a 200-memory scope): 47 ms p50 for a dense search, now about 5 ms; and the lexical statement,
whose word counts PostgreSQL re-ran for every matching row, took up to 3 s.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from remem_agent import ReMem, RememConfig

StoreLocation = Callable[[str], "str | Path"]
WORDS = "amber cedar lotus maple orbit river stone cloud ember frost grove harbor".split()


def _text(rng: random.Random, i: int) -> str:
    return f"note {i}: " + " ".join(rng.sample(WORDS, 4))


def _fill(mem: ReMem, sizes: dict[str, int], seed: int = 3) -> None:
    rng = random.Random(seed)
    for scope, n in sizes.items():
        mem.add_many([_text(rng, i) for i in range(n)], scope=scope)


def _exact_top(mem: ReMem, q: Any, scope: str, k: int) -> list[float]:
    """The k best cosines over every memory of ``scope``, from the ledger's own vectors."""
    with mem.store.read() as tx:
        mine = {m.id for m in tx.list_memories(None, scope=scope)}
        _, ids, mat = tx.embeddings_after(0, mem.dim)
    rows = np.asarray(mat, dtype=np.float64)[[i for i, mid in enumerate(ids) if mid in mine]]
    sims = rows @ np.asarray(q, dtype=np.float64) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(q))
    return sorted(sims.tolist(), reverse=True)[:k]


@pytest.mark.parametrize("scope", ["small", "mid"])
def test_a_scope_is_ranked_exactly_over_its_own_memories(store_location: StoreLocation, scope: str) -> None:
    with ReMem(store_location("s"), config=RememConfig(retrieval="dense")) as mem:
        _fill(mem, {"big": 900, "mid": 100, "small": 12})
        rng = random.Random(5)
        for _ in range(8):
            q = mem.embedder.embed([" ".join(rng.sample(WORDS, 2))])[0]
            cands = mem.candidates(q, k=5, at=2e9, scope=scope)
            assert {m.scope for m in cands.memories} == {scope}
            want = _exact_top(mem, q, scope, len(cands.memories))
            assert len(cands.memories) == min(40, {"mid": 100, "small": 12}[scope])
            np.testing.assert_allclose(cands.similarities, want, atol=1e-5)


class _Counting:
    """Wraps the index's candidate call and counts it."""

    def __init__(self, mem: ReMem, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        target: Any = mem._flat if mem._flat is not None else mem.index
        name = "scan" if mem._flat is not None else "candidates"
        inner = getattr(target, name)

        def counted(query: Any, k: int, **kw: Any) -> Any:
            self.calls.append(k)
            return inner(query, k, **kw)

        monkeypatch.setattr(target, name, counted)


def test_a_scope_with_fewer_memories_than_the_pool_is_read_once(
    store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReMem(store_location("s")) as mem:
        _fill(mem, {"big": 600, "tiny": 3})
        spy = _Counting(mem, monkeypatch)
        res = mem.search("amber cedar", k=5, scope="tiny")
        assert len(res.ids) == 3
        assert len(spy.calls) == 1  # the index gave every row the scope has: no widening rounds


@pytest.fixture()
def pg_mem(pg_url: str) -> Iterator[ReMem]:
    with ReMem(pg_url) as mem:
        yield mem


def test_postgres_lexical_scores_are_sqlite_s_bm25_for_the_same_ledger(pg_mem: ReMem, tmp_path: Path) -> None:
    rng = random.Random(9)
    # word frequencies differ by an order of magnitude, so a misplaced document frequency would change the scores
    texts = [f"memo {i}: amber " + " ".join(rng.sample(WORDS[1:], 2)) for i in range(60)] + ["lotus river harbor"]
    with ReMem(tmp_path / "lite") as lite:
        for mem in (pg_mem, lite):
            mem.add_many(texts, scope="u")
            mem.add_many(texts[:20], scope="other")
        got: dict[str, list[tuple[str, float]]] = {}
        for name, mem in (("pg", pg_mem), ("sqlite", lite)):
            text_of = {m.id: m.text for m in mem.list(limit=None)}
            with mem.store.read() as tx:
                found = tx.lexical_candidates("harbor amber lotus camping", limit=100, scopes=frozenset({"u"}))
            got[name] = [(text_of[i], s) for i, s in found]
    assert len(got["pg"]) == 61
    assert got["pg"] == got["sqlite"]  # the same floats, in the same order


def test_postgres_uses_its_hnsw_index_for_a_large_scope_before_statistics_exist(
    pg_mem: ReMem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh table has no statistics: the planner guessed a scope holds 49 of 3,000 rows and ranked the whole
    # scope exactly instead of using the HNSW index (50 ms instead of ~10 at 10k memories).
    from remem_agent.store import pg_search

    monkeypatch.setattr(pg_search, "EXACT_SCOPE_ROWS", 2000)  # 3,000 rows: above the exact bound
    _fill(pg_mem, {"default": 3000})
    store: Any = pg_mem.store
    seen: list[tuple[str, Any]] = []
    inner = store._statement

    def recording(sql: str, params: Any = None) -> Any:
        if "<=>" in sql:
            seen.append((sql, params))
        return inner(sql, params)

    monkeypatch.setattr(store, "_statement", recording)
    q = pg_mem.embedder.embed(["amber cedar"])[0]
    ids, _ = pg_mem.index.candidates(q, 40, scopes=frozenset({"default"}))
    assert len(ids) == 40 and len(seen) == 1  # one index search, no exact fallback
    sql, params = seen[0]
    plan = "\n".join(str(r[0]) for r in inner("EXPLAIN " + sql, params))
    assert "memories_embedding_hnsw" in plan, plan


def test_lexical_only_candidates_get_their_true_cosine_on_every_backend(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        rng = random.Random(11)
        texts = [_text(rng, i) for i in range(400)]
        texts += [f"the quokka {i} was seen near the {rng.choice(WORDS)}" for i in range(12)]
        mem.add_many(texts)
        lexical_only = 0
        for query in ("quokka amber", "quokka sightings", "where was the quokka seen"):
            q = mem.embedder.embed([query])[0]
            cands = mem.candidates(q, k=5, at=2e9, query=query)
            dense_ids, _ = (
                mem._flat.candidates(q, 40) if mem._flat is not None else mem.index.candidates(q, 40, scopes=None)
            )
            with mem.store.read() as tx:
                vecs = tx.embeddings_of([m.id for m in cands.memories])
            for m, sim in zip(cands.memories, cands.similarities, strict=True):
                v = np.asarray(vecs[m.id], dtype=np.float64)
                want = float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q)))
                assert sim == pytest.approx(want, abs=1e-5), m.text
                lexical_only += m.id not in dense_ids
        assert lexical_only > 0  # the fused pools did hold candidates only the lexical channel found


def test_postgres_ranks_a_scope_it_knows_is_small_exactly_at_once(
    pg_mem: ReMem, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remem_agent.store import pg_search

    _fill(pg_mem, {"big": 900, "user": 30})
    store: Any = pg_mem.store
    statements: list[str] = []
    inner = store._statement

    def recording(sql: str, params: Any = None) -> Any:
        if "<=>" in sql:
            statements.append("hnsw" if "LIMIT %(w)s" in sql else "exact")
        elif sql.startswith("SELECT count(*) FROM memories"):
            statements.append("count")
        return inner(sql, params)

    monkeypatch.setattr(store, "_statement", recording)
    q = pg_mem.embedder.embed(["amber cedar"])[0]
    first = pg_mem.index.candidates(q, 40, scopes=frozenset({"user"}))
    assert statements == ["count", "exact"] and len(first[0]) == 30  # counted once, small: ranked exactly
    statements.clear()
    again = pg_mem.index.candidates(q, 40, scopes=frozenset({"user"}))
    assert statements == ["exact"] and again[0] == first[0]  # known to be small: no HNSW search first
    statements.clear()
    both = pg_mem.index.candidates(q, 40, scopes=frozenset({"user", "big"}))
    assert statements == ["hnsw"] and len(both[0]) == 40  # several scopes are not counted first

    monkeypatch.setattr(pg_search, "EXACT_SCOPE_ROWS", 40)  # the scope outgrows the bound: back to the index
    _fill(pg_mem, {"user": 30}, seed=4)
    statements.clear()
    pg_mem.index.candidates(q, 40, scopes=frozenset({"user"}))
    assert statements == ["exact"]  # still counted at 30: the exact scan now counts 60
    statements.clear()
    pg_mem.index.candidates(q, 40, scopes=frozenset({"user"}))
    assert statements[0] == "hnsw"


def test_a_served_set_never_holds_the_same_text_twice(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "s")
    try:
        for day in range(3):  # a conversation note said three times, stored three times (notes are kept)
            mem.add("The team lunch is on Fridays.", role="note", timestamp=day + 1)
        mem.add("Lunch orders go to the office manager.", role="note", timestamp=5)
        res = mem.search("When is the team lunch?", k=3)
        texts = [h.text for h in res.items]
        assert texts.count("The team lunch is on Fridays.") == 1 and len(texts) == 2, texts
    finally:
        mem.close()
