"""The batched key prefetch of ``add_many`` (``LedgerTx.prefetch_keys``, ``KeyView``) changes no stored byte.

Before a batch's facts are inserted, the role-'state' rows of every key the batch's state facts name are read
in a few statements; ``current_for_key``, ``claims_at`` and ``current_and_claims`` then answer those keys
from what was read instead of one query per fact, until a write of the transaction may have changed a key's
rows. These tests pin down that

* a store built with the prefetch is identical, row for row and event for event, to one built without it and
  to one built one fact per ``add_many``, over generated batches with supersession, restatement, backdating,
  replays of stored claims (superseded ones too), ties in time, update wording, archived facts stated again,
  and the learned schema (on both backends);
* every kind of write to memories makes the view stop answering what it changed (on both backends);
* the prefetch really replaces the per-fact key reads, in one statement per 300 keys (statements counted in
  SQLite's own trace, or as ``run`` is given them), each naming a power of two of keys (its last key repeated):
  a few statement texts serve batches of any size.
"""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _ledger_dump import dump_ledger
from _sqlite_trace import traced

from remem_agent import MemoryInput, ReMem, RememConfig
from remem_agent.learning.staleness import StalenessPolicy
from remem_agent.store.copy import TABLES
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import MEMORY_INSERT
from remem_agent.store.sqlite_tx import SQLiteTx
from remem_agent.types import Memory, State

StoreLocation = Callable[[str], "str | Path"]
DAY = 86_400.0
SCOPES = (None, "user:alice")
ENTITIES = ("billing service", "search api", "warehouse db")
ATTRIBUTES = ("region", "owner", "port", "cache")
VALUES = ("alpha", "beta", "gamma", "delta", "epsilon")
WORDING = (
    "The {a} of {e} is {v}.",
    "The {a} of {e} is {v}.",
    "The {a} of {e} changed to {v}.",  # update wording: a learned-schema confirmation
    "The {a} of {e} moved to {v}.",
    "The {a} of {e} is {v}, also.",  # additive wording: a warning
)
KEY_READ = "FROM memories WHERE scope ="  # CURRENT_FOR_KEY, CLAIMS_AT and KEY_STATE_FACTS
PREFETCH = "FROM memories WHERE role = 'state' AND ((scope ="


