"""What a batched add stores is exactly what adding the same facts one by one stores, on both backends.

``add_many`` writes a whole batch in one transaction, and the SQLite backend buffers the batch's new memories
and events to insert them several rows per statement (``SQLiteTx``). These tests pin the ledger contents down
row for row: every table (sequence numbers, hashes and embeddings included), the full-text index and
SQLite's AUTOINCREMENT counters, after a workload that exercises every rule of ``insert_fact`` inside one
batch (supersession by a fact of the same batch, restatement, revival of an archived fact, a backdated fact,
a replayed claim, update wording, several scopes). Ids and the clock are made deterministic, so the contents
are also compared with a digest recorded with the row-by-row writer of commit b987fa6: an optimisation of
the write path must not change a single stored byte (a change of what is stored must update GOLDEN, and
say why).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _ledger_dump import dump_ledger
from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent import MemoryInput, ReMem
from remem_agent.store.copy import TABLES
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx

StoreLocation = Callable[[str], "str | Path"]
Fact = MemoryInput | dict[str, Any] | str

# sha256 of dump_ledger() after _workload(batched=True), recorded with the row-by-row writer (see the module doc);
# the same on SQLite and PostgreSQL. Updated four times since, each time only for what a new schema adds to the dump:
# schema 10's table prior_calibration (empty here: the workload gives no feedback; without it the digest is the
# recorded e069cf752f578e0681c73d6bbaaa2bb6709e55591a78b94fe93845212936a574), and schema 11's table memory_times
# (empty: no workload text names a time) with the meta row time_resolver = 1 (without both, the digest is
# cb758ed44ded25d854cbc8128bee02542eb70c9d8fd12abeb90298e469ca6e59, byte for byte), and schema 12's meta row
# turn_context = 0.7 (the workload's one conversation turn is the first of its session, so its vector is its own;
# without the row the digest is 683969bb150ecd1fcba4e5ec16effd30bfb9c3991ba4b83dc548d98fe6f066ea), and schema 13's
# table retrieval_base (empty: nothing is pruned; without it the digest is
# 9fa35b0094d24999ade34ef1a1a7cf4123b0107befbfe6ee6fb949e5e6f31311, byte for byte), and schema 15's table
# search_decisions and 16's group_contribution (both empty: no exploring search, no feedback; without them the
# digest is BEFORE_15, which the test checks too).
GOLDEN = "0432d39e4beb6d95440bec09eb2ae25eecca2cb2088f8763d1d4c79d16197220"
BEFORE_15 = "4eeea9b9043136e112e028ade0c6708d7ac6c20f039c6ac2e05bba69f455c6e4"


@pytest.fixture()
def deterministic(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``deterministic()``: memory ids from a fresh counter and a wall clock that stands still, so a workload
    run after it stores the same bytes each time (the clock is read once per fact by validation and once per
    stored memory, in another order when batched: a moving clock would stamp other times)."""

    def restart() -> None:
        ids = itertools.count(1)
        monkeypatch.setattr("remem_agent.ingest.new_id", lambda prefix: f"{prefix}_{next(ids):024x}")
        monkeypatch.setattr("remem_agent.ingest.wall_now", lambda: 1_700_000_000.0)
        monkeypatch.setattr("remem_agent.validate.wall_now", lambda: 1_700_000_000.0)

    return restart


def _batches() -> list[tuple[str | None, list[Fact]]]:
    """The facts, in batches, each with the batch's scope."""
    day = 86_400.0
    first: list[Fact] = [
        MemoryInput("The billing service runs in us-east-1.", "billing service", "region", timestamp=1 * day),
        MemoryInput("Alice owns the billing service.", "billing service", "owner", task="billing", timestamp=day),
        MemoryInput("Prefer short answers.", role="preference", task=["support", "oncall"], timestamp=day),
        MemoryInput("Standup notes: the deploy slipped.", role="note", timestamp=day, confidence=0.5),
        # superseded by a fact of the same batch, with update wording
        MemoryInput("The billing service moved to eu-west-1.", "billing service", "region", timestamp=2 * day),
        # restated in the same batch (reconfirm)
        MemoryInput("Alice owns the billing service.", "billing service", "owner", timestamp=3 * day),
        # backdated: the newer fact of this batch already holds
        MemoryInput("The billing service runs in us-west-2.", "billing service", "region", timestamp=1.5 * day),
        MemoryInput("The cache is redis.", "search api", "cache", timestamp=2 * day),
        MemoryInput("The cache is memcached, also.", "search api", "cache", timestamp=4 * day),  # "also" warning
        {"text": "Caroline: I went to a support group.", "role": "note", "speaker": "Caroline", "session": "s1"},
        "A plain string fact without a key.",
    ]
    second: list[Fact] = [
        # replays of stored claims (same key, text and explicit time): nothing is written
        MemoryInput("The billing service moved to eu-west-1.", "billing service", "region", timestamp=2 * day),
        MemoryInput("The cache is redis.", "search api", "cache", timestamp=2 * day, confidence=0.9),
        MemoryInput("Bob owns the billing service now.", "billing service", "owner", timestamp=5 * day),
        MemoryInput("The search api runs on port 8080.", "search api", "port", timestamp=5 * day),
        MemoryInput("The search api runs on port 9090.", "search api", "port", timestamp=6 * day),
        MemoryInput("The search api runs on port 8080.", "search api", "port", timestamp=7 * day),
    ]
    scoped: list[Fact] = [
        MemoryInput("The billing service runs in ap-south-1.", "billing service", "region", timestamp=3 * day),
        MemoryInput("Alice owns the billing service.", "billing service", "owner", timestamp=3 * day),
    ]
    revive: list[Fact] = [
        # the compressed (and the archived) fact stated again: revived with its original text
        MemoryInput("Prefer short answers.", role="preference", timestamp=8 * day),
        MemoryInput("The search api runs on port 8080.", "search api", "port", timestamp=8 * day),
        MemoryInput("The search api runs on port 7070.", "search api", "port", timestamp=9 * day),
    ]
    return [(None, first), (None, second), ("user:alice", scoped), ("user:alice", first[:3]), (None, revive)]


