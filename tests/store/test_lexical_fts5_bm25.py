"""SQLite's lexical channel scores matches in process from remembered postings (store/fts5_bm25.py). The answer
must be SQLite's own to the bit: the same ids, the same ``bm25()`` scores and the same order as the SQL
query, through stemming, diacritics, repeated words, long texts, other scopes, retired and compressed
memories, another connection's writes and a transaction that has written."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _sqlite_trace import traced

from remem_agent import ReMem
from remem_agent.store import fts5_bm25, lexical
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sqlite_tx import SQLiteTx

# stems and inflections (porter: camp/camping/camped), diacritics folded, digits, a rare word
WORDS = ["camp", "camping", "camped", "café", "cafe", "naïve", "river", "rivers", "2023", "x9", "quartz", "maple"]
SCOPES = ["alice", "bob"]


def _sql(tx: SQLiteTx, query: str, **kw: Any) -> list[tuple[str, float]]:
    return SQLiteTx(tx.c, None).lexical_candidates(query, **kw)  # no cache: SQLite's bm25() and join


def _traced(tx: SQLiteTx, query: str, **kw: Any) -> tuple[list[tuple[str, float]], bool]:
    """(the answer, whether SQLite ranked it)."""
    with traced(tx) as statements:
        got = tx.lexical_candidates(query, **kw)
    return got, any("bm25(" in s for s in statements)


def _text(rng: random.Random, step: int) -> str:
    n = rng.choice([1, 3, 6, 40])  # long texts move the length normalisation
    return " ".join(rng.choice(WORDS) for _ in range(n)) + f" item{step}"


def test_in_process_bm25_equals_sqlite_bm25(tmp_path: Path) -> None:
    rng = random.Random(3)
    folder = tmp_path / "store"
    mem, other = ReMem(folder), ReMem(folder)
    ids: list[str] = []
    in_process = 0
    for step in range(25):
        writer = mem if rng.random() < 0.75 else other
        for scope in SCOPES:
            ids += writer.add_many([_text(rng, step) for _ in range(rng.randint(1, 4))], scope=scope)
        victim = rng.choice(ids)
        with writer.store.write() as tx:
            state = tx.memory(victim).state.value
            if state == "ACTIVE":
                event = rng.choice([LifecycleEvent.INVALIDATE, LifecycleEvent.DEMOTE])
                tx.transition(victim, event, reason="t", at=2e9)
            elif state == "LOW_VALUE":  # a text update: postings and the row's size change without a new seq
                tx.transition(victim, LifecycleEvent.COMPRESS, reason="t", at=2e9, updates={"text": _text(rng, step)})
        with mem.store.read() as tx:
            assert isinstance(tx, SQLiteTx)
            for _ in range(10):
                query = " ".join(rng.sample(WORDS, rng.randint(1, 4)))
                kw: dict[str, Any] = {
                    "limit": rng.choice([1, 3, 10, 100]),
                    "scopes": rng.choice([None, frozenset({"alice"}), frozenset({"bob"})]),
                    "current_only": rng.random() < 0.6,
                }
                got, ranked_by_sqlite = _traced(tx, query, **kw)
                assert got == _sql(tx, query, **kw), (step, query, kw)  # floats compared exactly
                in_process += not ranked_by_sqlite
    assert in_process > 200
    mem.close()
    other.close()


def test_a_transaction_that_wrote_lets_sqlite_rank(tmp_path: Path) -> None:
    """FTS5 keeps a transaction's own index changes in memory until commit: postings read through fts5vocab
    would miss them, so such a transaction ranks in SQLite (and sees its own rows)."""
    mem = ReMem(tmp_path / "store")
    mem.add_many(["camping by the river", "river stones"])
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        assert not _traced(tx, "river", limit=5, scopes=None)[1]  # warm the postings in process
    with mem.store.write() as tx:
        assert isinstance(tx, SQLiteTx)
        tx.c.execute("UPDATE memories SET text = 'river river river' WHERE text = 'river stones'")
        got, ranked_by_sqlite = _traced(tx, "river", limit=5, scopes=None)
        assert ranked_by_sqlite and got == _sql(tx, "river", limit=5, scopes=None)
        tx.c.execute("UPDATE memories SET text = 'river stones' WHERE text = 'river river river'")
    mem.close()


def test_a_word_of_several_tokens_is_not_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Real case: a New Tai Lue vowel sign inside a word is a separator to FTS5 but a letter to Python's \w.
    assert lexical.query_terms("a\u19b0b river") == ["river"]
    mem = ReMem(tmp_path / "store")
    mem.add_many(["camping by the river", "river stones"])
    real = lexical.TOKENIZER.tokens
    monkeypatch.setattr(lexical.TOKENIZER, "tokens", lambda w: ("river", "stone") if w == "river" else real(w))
    assert lexical.query_terms("river camping") == ["camping"]
    camping = [m.id for m in mem.list() if m.text.startswith("camping")]
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        got, ranked_by_sqlite = _traced(tx, "river camping", limit=5, scopes=None)
        assert not ranked_by_sqlite and got == _sql(tx, "camping", limit=5, scopes=None)
        assert [mid for mid, _ in got] == camping
    mem.close()


def test_tokens_are_the_index_tokenizer_s() -> None:
    assert lexical.TOKENIZER.tokens("Camping") == ("camp",)
    assert lexical.TOKENIZER.tokens("Naïve") == ("naiv",)
    assert lexical.TOKENIZER.tokens("2023") == ("2023",)


def _sqlite_varint(value: int) -> bytes:
    """SQLite's varint encoding (the reference for the decoder)."""
    if value > 0x00FFFFFFFFFFFFFF:
        head = [(value >> (8 + 7 * i)) & 0x7F | 0x80 for i in range(7, -1, -1)]
        return bytes(head) + bytes([value & 0xFF])
    groups = []
    while True:
        groups.append(value & 0x7F)
        value >>= 7
        if not value:
            break
    groups.reverse()
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def test_varints_decode_sqlite_encoding() -> None:
    values = [0, 1, 127, 128, 300, 16_383, 16_384, 2**32 + 5, 2**56 - 1, 2**56, 2**63 - 1]
    assert fts5_bm25.varints(b"".join(_sqlite_varint(v) for v in values)) == values
    with pytest.raises(ValueError):
        fts5_bm25.varints(b"\x81")


