"""Erasure: a memory, a filter's matches or a whole scope erased on both backends, with nothing of the text
left in any file of the store or its traces, ``verify()`` passing and other memories' history intact; bad
requests refused before anything is written; a kill in the middle leaves all or nothing."""

from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import os
import signal
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ledger_dump import dump_ledger

from remem_agent import ReMem
from remem_agent.agent.trace import TraceWriter
from remem_agent.errors import UnknownMemoryError, UserInputError
from remem_agent.store import pending
from remem_agent.store.pending import PendingRecord
from remem_agent.trace_io import remove_lines
from remem_agent.types import State

SECRET = "zqx-secret-token-4242-unique"
LEAK = f"Our server moved to west-2; the admin password is {SECRET}."


def _files_holding(folder: Path, needle: bytes) -> list[str]:
    hits = []
    for f in sorted(folder.rglob("*")):
        try:
            if f.is_file() and needle in f.read_bytes():
                hits.append(str(f.relative_to(folder)))
        except PermissionError:  # a PostgreSQL data folder may hold files only its server reads
            continue
    return hits


def _world(mem: ReMem) -> dict[str, str]:
    """A fact, the fact that replaces it (holding the secret), a fact replacing that one, and others."""
    ids = {
        "old": mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp="2026-01-05"),
        "leak": mem.add(LEAK, entity="server", attribute="region", timestamp="2026-03-01"),
        "office": mem.add("The office moved to Lisbon on 2026-02-10.", entity="office", attribute="city"),
        "other": mem.add(f"Bob's note: {SECRET} must never be shared.", scope="user:bob", role="note"),
    }
    return ids


def _trace(folder: Path, ids: dict[str, str]) -> Path:
    """A trace folder with a live file and a compressed archive, lines naming the leak or not."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(folder / "agent.jsonl")
    writer.write_sync({"kind": "chat", "served": [{"id": ids["leak"], "text": LEAK}], "answer_id": "a1"})
    writer.write_sync({"kind": "chat", "served": [{"id": ids["office"], "text": "office"}], "answer_id": "a2"})
    writer.write_sync({"kind": "chat", "messages": [{"role": "user", "content": f"remember: {LEAK}"}]})
    with gzip.open(folder / "agent.20260101T000000000000Z.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"kind": "capture", "memories": [ids["leak"]]}) + "\n")
        fh.write(json.dumps({"kind": "capture", "memories": [ids["office"]]}) + "\n")
    return folder


def test_erasing_a_memory_leaves_no_byte_of_it_in_the_sqlite_files_or_traces(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with ReMem(store, embedder="hash") as mem:
        ids = _world(mem)
        traces = _trace(store / "traces", ids)
        mem.search("where is the server?", k=3)
        replaced_before = mem.get(ids["old"])
        report = mem.erase(ids["leak"])
        # nothing of the leak in any file: ledger, WAL (emptied), marker, traces, archives (bob's own note
        # holds the secret too: that is another user's data)
        assert _files_holding(store, b"the admin password is") == []
        assert _files_holding(store, b"west-2") == []
        assert report.erased == (ids["leak"],) and report.scrub is not None and report.scrub.complete
        assert report.trace_lines_removed == 3 and report.trace_files_rewritten == 2
        lines = [json.loads(x) for x in (traces / "agent.jsonl").read_text().splitlines()]
        assert [x["answer_id"] for x in lines] == ["a2"]  # the other lines are kept
        assert mem.verify().ok, mem.verify().problems
        gone = mem.get(ids["leak"])
        assert (gone.state, gone.text, gone.original_text, gone.entity, gone.attribute) == (
            State.ERASED,
            "",
            "",
            None,
            None,
        )
        # the replaced fact's history is intact: still replaced by the erased one, at the same time
        old = mem.get(ids["old"])
        assert (old.state, old.superseded_by, old.valid_to) == (
            replaced_before.state,
            replaced_before.superseded_by,
            replaced_before.valid_to,
        )
        history = mem.inspect(ids["old"]).history
        assert [e.kind for e in history] == ["add", "invalidate"] and history[1].evidence["by"] == ids["leak"]
        assert "west-2" not in json.dumps([e.reason for e in history] + [dict(e.evidence) for e in history])
        kinds = [e.kind for e in mem.inspect(ids["leak"]).history]
        assert kinds[-1] == "erase" and all(e.reason == "[erased]" for e in mem.inspect(ids["leak"]).history[:-1])
        # never served again, not even to an as_of search of the time it held
        assert ids["leak"] not in [h.id for h in mem.search("admin password", k=5).items]
        assert ids["leak"] not in [h.id for h in mem.search("server region", k=5, as_of="2026-04-01").items]
        # another scope's note holding the same secret is another user's data: untouched
        assert SECRET in mem.get(ids["other"]).text
    with ReMem(store, embedder="hash") as mem:
        assert mem.verify().ok and mem.get(ids["leak"]).state is State.ERASED
    assert _files_holding(store, b"west-2") == []


def test_without_the_scrub_the_bytes_are_still_in_the_file(tmp_path: Path) -> None:
    """What the scrub is for (and proof that the byte search above can fail)."""
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        ids = _world(mem)
        report = mem.erase(ids["leak"], scrub=False)
        assert report.scrub is None and mem.get(ids["leak"]).text == ""
        assert _files_holding(tmp_path / "s", b"west-2") != []
        mem.erase(ids["leak"])  # again: already erased, the scrub runs now
        assert _files_holding(tmp_path / "s", b"west-2") == []


@pytest.fixture(scope="module")
def private_pg() -> Iterator[tuple[Any, Path]]:
    """A PostgreSQL server of this module alone, whose every file the test may search, with
    ``wal_recycle = off`` (a WAL segment no longer needed is deleted, not renamed for reuse)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="remem-pgrun-"))
    import pgserver
    import psycopg

    folder = Path(tempfile.mkdtemp(prefix="remem-pgerase-"))
    server = pgserver.get_server(folder, cleanup_mode="stop")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_recycle = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield server, folder
    finally:
        server.cleanup()


