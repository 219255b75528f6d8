"""The SQLite ledger: migrations, append-only logs, verify(), embedding validation, lifecycle table."""

from __future__ import annotations

import itertools
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from remem_agent import (
    EmbeddingError,
    InvalidTransition,
    LedgerIntegrityError,
    ReMem,
    SchemaVersionError,
    State,
    StoreError,
    UserInputError,
)
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.store.lifecycle import TRANSITIONS, LifecycleEvent, next_state
from remem_agent.store.migrations import LATEST
from remem_agent.store.sqlite import LEDGER_FILE


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path / LEDGER_FILE, isolation_level=None)


def test_store_is_one_wal_sqlite_file(tmp_path: Path) -> None:
    with ReMem(tmp_path) as mem:
        mem.add("x")
    c = raw(tmp_path)
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA user_version").fetchone()[0] == LATEST


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    with ReMem(tmp_path) as mem:
        mid = mem.add("keep me")
    c = raw(tmp_path)
    c.execute(f"PRAGMA user_version = {LATEST + 1}")
    c.close()
    with pytest.raises(SchemaVersionError, match="upgrade remem-agent"):
        ReMem(tmp_path)
    c = raw(tmp_path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == LATEST + 1
    assert c.execute("SELECT text FROM memories WHERE id = ?", (mid,)).fetchone()[0] == "keep me"


def test_events_and_credits_are_append_only_and_memories_never_deleted(tmp_path: Path) -> None:
    with ReMem(tmp_path) as mem:
        mid = mem.add("x", timestamp=1)
        hits = mem.search("x", now=2)
        mem.feedback(hits.search_id, success=True, used_ids=[mid])
    c = raw(tmp_path)
    for stmt in (
        "UPDATE events SET reason = 'edited'",
        "DELETE FROM events",
        "UPDATE credits SET credit = 9",
        "DELETE FROM credits",
        "DELETE FROM memories",
        "UPDATE memories SET original_text = 'rewritten'",
    ):
        with pytest.raises(sqlite3.DatabaseError):
            c.execute(stmt)


def test_verify_reports_tampering(tmp_path: Path) -> None:
    with ReMem(tmp_path) as mem:
        a = mem.add("x is 1", entity="x", attribute="v", timestamp=1)
        b = mem.add("y fact", timestamp=1)
        hits = mem.search("y fact", now=2)
        mem.feedback(hits.search_id, success=True, used_ids=[b])
        assert mem.verify().ok
    c = raw(tmp_path)
    c.execute("UPDATE memories SET state = 'ARCHIVED' WHERE id = ?", (a,))  # bypasses the event log
    c.execute("UPDATE stats SET shown = shown + 5 WHERE memory_id = ?", (b,))  # a "lost" update
    c.close()
    with ReMem(tmp_path) as mem:
        report = mem.verify()
        assert not report.ok
        text = " | ".join(report.problems)
        assert "event log ends in ACTIVE" in text
        assert f"stats ({b}, *)" in text
        with pytest.raises(LedgerIntegrityError):
            mem.verify(raise_on_error=True)


def test_reopening_with_another_embedder_is_refused(tmp_path: Path) -> None:
    with ReMem(tmp_path) as mem:
        mem.add("x")
    with pytest.raises(UserInputError, match="built with embedder"):
        ReMem(tmp_path, embedder=ConceptHashEmbedder(dim=64))


class BadEmbedder:
    """Returns whatever vectors the test wants."""

    name = "bad"

    def __init__(self, dim: int, make: object) -> None:
        self.dim = dim
        self.make = make

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.make(len(texts))  # type: ignore[operator, no-any-return]


@pytest.mark.parametrize(
    "make",
    [
        lambda n: np.full((n, 8), np.nan),
        lambda n: np.full((n, 8), np.inf),
        lambda n: np.ones((n, 7)),
        lambda n: np.ones((n + 1, 8)),
        lambda n: np.zeros((n, 8)),
        lambda n: np.ones(8),
    ],
)
def test_bad_embeddings_are_typed_errors_and_write_nothing(tmp_path: Path, make: object) -> None:
    good = BadEmbedder(8, lambda n: np.ones((n, 8)))
    with ReMem(tmp_path, embedder=good) as mem:
        mem.add("first")
    bad = BadEmbedder(8, make)
    with ReMem(tmp_path, embedder=bad) as mem:
        with pytest.raises(EmbeddingError):
            mem.add("second")
        with pytest.raises(EmbeddingError):
            mem.search("query")
        assert mem.stats().memories == 1 and mem.stats().searches == 0
        assert mem.verify().ok


ALL_STATES: list[State | None] = [None, *State]


@pytest.mark.parametrize(("state", "event"), list(itertools.product(ALL_STATES, LifecycleEvent)))
def test_every_state_event_pair_on_a_real_ledger(tmp_path: Path, state: State | None, event: LifecycleEvent) -> None:
    """Each (state, event) pair: legal ones move and are logged; illegal ones raise and change nothing."""
    expected = TRANSITIONS.get((state, event))
    if state is None:
        # A new memory: only 'add' is legal; everything else has no memory to act on.
        if expected is None:
            with pytest.raises(InvalidTransition):
                next_state(None, event)
        else:
            assert next_state(None, event) is State.ACTIVE
        return
    paths = {
        State.ACTIVE: [],
        State.LOW_VALUE: [LifecycleEvent.DEMOTE],
        State.COMPRESSED: [LifecycleEvent.DEMOTE, LifecycleEvent.COMPRESS],
        State.ARCHIVED: [LifecycleEvent.DEMOTE, LifecycleEvent.COMPRESS, LifecycleEvent.ARCHIVE],
        State.INVALIDATED: [LifecycleEvent.INVALIDATE],
    }
    with ReMem(tmp_path) as mem:
        mid = mem.add("subject", timestamp=1)
        if state is State.ERASED:  # erasure has its own path, which redacts the row (store/erasure.py)
            mem.erase(mid, reason="setup", now=2, scrub=False)
        with mem.store.write() as tx:
            for step in paths.get(state, []):
                tx.transition(mid, step, reason="setup", at=2)
        assert mem.get(mid).state is state
        n_events = len(mem.inspect(mid).history)
        if expected is None:
            with pytest.raises(InvalidTransition), mem.store.write() as tx:
                tx.transition(mid, event, reason="test", at=3)
            assert mem.get(mid).state is state
            assert len(mem.inspect(mid).history) == n_events
        else:
            if event is LifecycleEvent.ERASE:
                with pytest.raises(StoreError, match=r"ReMem\.erase"), mem.store.write() as tx:
                    tx.transition(mid, event, reason="test", at=3)
                assert mem.get(mid).state is state
                mem.erase(mid, reason="test", now=3, scrub=False)
            else:
                with mem.store.write() as tx:
                    tx.transition(mid, event, reason="test", at=3)
            info = mem.inspect(mid)
            assert info.state is expected
            last = info.history[-1]
            assert (last.kind, last.from_state, last.to_state, last.reason) == (event.value, state, expected, "test")
        assert mem.verify().ok


def test_disk_full_is_a_store_error_and_loses_nothing(tmp_path: Path) -> None:
    from remem_agent import StoreError

    with ReMem(tmp_path) as mem:
        keep = mem.add("seed fact")
        pc = mem.store._conn.execute("PRAGMA page_count").fetchone()[0]
        mem.store._conn.execute(f"PRAGMA max_page_count = {pc + 2}")
        with pytest.raises(StoreError, match="full"):
            mem.add_many([f"fact {i} " + "x" * 2000 for i in range(200)])
        mem.store._conn.execute("PRAGMA max_page_count = 1073741823")
        assert mem.get(keep).text == "seed fact" and mem.stats().memories == 1
        assert mem.verify().ok


def test_a_ledger_locked_past_the_retry_window_says_how_long_it_was_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Retries are logged at DEBUG, and the final StoreBusyError says how many there were, over how long."""
    import logging

    from remem_agent import StoreBusyError
    from remem_agent.store.sqlite import SQLiteStore

    with ReMem(tmp_path) as mem:
        keep = mem.add("seed fact")
    store = SQLiteStore(tmp_path, busy_timeout_s=0.01, lock_retry_s=1.0)
    holder = raw(tmp_path)
    holder.execute("BEGIN IMMEDIATE")  # another process's write transaction that does not end
    try:
        with (
            caplog.at_level(logging.DEBUG, logger="remem_agent.store"),
            pytest.raises(StoreBusyError, match=r"stayed locked \((\d+) attempts over \d+\.\d s\)") as info,
            store.write(),
        ):
            pass
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()
    said = re.search(r"\((\d+) attempts", str(info.value))
    assert said is not None
    attempts = int(said.group(1))
    retries = [r for r in caplog.records if r.name == "remem_agent.store" and "retrying in" in r.getMessage()]
    assert attempts >= 2 and len(retries) == attempts - 1  # one line per retry; the last attempt gave up
    with ReMem(tmp_path) as mem:
        assert mem.get(keep).text == "seed fact" and mem.stats().memories == 1
        assert mem.verify().ok


def test_verify_catches_a_lost_retrieval_counter(tmp_path: Path) -> None:
    with ReMem(tmp_path) as mem:
        a = mem.add("x fact", timestamp=1)
        mem.search("x fact", now=2)
    c = raw(tmp_path)
    c.execute("UPDATE stats SET retrieved = retrieved - 1 WHERE memory_id = ?", (a,))
    c.close()
    with ReMem(tmp_path) as mem:
        assert any("retrieved=0" in p for p in mem.verify().problems)


def test_every_error_survives_pickling() -> None:
    """Errors raised in worker processes must reach the parent intact (multiprocessing pickles them)."""
    import pickle

    from remem_agent import errors as E

    samples = [
        E.UserInputError("bad"),
        E.UnknownMemoryError("m_1"),
        E.UnknownSearchError("s_1"),
        E.UnknownSearchError("a_1", field="answer_id", detail="not given here"),
        E.FeedbackConflictError("s_1", "differs"),
        E.EmbeddingError("nan"),
        E.InvalidTransition("m_1", "INVALIDATED", "invalidate"),
        E.StoreError("x"),
        E.SchemaVersionError(3, 2, "/tmp/x"),
        E.LedgerIntegrityError(["a", "b"]),
        E.StoreBusyError("locked"),
        E.StoreConnectionError("unreachable"),
        E.MissingExtensionError("no pgvector"),
        E.ModelError("429", status=429, body="slow", retryable=True, retry_after=2.0),
        E.ModelNotAvailableError("missing", status=None),
        E.OutputValidationError("no", attempts=3, last_raw="{", errors=["e"]),
    ]
    for err in samples:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


def test_a_memory_id_read_back_is_one_object_whichever_read_gave_it(tmp_path: Path) -> None:
    """Ids read from the ledger are interned (``store.sql.row_to_memory``): the dense index's ids (from
    ``embeddings_after``) and the rows' ids are the same string objects, so the search's tables keyed by id
    compare them by identity. Two reads of the same rows, by either path, give the same objects."""
    from remem_agent.store.sqlite_tx import SQLiteTx

    mem = ReMem(tmp_path / "store")
    added = mem.add_many([f"fact {i} about regions" for i in range(5)])
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        _, ids, _ = tx.embeddings_after(0, mem.dim)
        rows = SQLiteTx(tx.c, None).memories(ids)  # uncached: each row built from its ledger row
        again = SQLiteTx(tx.c, None).memories(list(reversed(ids)))
    assert ids == added
    assert all(rows[i].id is i and again[i].id is i for i in ids)
    assert all(a is i for a, i in zip(added, ids, strict=True))  # add_many's own ids (the flat index's) too
    mem.close()
