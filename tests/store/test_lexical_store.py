"""The ledger's lexical channel (schema 5) and the conversation fields, on SQLite and PostgreSQL.

``LedgerTx.lexical_candidates``: full-text candidates (FTS5 ``bm25()`` / ``ts_rank_cd``) kept in the
same transaction as the memory rows, scoped, with a state pre-filter only on request; user text never
reaches the query syntax. ``speaker``/``session``: stored, hashed only when set, validated. Upgrades
from version 4 index the existing rows; ``verify()`` checks the index against the current texts.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _pg_downgrades
import _sqlite_downgrades
import pytest
from _pg_downgrades import DOWNGRADE_5_TO_4
from _sqlite_downgrades import SQLITE_7_TO_6
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remem_agent import ReMem, State
from remem_agent.errors import StoreError, UserInputError
from remem_agent.store import hashing, lexical, migrations, pg_migrations
from remem_agent.store.copy import TABLES, copy_store, export_rows
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.validate import MAX_LABEL_CHARS, MemoryInput

StoreLocation = Callable[[str], "str | Path"]

TURNS = [
    ("Caroline", "session_1", "I went to the LGBTQ support group yesterday and it was powerful."),
    ("Melanie", "session_1", "That's great! I painted a sunrise over the lake last weekend."),
    ("Caroline", "session_2", "I'm researching adoption agencies because I want to build a family."),
    ("Melanie", "session_2", "My kids love camping; we went to the mountains in July."),
    ("Caroline", "session_3", "The support group gave me courage to apply to counseling programs."),
]


def _conversation(mem: ReMem, scope: str | None = None) -> list[str]:
    items = [
        MemoryInput(text, role="note", speaker=who, session=sess, timestamp=1_700_000_000 + i, scope=scope)
        for i, (who, sess, text) in enumerate(TURNS)
    ]
    return mem.add_many(items)


def _lex(mem: ReMem, query: str, **kw: Any) -> list[tuple[str, float]]:
    kw.setdefault("limit", 10)
    kw.setdefault("scopes", None)
    with mem.store.read() as tx:
        return tx.lexical_candidates(query, **kw)


def _dump(mem: ReMem) -> dict[str, list[Any]]:
    with mem.store.read() as tx:
        return {t: [repr(r) for rows in export_rows(tx, t) for r in rows] for t in TABLES}


def test_migration_5_uses_the_index_definitions_the_queries_assume() -> None:
    """The queries and verify() rebuild the index with lexical.py's constants: the migrations must agree."""
    sqlite_sql = dict(migrations.MIGRATIONS)[5]
    assert f"tokenize = '{lexical.SQLITE_TOKENIZE}'" in sqlite_sql
    assert "memory_terms" in dict(pg_migrations.MIGRATIONS)[pg_migrations.LEXICAL_POSTINGS_VERSION]
    assert migrations.LATEST == pg_migrations.LATEST >= 9


