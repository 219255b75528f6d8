"""A conversation turn's vector leans toward the turn before it (remem_agent/embedders/context.py, schema 12)."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _sqlite_downgrades
import numpy as np
import pytest
from _sqlite_downgrades import SQLITE_12_TO_11
from hypothesis import given
from hypothesis import strategies as st

from remem_agent import MemoryInput, ReMem, RememConfig
from remem_agent.embedders import context
from remem_agent.errors import UserInputError
from remem_agent.store import migrations, pg_migrations

StoreLocation = Callable[[str], "str | Path"]
SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


def _turn(text: str, speaker: str, session: str, n: int, scope: str | None = None) -> MemoryInput:
    return MemoryInput(
        f"{speaker}: {text}",
        role="note",
        speaker=speaker,
        session=session,
        timestamp=SAID + timedelta(seconds=n),
        scope=scope,
    )


TURNS = [
    _turn("What did you paint for the show?", "Caroline", "s1", 0),
    _turn("A sunset over the lake, in oils.", "Melanie", "s1", 1),
    _turn("Lovely. How are the kids?", "Caroline", "s1", 2),
    _turn("We moved house last week.", "Melanie", "s2", 3),
    _turn("Where to?", "Caroline", "s2", 4),
]


def _vectors(mem: ReMem, ids: list[str]) -> np.ndarray:
    with mem.store.read() as tx:
        got = tx.embeddings_of(ids)
    return np.stack([got[i] for i in ids])


def _expected(mem: ReMem, items: list[MemoryInput], weight: float) -> np.ndarray:
    """The recurrence written out by hand, one turn at a time."""
    own = np.asarray(mem.embedder.embed([i.text for i in items]), dtype=np.float64)
    out, last = [], {}
    for item, e in zip(items, own, strict=True):
        key = (item.scope or "default", item.session) if item.role == "note" and item.speaker else None
        v = e
        if key is not None and key in last:
            mixed = e + weight * last[key]
            v = mixed * (np.linalg.norm(e) / np.linalg.norm(mixed))
        if key is not None:
            last[key] = v
        out.append(v)
    return np.stack(out)


def test_chain_vectors_by_hand() -> None:
    e = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 1.0]])
    keys = [("a", "s"), ("a", "s"), None, ("a", "t")]
    got = context.chain_vectors(keys, e, 1.0, {("a", "t"): np.array([1.0, 0.0], dtype=np.float32)})
    # turn 2 leans on turn 1: (0, 2) + (1, 0) = (1, 2), rescaled to its own norm 2
    assert np.allclose(got[1], np.array([1.0, 2.0]) * 2 / math.sqrt(5))
    assert np.allclose(got[0], e[0]) and np.allclose(got[2], e[2])  # the first of its chain; not a turn
    assert np.allclose(got[3], np.array([1.0, 1.0]) / math.sqrt(2))  # leans on the stored turn before the batch
    assert np.array_equal(context.chain_vectors(keys, e, 0.0, {}), e.astype(np.float32))


@given(st.lists(st.sampled_from([None, ("a", "s"), ("a", "t"), ("b", "s")]), min_size=1, max_size=12))
def test_chain_vectors_keep_each_norm_and_leave_other_memories_alone(keys: list[Any]) -> None:
    rng = np.random.default_rng(len(keys))
    e = rng.normal(size=(len(keys), 8))
    got = context.chain_vectors(keys, e, 0.7, {})
    assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(e, axis=1), rtol=1e-5)
    for i, k in enumerate(keys):
        if k is None or k not in keys[:i]:
            assert np.allclose(got[i], e[i], rtol=1e-6)


def test_turns_lean_on_the_turn_before_them_in_their_session(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        assert mem.turn_context == context.DEFAULT_WEIGHT
        ids = mem.add_many(TURNS)
        assert np.allclose(_vectors(mem, ids), _expected(mem, TURNS, mem.turn_context), atol=1e-5)
        fact = mem.add("Melanie paints in oils.", entity="Melanie", attribute="medium")
        own = np.asarray(mem.embedder.embed(["Melanie paints in oils."]), dtype=np.float32)
        assert np.allclose(_vectors(mem, [fact]), own, atol=1e-6)  # not a turn: its own vector
        assert mem.verify().ok


def test_turns_added_one_by_one_store_the_batch_vectors(tmp_path: Path) -> None:
    with ReMem(tmp_path / "batch") as a, ReMem(tmp_path / "single") as b:
        batch = _vectors(a, a.add_many(TURNS))
        single = _vectors(b, [b.add_many([t])[0] for t in TURNS])
        assert np.allclose(batch, single, atol=1e-6)


def test_scopes_and_sessions_are_separate_chains(tmp_path: Path) -> None:
    items = [
        _turn("I adopted a dog.", "Ann", "s1", 0, scope="u1"),
        _turn("What breed?", "Bob", "s1", 1, scope="u2"),  # another scope: no context from u1
        _turn("A beagle.", "Ann", "s1", 2, scope="u1"),  # leans on "I adopted a dog."
    ]
    with ReMem(tmp_path / "s") as mem:
        ids = [mem.add_many([i], scope=i.scope)[0] for i in items]
        own = np.asarray(mem.embedder.embed([i.text for i in items]), dtype=np.float32)
        got = _vectors(mem, ids)
        assert np.allclose(got[0], own[0]) and np.allclose(got[1], own[1])
        assert not np.allclose(got[2], own[2])
        assert np.allclose(got, _expected(mem, items, mem.turn_context), atol=1e-5)


def test_openai_messages_have_no_session_and_keep_their_own_vectors(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "What did you paint?"}, {"role": "assistant", "content": "A sunset."}]
    with ReMem(tmp_path / "s") as mem:
        ids = mem.add_conversation(msgs)
        with mem.store.read() as tx:
            texts = {r[0]: r[1] for r in tx.run("SELECT id, original_text FROM memories")}
        own = np.asarray(mem.embedder.embed([texts[i] for i in ids]))
        assert np.allclose(_vectors(mem, ids), own, atol=1e-6)


def test_the_weight_is_the_stores_and_another_is_refused(tmp_path: Path) -> None:
    loc = tmp_path / "s"
    with ReMem(loc, config=RememConfig(turn_context=0.25)) as mem:
        ids = mem.add_many(TURNS)
        assert mem.store.get_meta(context.META_KEY) == "0.25"
        assert np.allclose(_vectors(mem, ids), _expected(mem, TURNS, 0.25), atol=1e-5)
    with ReMem(loc) as mem:  # unset: the store's own
        assert mem.turn_context == 0.25
    with pytest.raises(UserInputError, match=r"turn_context 0\.25; got 0\.7"):
        ReMem(loc, config=RememConfig(turn_context=0.7))
    with ReMem(loc, config=RememConfig(turn_context=0.25)) as mem:  # the refusal left the store as it was
        assert mem.stats().memories == len(TURNS) and mem.verify().ok


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), 11.0, True, "0.5"])
def test_a_bad_weight_is_refused(bad: object) -> None:
    with pytest.raises(UserInputError, match="turn_context"):
        RememConfig(turn_context=bad)  # type: ignore[arg-type]


def test_a_version_11_store_with_memories_keeps_its_vectors_without_context(tmp_path: Path) -> None:
    assert migrations.LATEST == pg_migrations.LATEST == 16
    loc = tmp_path / "s"
    with ReMem(loc, config=RememConfig(turn_context=0)) as mem:  # vectors as version 11 built them
        mem.add_many(TURNS[:2])
        before = mem.stats()
    conn = sqlite3.connect(loc / "ledger.db")
    _sqlite_downgrades.downgrade(conn, SQLITE_12_TO_11)
    assert conn.execute("PRAGMA user_version").fetchone() == (11,)
    conn.close()
    with ReMem(loc) as mem:
        assert mem.stats() == before and mem.stats().schema_version == 16
        assert mem.turn_context == 0.0 and mem.verify().ok
        with mem.store.read() as tx:
            names = {r[0] for r in tx.run("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "memories_turns" in names
    empty = tmp_path / "empty"  # a version-11 store without memories takes the configured weight
    ReMem(empty).close()
    conn = sqlite3.connect(empty / "ledger.db")
    _sqlite_downgrades.downgrade(conn, SQLITE_12_TO_11)
    conn.close()
    with ReMem(empty) as mem:
        assert mem.turn_context == context.DEFAULT_WEIGHT


def test_reembed_recomputes_the_chain_and_can_change_the_weight(tmp_path: Path) -> None:
    from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
    from remem_agent.store.copy import copy_store

    src = tmp_path / "src"
    with ReMem(src) as mem:
        ids = [mem.add_many([t])[0] for t in TURNS]
    for weight, name in ((None, "same"), (0.0, "none"), (1.5, "more")):
        report = copy_store(src, tmp_path / name, embedder=ConceptHashEmbedder(), turn_context=weight, batch=2)
        assert report["verify_ok"], report["problems"]
        want = context.DEFAULT_WEIGHT if weight is None else weight
        with ReMem(tmp_path / name) as moved:
            assert moved.turn_context == want
            assert np.allclose(_vectors(moved, ids), _expected(moved, TURNS, want), atol=1e-5)
    with pytest.raises(UserInputError, match="needs an embedder"):
        copy_store(src, tmp_path / "x", turn_context=0.5)
    with pytest.raises(UserInputError, match="turn_context"):
        copy_store(src, tmp_path / "y", embedder=ConceptHashEmbedder(), turn_context=-1)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
