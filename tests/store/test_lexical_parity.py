"""One ledger ranks alike on SQLite and PostgreSQL: the lexical channel is one tokenizer and one BM25.

The same writes (adds in several scopes, retirements, text rewrites) go to a SQLite folder and a PostgreSQL
schema in the same order, so the memories get the same sequence numbers; every query must then return the
same candidates with the same floats, compared exactly. A PostgreSQL store written before schema 9 (the
tsvector index) gets its postings from the migration.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import _pg_downgrades
import psycopg
from _pg_downgrades import DOWNGRADE_9_TO_8

from remem_agent import ReMem
from remem_agent.store import migrations, pg_migrations
from remem_agent.store.lifecycle import LifecycleEvent

# stems and inflections (porter: camp/camping/camped), diacritics, digits, stopwords, rare words
WORDS = ["camp", "camping", "camped", "café", "cafe", "naïve", "river", "rivers", "2023", "x9", "quartz", "maple"]
FILLER = ["the", "a", "of", "with", "support", "group", "deploy", "billing", "week", "yesterday"]
SCOPES = ["alice", "bob"]


def _text(rng: random.Random, step: int) -> str:
    n = rng.choice([1, 3, 6, 40])  # long texts move the length normalisation
    return " ".join(rng.choice(WORDS + FILLER) for _ in range(n)) + f" item{step}."


def _by_text(mem: ReMem, found: list[tuple[str, float]]) -> list[tuple[str, float]]:
    text_of = {m.id: m.text for scope in SCOPES for m in mem.list(scope=scope)}
    return [(text_of[i], s) for i, s in found]


def _queries(mem: ReMem, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for _ in range(12):
        query = " ".join(rng.sample(WORDS + FILLER, rng.randint(1, 5)))
        kw: dict[str, Any] = {
            "limit": rng.choice([1, 3, 10, 100]),
            "scopes": rng.choice([None, frozenset({"alice"}), frozenset({"bob"})]),
            "current_only": rng.random() < 0.6,
        }
        out.append((query, kw))
    return out


def _lexical(mem: ReMem, query: str, kw: dict[str, Any]) -> list[tuple[str, float]]:
    with mem.store.read() as tx:
        found = tx.lexical_candidates(query, **kw)
    return _by_text(mem, found)


def test_the_same_writes_rank_alike_on_both_backends(tmp_path: Path, pg_url: str) -> None:
    rng = random.Random(11)
    lite, pg = ReMem(tmp_path / "lite"), ReMem(pg_url)
    ids: dict[str, list[str]] = {"lite": [], "pg": []}
    compared = rewritten = 0
    try:
        for step in range(12):
            batches = [(scope, [_text(rng, step) for _ in range(rng.randint(1, 4))]) for scope in SCOPES]
            for name, mem in (("lite", lite), ("pg", pg)):
                for scope, texts in batches:
                    ids[name] += mem.add_many(texts, scope=scope)
            victim = rng.randrange(len(ids["lite"]))
            new_text = _text(rng, step)
            for name, mem in (("lite", lite), ("pg", pg)):
                with mem.store.write() as tx:
                    state = tx.memory(ids[name][victim]).state.value
                    if state == "ACTIVE":
                        event = LifecycleEvent.INVALIDATE if step % 2 else LifecycleEvent.DEMOTE
                        tx.transition(ids[name][victim], event, reason="t", at=2e9)
                    elif state == "LOW_VALUE":  # a text rewrite: postings and the row's length change
                        tx.transition(
                            ids[name][victim], LifecycleEvent.COMPRESS, reason="t", at=2e9, updates={"text": new_text}
                        )
                        rewritten += name == "pg"
            for query, kw in _queries(lite, rng):
                want = _lexical(lite, query, kw)
                assert _lexical(pg, query, kw) == want, (step, query, kw)  # floats compared exactly
                compared += bool(want)
        assert compared > 100 and rewritten > 0
        assert pg.verify().ok and lite.verify().ok
    finally:
        lite.close()
        pg.close()


def test_a_version_8_postgres_store_gets_its_postings_from_migration_9(tmp_path: Path, pg_url: str) -> None:
    rng = random.Random(5)
    texts = [_text(rng, i) for i in range(40)]
    with ReMem(pg_url) as pg:
        pg.add_many(texts, scope="alice")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _pg_downgrades.downgrade(conn, DOWNGRADE_9_TO_8)
        assert conn.execute("SELECT max(version) FROM remem.schema_migrations").fetchone() == (8,)
    with ReMem(pg_url) as pg, ReMem(tmp_path / "lite") as lite:
        assert pg.stats().schema_version == pg_migrations.LATEST == migrations.LATEST == 16
        assert pg.verify().ok, pg.verify().problems
        lite.add_many(texts, scope="alice")
        for query, kw in _queries(lite, rng):
            assert _lexical(pg, query, kw) == _lexical(lite, query, kw), (query, kw)
