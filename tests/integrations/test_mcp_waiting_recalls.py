"""The MCP server's waiting recalls are ledger rows: inference survives a restart and is shared by processes.

Each ``RememTools`` here opens its own ``ReMem`` on one store, as two ``remem-mcp`` processes do (a client
starts one per session); both backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from remem_agent import ReMem
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.errors import UserInputError
from remem_agent.integrations.mcp_tools import RememTools, thread_of
from remem_agent.store import pending
from tests.conftest import StoreLocation


@contextmanager
def _server(location: str | Path, **kwargs: Any) -> Iterator[RememTools]:
    with ReMem(location, embedder=ConceptHashEmbedder()) as mem:
        yield RememTools(mem, **kwargs)


def _feedback(location: str | Path, search_id: str) -> Any:
    with ReMem(location, embedder=ConceptHashEmbedder()) as mem, mem.store.read() as tx:
        rec = tx.search(search_id)
    assert rec is not None
    return rec.feedback


def test_a_correction_in_the_next_session_settles_the_last_sessions_recall(store_location: StoreLocation) -> None:
    loc = store_location("s")
    with _server(loc) as first:
        old = first.remember("The office is in Berlin.", entity="office", attribute="city")["id"]
        r1 = first.recall("Where is the office?", task="travel")
        assert old in r1["ids"]
        assert first.pending_recalls() == [r1["search_id"]]
        assert first.stats()["pending_recalls"] == 1
    # the client closed the session; a new server process starts for the next one
    with _server(loc) as second:
        assert second.pending_recalls() == [r1["search_id"]]
        fix = second.remember("The office is in Munich.", entity="office", attribute="city")
        assert fix["supersedes"] == [old]
        [failed] = fix["inferred_feedback"]
        assert failed["search_id"] == r1["search_id"] and failed["success"] is False
        assert failed["blamed_ids"] == [old]
        assert second.pending_recalls() == []
        # settled: the next recall for the task infers nothing about r1
        assert second.recall("Where is the office?", task="travel")["inferred_feedback"] == []
    fb = _feedback(loc, r1["search_id"])
    assert fb["success"] is False and fb["source"] == "inferred" and fb["used"] == [old]


def test_the_next_session_continues_a_task_thread(store_location: StoreLocation) -> None:
    loc = store_location("s")
    with _server(loc) as first:
        first.remember("Acme is on the Pro plan.", entity="acme", attribute="plan")
        r1 = first.recall("Which plan is Acme on?", task="support")
    with _server(loc) as second:
        r2 = second.recall("Which plan is Acme on?", task="support")
        [weak] = r2["inferred_feedback"]
        assert weak["search_id"] == r1["search_id"] and weak["success"] is True
        assert weak["weight"] == pytest.approx(0.3)
        # another task's thread is its own
        r3 = second.recall("Which plan is Acme on?", task="billing")
        assert r3["inferred_feedback"] == []
        assert second.pending_recalls() == [r3["search_id"], r2["search_id"]]
    assert _feedback(loc, r1["search_id"])["source"] == "inferred"


def test_explicit_feedback_in_one_process_disables_inference_in_another(store_location: StoreLocation) -> None:
    loc = store_location("s")
    with _server(loc) as a, _server(loc) as b:
        old = a.remember("Deploys are approved by ivan.", entity="deploys", attribute="approver")["id"]
        r1 = a.recall("Who approves deploys?", task="ops")
        # b answers r1 explicitly (the client reported back to another process)
        assert b.feedback(r1["search_id"], success=True, used_ids=[old])["source"] == "api"
        assert a.pending_recalls() == [] and b.pending_recalls() == []
        # neither a correction nor the next recall judges r1 again
        fix = a.remember("Deploys are approved by judy.", entity="deploys", attribute="approver")
        assert fix["inferred_feedback"] == []
        assert a.recall("Who approves deploys?", task="ops")["inferred_feedback"] == []
    assert "source" not in _feedback(loc, r1["search_id"])


def test_one_recall_is_judged_once_when_two_processes_infer(store_location: StoreLocation) -> None:
    loc = store_location("s")
    with _server(loc) as a, _server(loc) as b:
        old = a.remember("Region is us-east-1.", entity="svc", attribute="region")["id"]
        r1 = a.recall("Which region?", task="ops")
        # b moves on in the same task thread: r1 is a weak success, judged by b
        r2 = b.recall("Which region?", task="ops")
        assert [i["search_id"] for i in r2["inferred_feedback"]] == [r1["search_id"]]
        # a's correction finds r1 judged and blames only r2, which also served the old fact
        fix = a.remember("Region is eu-west-1.", entity="svc", attribute="region")
        assert [i["search_id"] for i in fix["inferred_feedback"]] == [r2["search_id"]]
        assert fix["inferred_feedback"][0]["blamed_ids"] == [old]
        with a.memory.store.read() as tx:
            rows = tx.run(
                "SELECT answer_id, claimed_by FROM pending_outcomes WHERE thread = ? ORDER BY seq",
                (thread_of("default", "ops"),),
            ).fetchall()
        assert [r[0] for r in rows] == [r1["search_id"], r2["search_id"]]
        assert all(str(r[1]).startswith("mcp-") for r in rows)


def test_a_refused_feedback_leaves_the_recall_waiting(store_location: StoreLocation) -> None:
    loc = store_location("s")
    with _server(loc) as tools:
        old = tools.remember("The office is in Berlin.", entity="office", attribute="city")["id"]
        r1 = tools.recall("Where is the office?", task="travel")
        with pytest.raises(UserInputError, match="not served"):
            tools.feedback(r1["search_id"], success=True, used_ids=["m_nope"])
        assert tools.pending_recalls() == [r1["search_id"]]
        with tools.memory.store.read() as tx:
            [row] = tx.run(
                "SELECT claimed_at, claimed_by FROM pending_outcomes WHERE answer_id = ?", (r1["search_id"],)
            ).fetchall()
        assert tuple(row) == (None, None)
        fix = tools.remember("The office is in Munich.", entity="office", attribute="city")
        assert [i["search_id"] for i in fix["inferred_feedback"]] == [r1["search_id"]]
        assert fix["inferred_feedback"][0]["blamed_ids"] == [old]


def test_scopes_and_other_threads_are_left_alone(store_location: StoreLocation) -> None:
    loc = store_location("s")
    with _server(loc, scope="user:alice") as alice, _server(loc, scope="user:bob") as bob:
        alice.remember("My server is in west-2.", entity="server", attribute="region")
        bob.remember("My server is in ap-1.", entity="server", attribute="region")
        ra = alice.recall("Where is my server?", task="ops")
        bob.recall("Where is my server?", task="ops")
        # a waiting answer of another kind of thread (a MemoryAgent's), on a memory alice's recall served
        with alice.memory.store.read() as tx:
            search = tx.search(ra["search_id"])
        assert search is not None
        agent_row = pending.PendingRecord(
            answer_id="a_agent",
            scope="user:alice",
            thread="task:user:alice|ops",
            turn="",
            search_id=ra["search_id"],
            served_ids=tuple(ra["ids"]),
            cited_ids=tuple(ra["ids"]),
            used_ids=(),
            value=None,
            created_at=1.0,
        )
        alice.memory.store.transact(lambda tx: pending.put(tx, agent_row))
        assert alice.stats()["pending_recalls"] == 1 and bob.stats()["pending_recalls"] == 1
        fix = alice.remember("My server is in east-1.", entity="server", attribute="region")
        assert [i["search_id"] for i in fix["inferred_feedback"]] == [ra["search_id"]]
        assert bob.stats()["pending_recalls"] == 1  # bob's recall is bob's
        with alice.memory.store.read() as tx:
            assert [r.answer_id for r in pending.waiting(tx)] == ["a_agent", *bob.pending_recalls()]


def test_auto_feedback_off_writes_no_waiting_rows(tmp_path: Path) -> None:
    with _server(tmp_path / "s", auto_feedback=False) as tools:
        tools.remember("The office is in Berlin.", entity="office", attribute="city")
        tools.recall("Where is the office?", task="travel")
        with tools.memory.store.read() as tx:
            assert pending.count_waiting(tx) == 0
        assert tools.stats()["pending_recalls"] == 0


def test_waiting_filters(tmp_path: Path) -> None:
    """``waiting``/``count_waiting`` filter by scope and by an exact, case-sensitive thread prefix."""
    with ReMem(tmp_path / "s", embedder=ConceptHashEmbedder()) as mem:
        mem.add("x")
        sid = mem.search("x").search_id

        def row(answer_id: str, scope: str, thread: str) -> pending.PendingRecord:
            return pending.PendingRecord(
                answer_id=answer_id,
                scope=scope,
                thread=thread,
                turn="",
                search_id=sid,
                served_ids=(),
                cited_ids=(),
                used_ids=(),
                value=None,
                created_at=1.0,
            )

        for r in (row("1", "default", "mcp:a"), row("2", "default", "MCP:b"), row("3", "other", "mcp:c")):
            mem.store.transact(lambda tx, r=r: pending.put(tx, r))
        with mem.store.read() as tx:
            assert [r.answer_id for r in pending.waiting(tx, thread_prefix="mcp:")] == ["3", "1"]
            assert [r.answer_id for r in pending.waiting(tx, scope="default", thread_prefix="mcp:")] == ["1"]
            assert pending.count_waiting(tx, thread_prefix="mcp:") == 2
            assert pending.count_waiting(tx, scope="default") == 2
            assert pending.count_waiting(tx) == 3


def test_an_inferred_outcome_the_ledger_did_not_record_waits_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remem_agent.errors import StoreError

    with _server(tmp_path / "s") as tools:
        old = tools.remember("The office is in Berlin.", entity="office", attribute="city")["id"]
        r1 = tools.recall("Where is the office?", task="travel")

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("disk full")

        monkeypatch.setattr(tools.memory, "feedback", failing)
        fix = tools.remember("The office is in Munich.", entity="office", attribute="city")
        assert fix["supersedes"] == [old]  # the fact stands; inference says why it was skipped
        assert "StoreError" in fix["inferred_feedback"][0]["skipped"]
        assert tools.pending_recalls() == [r1["search_id"]]  # the claim was given back
        monkeypatch.undo()
        # the recall can still be judged, e.g. by the next recall of its task
        r2 = tools.recall("Where is the office?", task="travel")
        assert [i["search_id"] for i in r2["inferred_feedback"]] == [r1["search_id"]]