def test_totals_and_sizes_are_what_fts5_stores(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "store")
    texts = ["one two three", "word " * 300, "café naïve"]
    mem.add_many(texts)
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        cache = tx._cache
        assert cache is not None
        rows, tokens = tx._totals(cache)
        seqs = [s for (s,) in tx.c.execute("SELECT seq FROM memories ORDER BY seq")]
        sizes = tx._sizes(cache, np.array(seqs, dtype=np.int64)).tolist()
    assert rows == 3 and sizes == [3.0, 300.0, 2.0] and tokens == 305
    mem.close()


def test_own_inserts_extend_the_postings_and_scores_stay_sqlite_s(tmp_path: Path) -> None:
    """An agent stores turns between searches: this connection's new memories are added to the remembered
    postings (tokenized by the index's tokenizer) instead of dropping them, and every answer is still
    SQLite's own."""
    rng = random.Random(5)
    mem = ReMem(tmp_path / "store")
    mem.add_many([_text(rng, i) for i in range(40)])
    with mem.store.read() as tx:  # every word's postings read once
        for word in WORDS:
            tx.lexical_candidates(word, limit=5, scopes=None)
    vocab_reads = 0
    for step in range(30):
        mem.add_many([_text(rng, 100 + step) for _ in range(rng.randint(1, 3))], scope=rng.choice(SCOPES))
        with mem.store.read() as tx:
            assert isinstance(tx, SQLiteTx)
            for _ in range(4):
                query = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
                kw: dict[str, Any] = {"limit": rng.choice([2, 10, 50]), "scopes": None, "current_only": True}
                with traced(tx) as statements:
                    got = tx.lexical_candidates(query, **kw)
                assert got == _sql(tx, query, **kw), (step, query)
                vocab_reads += sum("remem_postings WHERE term" in s for s in statements)
    # every word's postings were extended with the new rows, never read from the index again
    assert vocab_reads == 0
    mem.close()


def test_past_the_cached_seq_range_sqlite_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row sizes are remembered by seq in an array; a store whose seqs run past its bound is ranked by SQLite
    (the same answer), never by a huge allocation."""
    import remem_agent.store.sqlite_tx as sqlite_module

    mem = ReMem(tmp_path / "store")
    mem.add_many(["camping by the river", "river stones", "a quartz river"])
    monkeypatch.setattr(sqlite_module, "_MAX_CACHED_SEQ", 2)
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        got, ranked_by_sqlite = _traced(tx, "river", limit=5, scopes=None)
        assert ranked_by_sqlite and got == _sql(tx, "river", limit=5, scopes=None)
    mem.close()