@pytest.fixture()
def deterministic(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``deterministic()``: memory ids from a fresh counter and a wall clock that stands still (as in
    test_ledger_batched.py), so two stores built from the same facts can be compared byte for byte."""

    def restart() -> None:
        ids = itertools.count(1)
        monkeypatch.setattr("remem_agent.ingest.new_id", lambda prefix: f"{prefix}_{next(ids):024x}")
        monkeypatch.setattr("remem_agent.ingest.wall_now", lambda: 1_700_000_000.0)
        monkeypatch.setattr("remem_agent.validate.wall_now", lambda: 1_700_000_000.0)

    return restart


def _generate(
    seed: int, *, learned: bool, batches: int = 6, size: int = 40
) -> list[tuple[str | None, list[MemoryInput]]]:
    """Batches of facts over a small key space, so keys recur within and across batches.

    With ``learned``, a backdated fact never has update wording: in learned-schema mode such a fact can
    make the attribute single-valued, whose retroactive supersession then retires the fact itself, and
    ``insert_fact`` goes on to invalidate it again (InvalidTransition, with or without the prefetch; left
    as it is, reported).
    """
    rng = random.Random(seed)
    stated: dict[str, list[tuple[str, str, str, float]]] = {}  # scope -> (entity, attribute, text, t) stated
    clock = DAY
    out: list[tuple[str | None, list[MemoryInput]]] = []
    for _ in range(batches):
        scope = rng.choice(SCOPES)
        seen = stated.setdefault(scope or "default", [])
        items: list[MemoryInput] = []
        for _ in range(size):
            r = rng.random()
            e, a = rng.choice(ENTITIES), rng.choice(ATTRIBUTES)
            text = rng.choice(WORDING).format(e=e, a=a, v=rng.choice(VALUES))
            task = rng.choice((None, None, "deploy", ["billing", "support"]))
            if seen and r < 0.15:  # a replay of a stored claim (often a superseded one), maybe other tags
                e, a, text, t = rng.choice(seen)
                items.append(MemoryInput(text, e, a, task=task, timestamp=t, confidence=rng.choice((1.0, 0.8))))
                continue
            if seen and r < 0.30:  # the same fact again, later or without a time: reconfirm or revive
                e, a, text, _t = rng.choice(seen)
                clock += rng.random() * DAY
                t_new: float | None = None if rng.random() < 0.2 else clock
                items.append(MemoryInput(text, e, a, task=task, timestamp=t_new))
                continue
            if seen and r < 0.38:  # another value at a stored claim's very time: ties of valid_from
                e, a, _text, t = rng.choice(seen)
                text = rng.choice(WORDING).format(e=e, a=a, v=rng.choice(VALUES))
            elif r < 0.48:  # backdated
                t = clock - rng.random() * 5 * DAY
                if learned:
                    text = WORDING[0].format(e=e, a=a, v=rng.choice(VALUES))
            elif r < 0.58:  # keyed facts of the other roles, and unkeyed notes
                role = rng.choice(("preference", "note"))
                keyed = rng.random() < 0.7
                items.append(MemoryInput(text, e if keyed else None, a if keyed else None, role=role, timestamp=clock))
                continue
            else:
                clock += rng.random() * DAY
                t = clock
            seen.append((e, a, text, t))
            items.append(MemoryInput(text, e, a, task=task, timestamp=t))
        out.append((scope, items))
    return out


def _retire(mem: ReMem, k: int, scope: str | None) -> Memory | None:
    """Archive the k-th (in seq order) ACTIVE state memory of ``scope``, compressing it first."""
    live = [m for m in mem.list(scope=scope or "default") if m.role == "state" and m.state is State.ACTIVE]
    if not live:
        return None
    m = live[k % len(live)]

    def retire(tx: LedgerTx) -> None:
        at = m.valid_from + 1
        tx.transition(m.id, LifecycleEvent.DEMOTE, reason="test: demoted", at=at)
        tx.transition(m.id, LifecycleEvent.COMPRESS, reason="test", at=at, updates={"text": "short", "token_cost": 1})
        tx.transition(m.id, LifecycleEvent.ARCHIVE, reason="test: archived", at=at)

    mem.store.transact(retire)
    return m


def _build(mem: ReMem, batches: list[tuple[str | None, list[MemoryInput]]], *, one_by_one: bool) -> list[str]:
    ids: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # additive wording and replays with other tags warn
        for n, (scope, items) in enumerate(batches):
            if n in (2, 4) and (m := _retire(mem, n, scope)) is not None:  # stated again first: revived
                assert m.entity is not None and m.attribute is not None
                items = [MemoryInput(m.original_text, m.entity, m.attribute, timestamp=m.valid_from + 2), *items]
            if one_by_one:
                ids += [i for item in items for i in mem.add_many([item], scope=scope)]
            else:
                ids += mem.add_many(items, scope=scope)
    return ids


@pytest.mark.parametrize("mode", ["key", "learned"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_store_built_with_the_prefetch_is_the_one_built_without_it(
    store_location: StoreLocation,
    deterministic: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    mode: str,
) -> None:
    batches = _generate(seed, learned=mode == "learned")
    config = RememConfig(staleness=StalenessPolicy(mode="learned" if mode == "learned" else "key"))
    built: dict[str, tuple[list[str], dict[str, list[Any]]]] = {}
    for name in ("prefetch", "no_prefetch", "one_by_one"):
        deterministic()
        with monkeypatch.context() as patch:
            if name == "no_prefetch":
                patch.setattr(LedgerTx, "prefetch_keys", lambda self, keys: None)
            with ReMem(store_location(name), config=config) as mem:
                ids = _build(mem, batches, one_by_one=name == "one_by_one")
                report = mem.verify()
                assert report.ok, (name, report.problems)
                built[name] = (ids, dump_ledger(mem))
    ids, dump = built["prefetch"]
    for name in ("no_prefetch", "one_by_one"):
        assert built[name][0] == ids, name
        for table in TABLES:
            assert built[name][1][table] == dump[table], (name, table)
    # the workload did what it is meant to exercise
    kinds = [r[3] for r in dump["events"]]
    assert {"add", "invalidate", "reconfirm", "revive", "archive"} <= set(kinds)
    assert len(ids) > len(set(ids)), "some facts were restated or replayed (their stored id came back)"
    evidence = [r[7] for r in dump["events"] if r[3] == "invalidate"]
    assert any("superseded on arrival" in str(r[6]) for r in dump["events"] if r[3] == "invalidate"), "backdated"
    assert any('"wording": "changed to"' in str(ev) for ev in evidence)
    if mode == "learned":
        assert any('"learned": true' in str(ev) for ev in evidence), "a pending conflict superseded retroactively"


# -- every writer of memories stops the view from answering what it changed --------------------------


def _vec(mem: ReMem, text: str) -> np.ndarray:
    return np.asarray(mem.embedder.embed([text])[0], dtype=np.float32)


def _memory(mem_id: str, key: tuple[str, str, str], role: str, t: float, text: str) -> Memory:
    scope, entity, attribute = key
    return Memory(
        id=mem_id,
        text=text,
        original_text=text,
        entity=entity,
        attribute=attribute,
        role=role,  # type: ignore[arg-type]
        tasks=(),
        created_at=t,
        valid_from=t,
        valid_to=None,
        superseded_by=None,
        state=State.ACTIVE,
        token_cost=5,
        confidence=1.0,
        scope=scope,
    )


K1 = ("default", "billing service", "region")
K2 = ("default", "search api", "port")
EMPTY = ("default", "nobody", "region")
TIMES = (0.5 * DAY, 1 * DAY, 2 * DAY, 3 * DAY, 9 * DAY)


def _learned(loc: str | Path) -> ReMem:
    """A learned-schema store: same-key facts without update wording stay current side by side."""
    return ReMem(loc, config=RememConfig(staleness=StalenessPolicy(mode="learned")))


def _seed(mem: ReMem) -> dict[str, str]:
    """Two keys with history: K1 two current facts, K2 three of which one backdated (so its valid_from order
    is not its insertion order) and one stated at the time of another (a tie, in insertion order); then a
    K2 fact superseded by update wording, a preference of K1's key and an unkeyed note."""
    ids = {}
    ids["k1_old"] = mem.add("Billing runs in us-east-1.", entity=K1[1], attribute=K1[2], timestamp=1 * DAY)
    ids["k1_new"] = mem.add("Billing runs in eu-west-1.", entity=K1[1], attribute=K1[2], timestamp=2 * DAY)
    ids["k2_old"] = mem.add("The search api listens on 8080.", entity=K2[1], attribute=K2[2], timestamp=1 * DAY)
    ids["k2_new"] = mem.add("The search api listens on 9090.", entity=K2[1], attribute=K2[2], timestamp=3 * DAY)
    ids["k2_back"] = mem.add("The search api listens on 8000.", entity=K2[1], attribute=K2[2], timestamp=2 * DAY)
    ids["k2_tie"] = mem.add("The search api listens on 8001.", entity=K2[1], attribute=K2[2], timestamp=1 * DAY)
    ids["k2_moved"] = mem.add("The search api moved to 5050.", entity=K2[1], attribute=K2[2], timestamp=0.5 * DAY)
    ids["k1_pref"] = mem.add(
        "Prefer eu regions for billing.", entity=K1[1], attribute=K1[2], role="preference", timestamp=DAY
    )
    ids["note"] = mem.add("Standup moved to 10am.", role="note", timestamp=DAY)
    return ids


def _answers(tx: LedgerTx) -> list[Any]:
    """What the three key reads answer for every key of the test."""
    out: list[Any] = []
    for scope, entity, attribute in (K1, K2, EMPTY):
        out.append(tx.current_for_key(entity, attribute, scope))
        for t in TIMES:
            out.append(tx.claims_at(entity, attribute, "state", t, scope))
            out.append(tx.current_and_claims(entity, attribute, t, scope))
    return out


def _queried(tx: LedgerTx) -> list[Any]:
    """``_answers`` from the ledger itself (the view set aside for the moment)."""
    view, tx.key_view = tx.key_view, None
    try:
        return _answers(tx)
    finally:
        tx.key_view = view


class _Rollback(Exception):
    pass


@contextmanager
def _write_then_roll_back(mem: ReMem) -> Iterator[LedgerTx]:
    with pytest.raises(_Rollback), mem.store.write() as tx:
        yield tx
        raise _Rollback


def _insert_state(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    m = _memory("m_new", K1, "state", 2 * DAY, "Billing runs in ap-south-1.")
    tx.insert_memory(m, _vec(mem, m.text), reason="test", at=2 * DAY)


def _insert_state_of_empty_key(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    m = _memory("m_new", EMPTY, "state", 9 * DAY, "Nobody is in a region.")
    tx.insert_memory(m, _vec(mem, m.text), reason="test", at=9 * DAY)


def _transition_of_the_key(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    updates = {"valid_to": 3 * DAY, "superseded_by": ids["k2_new"]}
    tx.transition(ids["k1_new"], LifecycleEvent.INVALIDATE, reason="test", at=3 * DAY, updates=updates)


def _compress_of_the_key(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    tx.transition(ids["k2_new"], LifecycleEvent.DEMOTE, reason="test", at=4 * DAY)
    updates = {"text": "9090.", "token_cost": 1}
    tx.transition(ids["k2_new"], LifecycleEvent.COMPRESS, reason="test", at=4 * DAY, updates=updates)


def _raw_role_update(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    """A preference of K1's key becomes a state fact: a row the view does not hold joins a held key."""
    tx.run("UPDATE memories SET role = ? WHERE id = ?", ("state", ids["k1_pref"]))


def _raw_update_many(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    tx.update_many("UPDATE memories SET valid_from = ? WHERE id = ?", [(0.5 * DAY, ids["k1_new"])])


def _raw_update_without_id(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    tx.run("UPDATE memories SET confidence = ? WHERE entity = ?", (0.5, K2[1]))


def _run_many_insert(mem: ReMem, tx: LedgerTx, ids: dict[str, str]) -> None:
    m = _memory("m_raw", K2, "state", 2 * DAY, "The search api listens on 7070.")
    vec = tx.dump_vector(_vec(mem, m.text))
    row = (m.id, m.text, m.text, m.entity, m.attribute, m.role, "[]", m.created_at, m.valid_from, None, None)
    row += ("ACTIVE", 5, 1.0, vec, "not-a-hash", m.scope, None, None)  # MEMORY_INSERT_COLS
    tx.run_many(MEMORY_INSERT, [row])


WRITERS: dict[str, Callable[[ReMem, LedgerTx, dict[str, str]], None]] = {
    "insert_memory of a held key": _insert_state,
    "insert_memory of a key with no rows": _insert_state_of_empty_key,
    "transition of a held row": _transition_of_the_key,
    "transition changing the text": _compress_of_the_key,
    "run: UPDATE of the role by id": _raw_role_update,
    "update_many: UPDATE of valid_from by id": _raw_update_many,
    "run: UPDATE not by id": _raw_update_without_id,
    "run_many: INSERT of memories rows": _run_many_insert,
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_write_to_memories_stops_the_view_answering_what_it_changed(
    store_location: StoreLocation, writer: str
) -> None:
    with _learned(store_location("s")) as mem:
        ids = _seed(mem)
        with _write_then_roll_back(mem) as tx:
            before = _queried(tx)
            tx.prefetch_keys([K1, K2, EMPTY])
            assert tx.key_view is not None
            assert _answers(tx) == before  # the view answers as the queries do
            WRITERS[writer](mem, tx, ids)
            after = _queried(tx)
            assert after != before, "the write changed what the key reads answer"
            assert _answers(tx) == after


def test_writes_of_rows_the_view_does_not_hold_keep_it(store_location: StoreLocation) -> None:
    """A transition of a memory of no held key (and inserts of other keys) leave the held keys answered."""
    with _learned(store_location("s")) as mem:
        ids = _seed(mem)
        with _write_then_roll_back(mem) as tx:
            tx.prefetch_keys([K1, K2])
            tx.transition(ids["note"], LifecycleEvent.DEMOTE, reason="test", at=5 * DAY)
            tx.insert_memory(_memory("m_other", EMPTY, "state", 5 * DAY, "x"), _vec(mem, "x"), reason="t", at=5 * DAY)
            assert tx.key_view is not None and set(tx.key_view.by_key) == {K1, K2}
            assert _answers(tx) == _queried(tx)
            tx.drop_key_view()
            assert tx.key_view is None


# -- the prefetch replaces the per-fact key reads (SQLite: statements counted) ------------------------


@contextmanager
def _statements_of(tx: LedgerTx, *, sqlite_trace: bool) -> Iterator[list[str]]:
    """The statements ``tx`` runs in the block: as SQLite traces them (``sqlite_trace``), else as ``run`` is given
    them (every ``LedgerTx`` query of the add path goes through ``run``). The trace is slow for big batches: it
    expands a multi-row insert's arguments, blobs included, once per row's full-text trigger."""
    if sqlite_trace and isinstance(tx, SQLiteTx):
        with traced(tx) as seen:
            yield seen
        return
    seen = []
    run = tx.run

    def counted(sql: str, args: Any = ()) -> Any:
        seen.append(sql)
        return run(sql, args)

    tx.run = counted  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del tx.run


def _add_traced(
    mem: ReMem, items: list[MemoryInput], monkeypatch: pytest.MonkeyPatch, *, sqlite_trace: bool
) -> list[str]:
    """The statements of ``mem.add_many(items)``'s transaction (of its last attempt, on PostgreSQL)."""
    statements: list[str] = []
    transact = mem.store.transact

    def traced_transact(fn: Callable[[LedgerTx], Any], **kwargs: Any) -> Any:
        def run(tx: LedgerTx) -> Any:
            statements.clear()
            with _statements_of(tx, sqlite_trace=sqlite_trace) as seen:
                try:
                    return fn(tx)
                finally:
                    statements.extend(seen)

        return transact(run, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(mem.store, "transact", traced_transact)
        mem.add_many(items)
    return statements


def _key_reads(store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch, n: int, *, sqlite_trace: bool) -> None:
    """A batch of ``n`` keys, half stored and half new, and one key stated twice: read in a few statements with
    the prefetch, one statement per fact without it; the same ledger either way."""
    mem = ReMem(store_location("s"))
    mem.add_many([MemoryInput(f"Service {i} runs in r{i}.", f"svc{i}", "region", timestamp=DAY) for i in range(n)])

    def batch(day: float) -> list[MemoryInput]:
        # timed and untimed facts: the two read paths of insert_fact
        items = [
            MemoryInput(f"Service {i} runs in z{i}.", f"svc{i}", "region", timestamp=day if i % 3 else None)
            for i in range(0, 2 * n, 2)
        ]
        items.append(MemoryInput("Service 2 moved to q2.", "svc2", "region", timestamp=day + 1))  # key written
        items.append(MemoryInput("A note.", role="note", timestamp=day))
        return items

    statements = _add_traced(mem, batch(2 * DAY), monkeypatch, sqlite_trace=sqlite_trace)
    assert sum(PREFETCH in s for s in statements) == -(-n // 300)  # 300 keys a statement
    # only the fact whose key an earlier fact of the batch wrote reads it (its update wording does not read the
    # key again: nothing retired a fact of the key in between, see insert_fact)
    assert sum(KEY_READ in s for s in statements) == 1
    with monkeypatch.context() as patch:
        patch.setattr(LedgerTx, "prefetch_keys", lambda self, keys: None)
        statements = _add_traced(mem, batch(3 * DAY), monkeypatch, sqlite_trace=sqlite_trace)
    assert sum(PREFETCH in s for s in statements) == 0
    assert sum(KEY_READ in s for s in statements) == n + 1  # one per keyed fact
    assert mem.verify().ok
    current = {m.entity: m.text for m in mem.list(state=State.ACTIVE) if m.role == "state"}
    assert current["svc2"] == "Service 2 moved to q2." and current["svc4"] == "Service 4 runs in z4."
    assert (
        current["svc1"] == "Service 1 runs in r1."
        and current[f"svc{2 * n - 2}"] == f"Service {2 * n - 2} runs in z{2 * n - 2}."
    )
    mem.close()


def test_the_prefetch_replaces_the_per_fact_key_reads(
    store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted in SQLite's own trace of the statements (on PostgreSQL: the statements ``run`` is given)."""
    _key_reads(store_location, monkeypatch, 40, sqlite_trace=True)


def test_a_batch_of_more_keys_than_one_statement_holds(
    store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    _key_reads(store_location, monkeypatch, 310, sqlite_trace=False)


def test_prefetch_statements_are_a_few_texts_and_read_each_key_once(
    store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each prefetch statement names a power of two of keys (at most 300: its chunk's last key repeated), so the
    statements of batches of any size are among nine texts, each prepared once per connection; the view holds
    every key's rows once, as the key's own read gives them."""
    mem = ReMem(store_location("s"))
    facts = [MemoryInput(f"Service {i} runs in r{i}.", f"svc{i}", "region", timestamp=DAY) for i in range(700)]
    facts += [
        MemoryInput(f"Service {i} moved to q{i}.", f"svc{i}", "region", timestamp=2 * DAY) for i in range(0, 700, 3)
    ]
    mem.add_many(facts)
    texts: set[str] = set()
    for n in (1, 3, 5, 250, 301, 700):
        keys = [("default", f"svc{i}", "region") for i in range(n)] + [("default", "nobody", "region")]
        with mem.store.write() as tx:
            run = tx.run

            def seen(sql: str, args: Any = (), run: Any = run) -> Any:
                if PREFETCH in sql:
                    assert len(args) // 3 in {1, 2, 4, 8, 16, 32, 64, 128, 256, 300}
                    texts.add(sql)
                return run(sql, args)

            monkeypatch.setattr(tx, "run", seen)
            tx.prefetch_keys(keys)
            view = tx.key_view
            assert view is not None
            for _, entity, attribute in keys:
                tx.key_view = view
                held = (tx.current_for_key(entity, attribute), tx.claims_at(entity, attribute, "state", DAY, "default"))
                tx.key_view = None
                assert held == (
                    tx.current_for_key(entity, attribute),
                    tx.claims_at(entity, attribute, "state", DAY, "default"),
                )
    assert len(texts) <= 9
    mem.close()