def _retire(mem: ReMem) -> None:
    """Before the last batch: compress the preference (restated: reconfirmed) and archive a port fact (restated:
    revived with its original text, which replaces its full-text entry)."""
    pref = next(m for m in mem.list() if m.role == "preference" and m.scope == "default")
    port = next(m for m in mem.list() if m.text == "The search api runs on port 8080." and m.state.value == "ACTIVE")

    def retire(tx: LedgerTx) -> None:
        at = 7.5 * 86_400
        for m, short in ((pref, "Prefer short."), (port, "Port 8080.")):
            tx.transition(m.id, LifecycleEvent.DEMOTE, reason="test: demoted", at=at)
            tx.transition(
                m.id,
                LifecycleEvent.COMPRESS,
                reason="test: compressed",
                at=at,
                updates={"text": short, "token_cost": 3},
            )
        tx.transition(port.id, LifecycleEvent.ARCHIVE, reason="test: archived", at=at)

    mem.store.transact(retire)


def _workload(mem: ReMem, *, batched: bool) -> list[list[str]]:
    ids: list[list[str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, (scope, items) in enumerate(_batches()):
            if n == 4:
                _retire(mem)
            if batched:
                ids.append(mem.add_many(items, scope=scope))
            else:
                ids.append([i for item in items for i in mem.add_many([item], scope=scope)])
    return ids


def _digest(dump: dict[str, list[Any]]) -> str:
    return hashlib.sha256(repr(sorted(dump.items())).encode()).hexdigest()


def _sqlite_state(folder: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The SQLite full-text index as (term, row, column, offset), read with fts5vocab, and sqlite_sequence."""
    conn = sqlite3.connect(f"file:{folder / 'ledger.db'}?mode=ro", uri=True)
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, memories_fts, instance)")
        fts = conn.execute("SELECT term, doc, col, offset FROM temp.v ORDER BY term, doc, offset").fetchall()
        sequences = conn.execute(
            "SELECT name, seq FROM sqlite_sequence WHERE name IN ('memories', 'events') ORDER BY name"
        ).fetchall()
        return fts, sequences
    finally:
        conn.close()


def test_a_batched_add_stores_exactly_what_adding_one_by_one_stores(
    store_location: StoreLocation, deterministic: Callable[[], None]
) -> None:
    dumps = []
    for name, batched in (("batched", True), ("one_by_one", False)):
        deterministic()
        with ReMem(store_location(name)) as mem:
            ids = _workload(mem, batched=batched)
            report = mem.verify()
            assert report.ok, report.problems
            dumps.append((ids, dump_ledger(mem)))
    (ids_b, dump_b), (ids_o, dump_o) = dumps
    assert ids_b == ids_o
    for table in TABLES:
        assert dump_b[table] == dump_o[table], table
    counts = {t: len(rows) for t, rows in dump_b.items()}
    assert counts["memories"] >= 15 and counts["events"] > counts["memories"]
    kinds = {r[3] for r in dump_b["events"]}
    assert {"add", "invalidate", "reconfirm", "revive", "compress", "archive"} <= kinds
    if isinstance(store_location("batched"), Path):
        sqlite_state = [_sqlite_state(Path(store_location(name))) for name in ("batched", "one_by_one")]
        assert sqlite_state[0] == sqlite_state[1]
        fts, sequences = sqlite_state[0]
        assert len(fts) > 100
        # AUTOINCREMENT's counters equal the last seq, as if every row had been inserted by itself
        assert sequences == [("events", len(dump_b["events"])), ("memories", len(dump_b["memories"]))]


def test_the_ledger_contents_are_those_the_row_by_row_writer_stored(
    store_location: StoreLocation, deterministic: Callable[[], None]
) -> None:
    deterministic()
    with ReMem(store_location("s")) as mem:
        _workload(mem, batched=True)
        assert mem.verify().ok
        dump = dump_ledger(mem)
        assert _digest(dump) == GOLDEN
        assert dump["search_decisions"] == dump["group_contribution"] == []
        assert _digest(
            {t: rows for t, rows in dump.items() if t not in ("search_decisions", "group_contribution")}
        ) == (BEFORE_15)


_json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json_values = (
    _json_scalars
    | st.lists(_json_scalars, max_size=3)
    | st.tuples(_json_scalars)
    | st.dictionaries(st.text(max_size=3), _json_scalars, max_size=2)
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=6) | st.integers(), _json_values, max_size=5))
def test_an_event_records_its_evidence_as_read_back_without_decoding_it(value: dict[Any, Any]) -> None:
    """``append_event`` skips the JSON round trip of plain evidence: what it hashes must be what decoding gives."""
    from remem_agent.store.sql_rows import _EVENT_JSON, _read_back

    text = json.dumps(value, sort_keys=True, default=str) if all(type(k) is str for k in value) else None
    if text is not None:
        assert _EVENT_JSON.encode(value) == text
    got = _read_back(value)
    if got is not None:
        assert text is not None
        assert repr(got) == repr(json.loads(text))  # same keys in the same order, same values of the same types