def test_erasing_a_memory_leaves_no_byte_of_it_in_the_postgres_files(private_pg: tuple[Any, Path]) -> None:
    import psycopg

    server, folder = private_pg
    with ReMem(server.get_uri(), embedder="hash") as mem:
        ids = _world(mem)
        mem.search("where is the server?", k=3)
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the rows are in the table files now, not only in the WAL
        assert any(f.startswith("base/") for f in _files_holding(folder, b"west-2"))
        report = mem.erase(ids["leak"])
        assert report.scrub is not None and report.scrub.complete, report.scrub
        assert _files_holding(folder, b"west-2") == []
        assert mem.verify().ok, mem.verify().problems
        assert mem.get(ids["old"]).superseded_by == ids["leak"]
        assert SECRET in mem.get(ids["other"]).text


def test_a_postgres_scrub_says_when_recycled_wal_may_keep_the_bytes(pg_url: str) -> None:
    with ReMem(pg_url, embedder="hash") as mem:
        ids = _world(mem)
        report = mem.erase(ids["leak"])
        assert report.scrub is not None and not report.scrub.complete
        assert "wal_recycle" in str(report.scrub.problem) and mem.verify().ok


@pytest.fixture()
def world(store_location: Any) -> Iterator[tuple[ReMem, dict[str, str]]]:
    with ReMem(store_location("s"), embedder="hash") as mem:
        yield mem, _world(mem)


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, UserInputError),  # names nothing
        (("m_nope",), {}, UnknownMemoryError),
        ((["LEAK", "m_nope"],), {}, UnknownMemoryError),  # one unknown: none erased
        (("LEAK",), {"scope": "user:bob"}, UnknownMemoryError),  # another scope's memory
        (("LEAK",), {"entity": "server"}, UserInputError),  # two ways of naming
        ((), {"whole_scope": True}, UserInputError),  # which scope?
        ((), {"contains": "abc"}, UserInputError),  # too short to be safe
        ((), {"role": "fact"}, UserInputError),
        ((), {"entity": ""}, UserInputError),
        (("LEAK",), {"reason": ""}, UserInputError),
        (("LEAK",), {"traces": ["/nonexistent/traces"]}, UserInputError),
        (("LEAK",), {"scope": "bad scope!"}, UserInputError),
        (("LEAK",), {"scrub": "yes"}, UserInputError),
        (([3],), {}, UserInputError),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(
    world: tuple[ReMem, dict[str, str]], args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    mem, ids = world
    args = tuple(
        [ids["leak"] if a == "LEAK" else a for a in x] if isinstance(x, list) else (ids["leak"] if x == "LEAK" else x)
        for x in args
    )
    before = dump_ledger(mem)
    with pytest.raises(error):
        mem.erase(*args, **kwargs)
    assert dump_ledger(mem) == before


def test_a_filter_erases_its_matches_and_contains_reaches_every_scope(world: tuple[ReMem, dict[str, str]]) -> None:
    mem, ids = world
    mem.search(f"is {SECRET} still valid?", scope="user:bob")  # a query quoting the secret
    report = mem.erase(contains=SECRET, scrub=False)
    assert set(report.erased) == {ids["leak"], ids["other"]} and report.searches_redacted == 1
    assert mem.get(ids["office"]).state is State.ACTIVE
    with mem.store.read() as tx:
        assert [r[0] for r in tx.run("SELECT query FROM searches WHERE scope = 'user:bob'")] == ["[erased]"]
    assert mem.erase(entity="office", scope="default", scrub=False).erased == (ids["office"],)
    assert mem.erase(entity="office", scrub=False).erased == ()  # nothing left to match
    assert mem.verify().ok, mem.verify().problems


def test_erasing_a_scope_takes_its_traffic_and_leaves_other_scopes_alone(
    world: tuple[ReMem, dict[str, str]],
) -> None:
    mem, ids = world
    mem.add("Alice prefers tea.", scope="user:alice", entity="alice", attribute="drink")
    mem.search("what does alice drink?", scope="user:alice")
    bob_sid = mem.search("bob's notes", scope="user:bob").search_id
    _put(mem, "ans-bob", "user:bob", bob_sid, [ids["other"]])
    alice_sid = mem.search("tea?", scope="user:alice").search_id
    _put(mem, "ans-alice", "user:alice", alice_sid, [])
    others = [r for r in _rows(mem) if r[-1] != "user:bob"]
    report = mem.erase(scope="user:bob", whole_scope=True, scrub=False)
    assert report.erased == (ids["other"],) and report.answers_dropped == 1 and report.searches_redacted == 1
    assert [r for r in _rows(mem) if r[-1] != "user:bob"] == others
    with mem.store.read() as tx:
        assert [r[0] for r in tx.run("SELECT answer_id FROM pending_outcomes")] == ["ans-alice"]
        assert {r[0] for r in tx.run("SELECT query FROM searches WHERE scope = 'user:bob'")} == {"[erased]"}
    assert mem.verify().ok, mem.verify().problems


def _put(mem: ReMem, answer_id: str, scope: str, search_id: str, served: list[str]) -> None:
    rec = PendingRecord(
        answer_id=answer_id,
        scope=scope,
        thread="conv:" + answer_id,
        turn="1",
        search_id=search_id,
        served_ids=tuple(served),
        cited_ids=(),
        used_ids=(),
        value="an answer",
        created_at=time.time(),
    )
    mem.store.transact(lambda tx: pending.put(tx, rec))


def _rows(mem: ReMem) -> list[Any]:
    """Memories, searches, waiting answers and events as comparable tuples, each ending in its scope."""
    with mem.store.read() as tx:
        return [
            *[tuple(r) for r in tx.run("SELECT id, text, state, content_hash, scope FROM memories ORDER BY seq")],
            *[tuple(r) for r in tx.run("SELECT search_id, query, hash, scope FROM searches ORDER BY search_id")],
            *[tuple(r) for r in tx.run("SELECT answer_id, value, scope FROM pending_outcomes ORDER BY answer_id")],
            *[
                tuple(r)
                for r in tx.run(
                    "SELECT e.seq, e.reason, e.hash, m.scope FROM events e JOIN memories m ON m.id = e.memory_id "
                    "ORDER BY e.seq"
                )
            ],
        ]


def test_feedback_after_erasure_still_credits_and_verifies(world: tuple[ReMem, dict[str, str]]) -> None:
    mem, ids = world
    res = mem.search("where is the server? admin password", k=4)
    served = [h.id for h in res.items]
    mem.erase(ids["leak"], scrub=False)
    receipt = mem.feedback(res.search_id, success=False, used_ids=served)
    assert receipt is not None and mem.verify().ok, mem.verify().problems
    assert mem.get(ids["leak"]).state is State.ERASED


def test_an_erased_memory_never_changes_again(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mid = mem.add("A note to erase.", role="note")
        mem.erase(mid, scrub=False)
    conn = sqlite3.connect(tmp_path / "s" / "ledger.db")
    for sql in (
        "UPDATE memories SET text = 'back' WHERE id = ?",
        "UPDATE memories SET state = 'ACTIVE' WHERE id = ?",
        "DELETE FROM memories WHERE id = ?",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(sql, (mid,))
    # a live memory's immutable columns stay immutable, and events stay append-only
    live = conn.execute("SELECT id FROM memories WHERE state = 'ACTIVE'").fetchall()
    assert live == []
    conn.close()
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        keep = mem.add("A note to keep.", role="note")
    conn = sqlite3.connect(tmp_path / "s" / "ledger.db")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE memories SET original_text = 'x', state = 'ERASED', id = 'y' WHERE id = ?", (keep,))
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE memories SET original_text = 'x' WHERE id = ?", (keep,))
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE events SET reason = 'rewritten' WHERE memory_id = ?", (keep,))
    conn.close()


def test_a_trace_writer_loses_no_line_to_a_concurrent_scrub(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    n = 400

    def write() -> None:
        for i in range(n):
            writer.write_sync({"i": i, "drop": i % 2 == 0})

    t = threading.Thread(target=write)
    t.start()
    removed = 0
    while t.is_alive():
        removed += remove_lines(path, lambda line: '"drop": true' in line)
    t.join()
    removed += remove_lines(path, lambda line: '"drop": true' in line)
    kept = [json.loads(x)["i"] for x in path.read_text().splitlines()]
    assert kept == list(range(1, n, 2)) and removed == n // 2


def _erase_child(folder: str, ids: list[str], ready: Any) -> None:
    with ReMem(folder, embedder="hash") as mem:
        ready.set()
        mem.erase(ids, scrub=False)
    os._exit(0)


def test_a_kill_in_the_middle_of_an_erasure_leaves_all_or_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    with ReMem(folder, embedder="hash") as mem:
        ids = mem.add_many([{"text": f"Fact number {i} about {SECRET}.", "role": "note"} for i in range(600)])
    ctx = mp.get_context("fork")
    outcomes = set()
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8):
        ready = ctx.Event()
        child = ctx.Process(target=_erase_child, args=(str(folder), ids, ready))
        child.start()
        ready.wait(30)
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
        with ReMem(folder, embedder="hash") as mem:
            assert mem.verify().ok, mem.verify().problems
            states = {m.state for m in mem.list(role="note")}
            assert states in ({State.ACTIVE}, {State.ERASED}), states
            outcomes.add(states.pop())
            if State.ERASED in outcomes:
                break
    with ReMem(folder, embedder="hash") as mem:  # whatever the kills left, erasing again completes it
        report = mem.erase(ids)
        assert len(report.erased) + len(report.already_erased) == 600
        assert mem.verify().ok and _files_holding(folder, SECRET.encode()) == []


def test_a_short_contains_is_still_redacted_from_queries_and_traces(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mid = mem.add("The wifi key is k7q2z9.", role="note")
        mem.search("is k7q2z9 the wifi key?")
        trace = tmp_path / "t.jsonl"
        trace.write_text(json.dumps({"messages": [{"role": "user", "content": "it is k7q2z9"}]}) + "\n")
        report = mem.erase(contains="k7q2z9", traces=[trace])
        assert report.erased == (mid,) and report.searches_redacted == 1 and report.trace_lines_removed == 1
        assert _files_holding(tmp_path, b"k7q2z9") == []


def test_searches_after_an_erasure_skip_it_on_every_path(world: tuple[ReMem, dict[str, str]]) -> None:
    """A zero vector scores nothing: neither the exact scan (a small scope) nor the index serves it, and no
    score is NaN."""
    import math

    mem, ids = world
    mem.erase([ids["leak"], ids["old"]], scrub=False)
    for kwargs in ({}, {"as_of": "2026-02-01"}, {"as_of": "2026-04-01"}):
        res = mem.search("where is our server? admin password", k=10, **kwargs)
        assert not {ids["leak"], ids["old"]} & set(res.ids)
        assert all(math.isfinite(h.score) for h in res.items)
    assert mem.verify().ok


def test_the_cli_erases_and_refuses_bad_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from remem_agent.cli import main

    store = tmp_path / "s"
    with ReMem(store, embedder="hash") as mem:
        ids = _world(mem)
        before = dump_ledger(mem)
    for argv in (
        ["erase", str(store), "m_nope"],  # unknown id
        ["erase", str(store), ids["leak"], "--scope", "user:bob"],  # another scope's memory
        ["erase", str(store)],  # names nothing
        ["erase", str(store), "--contains", "ab"],  # too short
        ["erase", str(store), "--whole-scope"],  # which scope?
        ["erase", str(store), ids["leak"], "--traces", str(tmp_path / "missing")],
    ):
        assert main(argv) == 2, argv
        assert "remem: error:" in capsys.readouterr().err
    with ReMem(store, embedder="hash") as mem:
        assert dump_ledger(mem) == before
    assert main(["erase", str(store), ids["leak"], "--reason", "ticket 12"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["erased"] == [ids["leak"]] and report["scrub"]["complete"] is True
    assert main(["erase", str(store), "--whole-scope", "--scope", "user:bob", "--no-scrub"]) == 0
    assert json.loads(capsys.readouterr().out)["erased"] == [ids["other"]]
    with ReMem(store, embedder="hash") as mem:
        assert mem.verify().ok and mem.inspect(ids["leak"]).history[-1].reason == "ticket 12"
    assert _files_holding(store, b"west-2") == []


def test_an_erasure_drops_the_waiting_answers_that_served_it_and_no_other(
    world: tuple[ReMem, dict[str, str]],
) -> None:
    mem, ids = world
    sid = mem.search("where is the server?").search_id
    _put(mem, "ans-leak", "default", sid, [ids["old"], ids["leak"]])
    _put(mem, "ans-office", "default", sid, [ids["office"]])
    report = mem.erase(ids["leak"], scrub=False)
    assert report.answers_dropped == 1
    with mem.store.read() as tx:
        assert [r[0] for r in tx.run("SELECT answer_id FROM pending_outcomes")] == ["ans-office"]
    assert mem.verify().ok


def test_an_erasure_empties_the_rankings_memo_of_folded_texts(world: tuple[ReMem, dict[str, str]]) -> None:
    """Search folds each pooled text (case and blanks) once and memoises it; erasing must not leave a text there."""
    from remem_agent.ranking import select

    mem, ids = world
    mem.search("where is our server? admin password", k=10)
    assert len(select._MEMO) > 0
    mem.erase([ids["leak"]], scrub=False)
    assert len(select._MEMO) == 0


def test_the_trace_line_filter_by_hand() -> None:
    """A line goes when it names an erased id anywhere in its JSON (a key or a value, nested) or quotes an erased
    text, as written or JSON-escaped; another line stays, and so does a line that only contains an id as part of
    a longer string."""
    from remem_agent.erasure import line_filter
    from remem_agent.store.erasure import Erased

    drop = line_filter(Erased(memories=("m_1",), texts=frozenset({'the "vault" code 4711'}), search_ids=frozenset()))
    assert drop(json.dumps({"served": [{"id": "m_1"}]}))
    assert drop(json.dumps({"credit": {"m_1": 0.5}}))
    assert drop(json.dumps({"prompt": 'the "vault" code 4711 is here'}))  # escaped quotes in JSON
    assert not drop(json.dumps({"served": [{"id": "m_12"}], "text": "another"}))
    assert drop("plain text naming m_1")  # not JSON: by substring
    assert not line_filter(Erased())(json.dumps({"served": [{"id": "m_1"}]}))