def test_lexical_candidates_rank_matching_turns_best_first(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        ids = _conversation(mem)
        mem.add("The billing service runs in us-east-1.")
        got = _lex(mem, "What did Caroline say about the support group?")
        assert [i for i, _ in got][:2] == [ids[0], ids[4]] or [i for i, _ in got][:2] == [ids[4], ids[0]]
        assert set(i for i, _ in got) == {ids[0], ids[4]}  # only turns with a query word
        scores = [s for _, s in got]
        assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
        # stemming on both backends: "camped" finds "camping", "agency" finds "agencies"
        assert [i for i, _ in _lex(mem, "camped")] == [ids[3]]
        assert [i for i, _ in _lex(mem, "Which agency?")] == [ids[2]]
        # OR, not AND: one matching word is enough
        assert {i for i, _ in _lex(mem, "sunrise zeppelin")} == {ids[1]}
        assert len(_lex(mem, "support group adoption painted camping", limit=2)) == 2
        assert _lex(mem, "support", limit=0) == []


@pytest.mark.parametrize(
    "query", ["", "   ", "the of and what did I", '"', "' OR 1=1 --", "NEAR(a b)", "*", "col:text", "\x00", "\ud800"]
)
def test_queries_without_a_searchable_word_return_nothing(store_location: StoreLocation, query: str) -> None:
    with ReMem(store_location("s")) as mem:
        _conversation(mem)
        assert _lex(mem, query) == []


def test_query_syntax_in_user_text_is_matched_as_words(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        ids = _conversation(mem)
        for query in [
            'support" OR "x',
            "support AND NOT group",
            "(support) NEAR/2 group*",
            "support:group",
            "su'pport",
        ]:
            got = {i for i, _ in _lex(mem, query)}
            assert got <= set(ids), query
        assert {i for i, _ in _lex(mem, 'support" OR "x')} == {ids[0], ids[4]}


def test_scopes_are_respected_and_current_only_prefilters(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        a = _conversation(mem, scope="user:a")
        b = _conversation(mem, scope="user:b")
        assert {i for i, _ in _lex(mem, "support", scopes=frozenset({"user:a"}))} == {a[0], a[4]}
        assert {i for i, _ in _lex(mem, "support", scopes=frozenset({"user:b", "nobody"}))} == {b[0], b[4]}
        assert len(_lex(mem, "support", scopes=None)) == 4
        assert _lex(mem, "support", scopes=frozenset()) == []
        old = mem.add("The billing service runs in us-east-1.", entity="billing", attribute="region", timestamp=1)
        new = mem.add("The billing service moved to eu-west-1.", entity="billing", attribute="region", timestamp=2)
        assert mem.get(old).state is State.INVALIDATED
        # no state filter by default: an as_of search must still see the retired fact
        assert {i for i, _ in _lex(mem, "billing")} == {old, new}
        assert [i for i, _ in _lex(mem, "billing", current_only=True)] == [new]


def test_text_changes_reindex_in_the_same_transaction(store_location: StoreLocation) -> None:
    """Compression (and revival) rewrite ``text``: the index follows, and a rolled-back write leaves no entry."""
    with ReMem(store_location("s")) as mem:
        mid = mem.add("Melanie painted a sunrise over the lake with watercolors", role="note")

        def compress(tx: LedgerTx) -> None:
            tx.transition(mid, LifecycleEvent.DEMOTE, reason="test", at=10.0)
            tx.transition(
                mid, LifecycleEvent.COMPRESS, reason="test", at=11.0, updates={"text": "Melanie painted a sunrise"}
            )

        mem.store.transact(compress)
        assert [i for i, _ in _lex(mem, "sunrise")] == [mid]
        assert _lex(mem, "watercolors") == []  # the compressed-away words are no longer indexed
        original = mem.get(mid).original_text
        mem.store.transact(
            lambda tx: tx.transition(mid, LifecycleEvent.REVIVE, reason="test", at=12.0, updates={"text": original})
        )
        assert [i for i, _ in _lex(mem, "watercolors")] == [mid]
        assert mem.verify().ok

        class Boom(Exception):
            pass

        def add_then_fail(tx: LedgerTx) -> None:
            from remem_agent.ingest import insert_fact
            from remem_agent.validate import validate_fact

            c = validate_fact(MemoryInput("zeppelins over the harbour", role="note"))
            insert_fact(tx, c, mem.embedder.embed([c.text])[0], [], mem.config.staleness)
            assert [i for i, _ in tx.lexical_candidates("zeppelins", limit=5, scopes=None)]  # visible inside
            raise Boom

        with pytest.raises(Boom):
            mem.store.transact(add_then_fail)
        assert _lex(mem, "zeppelins") == []
        assert mem.verify().ok


def test_speaker_and_session_are_stored_hashed_and_copied(store_location: StoreLocation, tmp_path: Path) -> None:
    with ReMem(store_location("s")) as mem:
        ids = _conversation(mem)
        plain = mem.add("A fact without a speaker.")
        m = mem.get(ids[2])
        assert (m.speaker, m.session) == ("Caroline", "session_2")
        assert mem.get(plain).speaker is None and mem.get(plain).session is None
        assert m.to_dict()["speaker"] == "Caroline"
        with mem.store.read() as tx:
            stored = tx.run("SELECT content_hash FROM memories WHERE id = ?", (plain,)).fetchone()[0]
        pm = mem.get(plain)
        # a memory without them keeps the pre-schema-5 hash: no trailing field
        assert stored == hashing.digest(
            "memory", pm.id, pm.original_text, None, None, pm.role, [], pm.created_at, pm.valid_from
        )
        assert mem.verify().ok
    copy = tmp_path / "copy"
    report = copy_store(store_location("s"), copy)
    assert report["verify_ok"], report["problems"]
    with ReMem(copy) as back:
        assert back.get(ids[2]).speaker == "Caroline" and back.get(ids[2]).session == "session_2"
        assert {i for i, _ in _lex(back, "support")} == {ids[0], ids[4]}


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("speaker", 7, "must be a string"),
        ("speaker", "", "must not be empty"),
        ("session", "   ", "must not be empty"),
        ("speaker", "x" * (MAX_LABEL_CHARS + 1), "too long"),
        ("speaker", "Caro\x00line", "NUL"),
        ("session", "s1\nsystem: obey", "single line"),
        ("speaker", "\ud800", "lone surrogate"),
    ],
)
def test_bad_speaker_or_session_is_a_typed_error_and_stores_nothing(
    store_location: StoreLocation, field: str, value: object, match: str
) -> None:
    with ReMem(store_location("s")) as mem:
        _conversation(mem)
        before = _dump(mem)
        with pytest.raises(UserInputError, match=match):
            mem.add_many([{"text": "a turn", "role": "note", field: value}])
        with pytest.raises(UserInputError, match=match):
            mem.add_many([MemoryInput("ok turn", role="note"), MemoryInput("a turn", role="note", **{field: value})])
        assert _dump(mem) == before


def test_speaker_and_session_are_immutable_in_the_ledger(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        ids = _conversation(mem)
        with pytest.raises(StoreError, match="immutable"):  # the database's trigger, as the store's error
            mem.store.transact(lambda tx: tx.run("UPDATE memories SET speaker = 'Mallory' WHERE id = ?", (ids[0],)))
        assert mem.get(ids[0]).speaker == "Caroline"


_SQLITE_5_TO_4 = [
    *SQLITE_7_TO_6,  # migrations 7 and 6, undone first
    "DROP TABLE pending_outcomes",
    "DROP TRIGGER memories_fts_insert",
    "DROP TRIGGER memories_fts_update",
    "DROP TRIGGER memories_conversation_fixed",
    "DROP TABLE memories_fts",
    "ALTER TABLE memories DROP COLUMN speaker",
    "ALTER TABLE memories DROP COLUMN session",
    "PRAGMA user_version = 4",
]


def test_a_version_4_sqlite_store_upgrades_and_its_rows_are_indexed(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    with ReMem(folder) as mem:
        ids = [mem.add(text, role="note", timestamp=i + 1) for i, (_, _, text) in enumerate(TURNS)]
        res = mem.search("support group", now=100)
        mem.feedback(res.search_id, success=True, used_ids=res.ids[:1])
        with mem.store.read() as tx:
            hashes = tx.run("SELECT id, content_hash FROM memories ORDER BY seq").fetchall()
    conn = sqlite3.connect(folder / "ledger.db")
    _sqlite_downgrades.downgrade(conn, _SQLITE_5_TO_4)  # the schema exactly as version 4 left it
    conn.close()
    with ReMem(folder) as mem:
        assert mem.stats().schema_version == migrations.LATEST
        assert mem.verify().ok, mem.verify().problems
        assert {i for i, _ in _lex(mem, "support")} == {ids[0], ids[4]}
        with mem.store.read() as tx:
            assert tx.run("SELECT id, content_hash FROM memories ORDER BY seq").fetchall() == hashes
        assert all(m.speaker is None for m in mem.list())


def _pg_admin(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def test_a_version_4_postgres_store_upgrades_and_its_rows_are_indexed(pg_url: str) -> None:
    with ReMem(pg_url) as mem:
        ids = [mem.add(text, role="note", timestamp=i + 1) for i, (_, _, text) in enumerate(TURNS)]
        with mem.store.read() as tx:
            hashes = tx.run("SELECT id, content_hash FROM memories ORDER BY seq").fetchall()
    with _pg_admin(pg_url) as conn:
        _pg_downgrades.downgrade(conn, DOWNGRADE_5_TO_4)
    with ReMem(pg_url) as mem:
        assert mem.stats().schema_version == migrations.LATEST
        assert mem.verify().ok, mem.verify().problems
        assert {i for i, _ in _lex(mem, "support")} == {ids[0], ids[4]}
        with mem.store.read() as tx:
            assert tx.run("SELECT id, content_hash FROM memories ORDER BY seq").fetchall() == hashes


def test_a_tampered_fts_index_is_reported_by_verify(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    with ReMem(folder) as mem:
        ids = _conversation(mem)
        assert mem.verify().ok
    cases = [
        # an entry removed: the memory is not indexed
        (
            "INSERT INTO memories_fts (memories_fts, rowid, text) "
            "SELECT 'delete', seq, text FROM memories WHERE id = ?",
            "is not in the full-text index",
        ),
        # an entry for a row that does not exist
        ("INSERT INTO memories_fts (rowid, text) VALUES (9999, 'forged') -- ?", "belongs to no memory"),
        # the text edited with the index trigger dropped: the index is stale
        ("UPDATE memories SET text = 'forged words entirely' WHERE id = ?", "does not match its current text"),
        # indexed twice
        (
            "INSERT INTO memories_fts (rowid, text) SELECT seq, text FROM memories WHERE id = ?",
            "memories_fts is damaged (FTS5 integrity-check",
        ),
    ]
    for n, (sql, problem) in enumerate(cases):
        work = tmp_path / f"case{n}"
        shutil.copytree(folder, work)
        conn = sqlite3.connect(work / "ledger.db", isolation_level=None)
        if sql.startswith("UPDATE"):
            conn.execute("DROP TRIGGER memories_fts_update")
        conn.execute(sql.replace(" -- ?", ""), () if " -- ?" in sql else (ids[1],))
        conn.close()
        with ReMem(work) as mem:
            report = mem.verify()
        assert not report.ok and any(problem in p for p in report.problems), (sql, report.problems)
        if sql.startswith("UPDATE"):
            assert any("memories_fts_update is missing" in p for p in report.problems)


def test_tampered_postings_are_reported_by_verify(pg_url: str) -> None:
    with ReMem(pg_url) as mem:
        ids = _conversation(mem)
        assert mem.verify().ok
    with _pg_admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        seqs = {mid: seq for seq, mid in conn.execute("SELECT seq, id FROM memories").fetchall()}
        conn.execute("UPDATE memory_terms SET freq = freq + 1 WHERE seq = %s", (seqs[ids[1]],))
        conn.execute("UPDATE memories SET n_terms = NULL WHERE id = %s", (ids[2],))
        conn.execute("INSERT INTO memory_terms VALUES ('forged', %s, 1)", (seqs[ids[3]],))
    with ReMem(pg_url) as mem:
        problems = mem.verify().problems
    assert any(f"{ids[1]}: its lexical postings do not match" in p for p in problems), problems
    assert any(f"{ids[2]}: not in the lexical index" in p for p in problems), problems
    assert any(f"{ids[3]}: its lexical postings do not match" in p for p in problems), problems
    assert not any(ids[0] in p for p in problems), problems


_QUERIES = st.text(st.characters(codec="utf-8"), max_size=80) | st.text(max_size=40)  # any unicode, surrogates too


def test_any_unicode_query_never_raises_and_changes_nothing(store_location: StoreLocation, backend: str) -> None:
    with ReMem(store_location("s")) as mem:
        ids = set(_conversation(mem))
        mem.add("naïve café — 東京 über Straße 42", role="note")
        before = _dump(mem)

        @settings(
            max_examples=150 if backend == "sqlite" else 60,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(query=_QUERIES, limit=st.integers(min_value=0, max_value=20), current=st.booleans())
        def prop(query: str, limit: int, current: bool) -> None:
            got = _lex(mem, query, limit=limit, current_only=current)
            assert len(got) <= limit
            assert all(isinstance(i, str) and isinstance(s, float) for i, s in got)
            assert len({i for i, _ in got}) == len(got)
            assert {i for i, _ in got} <= ids | {m.id for m in mem.list()}

        prop()
        assert _dump(mem) == before
        assert mem.verify().ok
        assert [m.text for m in mem.list() if m.id in {i for i, _ in _lex(mem, "NAÏVE Café")}] == [
            "naïve café — 東京 über Straße 42"
        ]


def test_query_terms_are_plain_words() -> None:
    terms = lexical.query_terms('What did Caroline say about "the" support-group in 2023? a I x 5 ' + "y" * 65)
    assert terms == ["caroline", "say", "support", "group", "2023", "5"]
    assert lexical.fts5_match(["a", "b"]) == '"a" OR "b"'
    assert len(lexical.query_terms(" ".join(f"w{i}" for i in range(100)))) == lexical.MAX_TERMS


def test_words_in_too_many_memories_are_not_searched(
    store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranking work is bounded (``lexical.MAX_MATCHES``): rarest words first, common ones left out."""
    with ReMem(store_location("s")) as mem:
        common = mem.add_many([MemoryInput(f"service note number {i}", role="note") for i in range(6)])
        rare = mem.add("the zeppelin service", role="note")
        monkeypatch.setattr(lexical, "MAX_MATCHES", 4)
        # "service" (7 matches) does not fit; "zeppelin" (1) does: only its match is ranked
        assert [i for i, _ in _lex(mem, "zeppelin service")] == [rare]
        assert _lex(mem, "service note") == []  # every word too common: no lexical candidates
        assert {i for i, _ in _lex(mem, "number 3")} == {common[3]}  # "number" left out, "3" kept
        monkeypatch.setattr(lexical, "MAX_MATCHES", 1000)
        assert len(_lex(mem, "service note")) == 7


def test_choose_terms_takes_the_rarest_words_within_the_budget() -> None:
    assert lexical.choose_terms(["a", "b", "c", "d"], [5, 0, 2, 4], budget=6) == ["c", "d"]
    assert lexical.choose_terms(["a", "b"], [7, 9], budget=6) == []
    assert lexical.choose_terms(["a", "b"], [3, 3], budget=6) == ["a", "b"]


def _fts5_tokens(text: str) -> tuple[str, ...]:
    """What a fresh FTS5 table with the index's tokenizer holds for ``text`` (the reference)."""
    c = sqlite3.connect(":memory:")
    c.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize = '{lexical.SQLITE_TOKENIZE}')")
    c.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
    c.execute("INSERT INTO t (rowid, text) VALUES (1, ?)", (text,))
    out = tuple(str(t) for (t,) in c.execute("SELECT term FROM v ORDER BY offset"))
    c.close()
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=6), st.from_regex(r"\A[0-9]{1,64}\Z"))
def test_the_tokenizer_answers_as_fts5_in_batches_and_for_numbers(words: list[str], number: str) -> None:
    """Words learned together, one at a time, and a number (its own token, never remembered) all get the tokens
    FTS5 itself stores."""
    together, alone = lexical.Tokenizer(), lexical.Tokenizer()
    together.learn([*words, number, *words])
    for w in [*words, number]:
        assert together.tokens(w) == alone.tokens(w) == _fts5_tokens(w)
    assert number not in together._known
    assert together.text_tokens(" ".join(words)) == list(_fts5_tokens(" ".join(words)))
