"""Scopes: a search never serves another scope's memory; keys, supersession and statistics are per scope;
the shared scope is read by all only when configured; old stores move into the default scope (migration 4).
On SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _sqlite_downgrades
import pytest
from _sqlite_downgrades import SQLITE_7_TO_6
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remem_agent import (
    ReMem,
    RememConfig,
    RememError,
    State,
    UnknownMemoryError,
    UnknownSearchError,
    UserInputError,
)
from remem_agent.adapters import FunctionChatModel
from remem_agent.agent import MemoryAgent
from remem_agent.store.migrations import LATEST

StoreLocation = Callable[[str], "str | Path"]
SCOPES = ["user:alice", "user:bob", "user:carol/agent:ops", "default", "run:7"]


def test_each_scope_sees_its_own_facts_and_supersedes_only_its_own(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        a_old = mem.add(
            "Our server is in east-1.", entity="server", attribute="region", timestamp=1, scope="user:alice"
        )
        b = mem.add("Our server is in ap-1.", entity="server", attribute="region", timestamp=2, scope="user:bob")
        a_new = mem.add(
            "Our server moved to west-2.", entity="server", attribute="region", timestamp=3, scope="user:alice"
        )
        assert mem.get(a_old).state is State.INVALIDATED  # alice's own fact was replaced ...
        assert mem.get(b).state is State.ACTIVE  # ... bob's same key was not touched
        alice = mem.search("Where is our server?", scope="user:alice")
        bob = mem.search("Where is our server?", scope="user:bob")
        assert alice.ids == [a_new] and bob.ids == [b] and alice.scope == "user:alice"
        assert mem.search("Where is our server?").ids == []  # the default scope holds nothing
        assert [m.id for m in mem.list(scope="user:bob")] == [b] and len(mem.list()) == 3
        assert mem.stats(scope="user:alice").memories == 2 and mem.stats().memories == 3
        with pytest.raises(UnknownSearchError):  # bob cannot judge alice's search
            mem.feedback(alice.search_id, success=True, scope="user:bob")
        with pytest.raises(UnknownMemoryError):
            mem.inspect(a_new, scope="user:bob")
        mem.feedback(alice.search_id, success=True, used_ids=[a_new], scope="user:alice")
        assert mem.inspect(a_new, scope="user:alice").stats["*"].credited == 1
        assert mem.verify().ok


def test_the_shared_scope_is_read_by_all_only_when_configured(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=RememConfig(shared_scope="shared")) as mem:
        team = mem.add("The office wifi password rotates monthly.", role="note", scope="shared")
        mine = mem.add("My desk is 4B.", role="note", scope="user:alice")
        assert set(mem.search("wifi and desk", scope="user:alice", k=5).ids) == {team, mine}
        assert mem.search("wifi and desk", scope="user:bob", k=5).ids == [team]
    with ReMem(tmp_path / "s") as mem:  # without shared_scope: nobody else reads it
        assert mem.search("wifi and desk", scope="user:bob", k=5).ids == []


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "user\n", 5, "\ud800"])
def test_bad_scope_names_are_refused_and_change_nothing(tmp_path: Path, bad: Any) -> None:
    with ReMem(tmp_path / "s") as mem:
        before = mem.stats()
        for call in (
            lambda: mem.add("fact", scope=bad),
            lambda: mem.search("fact", scope=bad),
            lambda: mem.list(scope=bad),
            lambda: mem.add_many([{"text": "x", "scope": bad}]),
        ):
            with pytest.raises(UserInputError, match="scope"):
                call()
        with pytest.raises(UserInputError, match="differs"):
            mem.add_many([{"text": "x", "scope": "user:bob"}], scope="user:alice")
        assert mem.stats() == before


OPS = st.lists(
    st.tuples(
        st.sampled_from(["add_key", "add_note", "search", "feedback"]),
        st.sampled_from(SCOPES),
        st.sampled_from(["region", "owner", "port"]),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_random_operations_in_several_scopes_never_leak(store_location: StoreLocation) -> None:
    counter = iter(range(10**6))

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(OPS)
    def prop(ops: list[tuple[str, str, str, int]]) -> None:
        with ReMem(store_location(f"p{next(counter)}")) as mem:
            owner: dict[str, str] = {}
            last: dict[str, Any] = {}
            for t, (op, scope, attr, val) in enumerate(ops, 1):
                if op == "add_key":
                    mid = mem.add(
                        f"The {attr} of the service is value-{val} ({scope}).",
                        entity="service", attribute=attr, timestamp=t, scope=scope,
                    )  # fmt: skip
                    owner[mid] = scope
                elif op == "add_note":
                    owner[mem.add(f"A note about {attr} number {val}.", role="note", timestamp=t, scope=scope)] = scope
                elif op == "search":
                    res = mem.search(f"What is the {attr} of the service?", scope=scope, k=5, now=t + 0.5)
                    assert all(owner[i] == scope for i in res.ids), "a search served another scope's memory"
                    last[scope] = res
                elif scope in last and last[scope].ids:
                    res = last.pop(scope)
                    mem.feedback(res.search_id, success=bool(val % 2), used_ids=res.ids[:1], scope=scope)
            for s in SCOPES:  # per scope: one current fact per key, and it is that scope's newest
                current = [m for m in mem.list(scope=s) if m.key and m.state is not State.INVALIDATED]
                keys = [m.key for m in current]
                assert len(keys) == len(set(keys))
            assert mem.verify().ok, mem.verify().problems

    prop()


_SQLITE_5_TO_4 = [  # migrations 7, 6, 5 undone (key index; pending outcomes; lexical index, speaker and session)
    *SQLITE_7_TO_6,
    "DROP TABLE pending_outcomes",
    "DROP TRIGGER memories_fts_insert",
    "DROP TRIGGER memories_fts_update",
    "DROP TRIGGER memories_conversation_fixed",
    "DROP TABLE memories_fts",
    "ALTER TABLE memories DROP COLUMN speaker",
    "ALTER TABLE memories DROP COLUMN session",
]
_SQLITE_4_TO_3 = [
    *_SQLITE_5_TO_4,
    "DROP TRIGGER memories_scope_fixed",
    "DROP TRIGGER searches_scope_fixed",
    "DROP INDEX memories_scope_key",
    "DROP INDEX memories_scope",
    "ALTER TABLE memories DROP COLUMN scope",
    "ALTER TABLE searches DROP COLUMN scope",
    "PRAGMA user_version = 3",
]


def test_migration_4_moves_an_old_sqlite_store_into_the_default_scope(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        old = mem.add("The billing service runs in us-east-1.", entity="billing", attribute="region", timestamp=1)
        new = mem.add("The billing service moved to eu-west-1.", entity="billing", attribute="region", timestamp=2)
        res = mem.search("Where does billing run?", now=3)
        mem.feedback(res.search_id, success=True, used_ids=[new])
        before = mem.stats()
        rows_before = [m.to_dict() for m in mem.list()]
    conn = sqlite3.connect(tmp_path / "s" / "ledger.db")
    _sqlite_downgrades.downgrade(conn, _SQLITE_4_TO_3)  # the schema exactly as version 3 left it
    conn.close()
    with ReMem(tmp_path / "s") as mem:
        assert mem.stats() == before and mem.stats().schema_version == LATEST
        assert [m.to_dict() for m in mem.list()] == rows_before  # every row kept, each now in "default"
        assert {m.scope for m in mem.list()} == {"default"}
        assert mem.get(old).state is State.INVALIDATED and mem.search("Where does billing run?", now=3).ids == [new]
        assert mem.verify().ok
        with pytest.raises(RememError, match="immutable"):  # a memory's scope never changes
            mem.store.transact(lambda tx: tx.run("UPDATE memories SET scope = 'user:x'"))


async def test_chat_scopes_recall_conversations_and_verdicts(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add("Alice's server is in west-2.", entity="server", attribute="region", scope="user:alice")
        mem.add("Bob's server is in ap-1.", entity="server", attribute="region", scope="user:bob")
        agent = MemoryAgent(mem, FunctionChatModel(lambda req: "ok [M1]"), trace=False)
        msgs = [{"role": "user", "content": "Where is my server?"}]
        a = await agent.chat(msgs, scope="user:alice")
        b = await agent.chat(msgs, scope="user:bob")  # the same words: another conversation, another memory
        assert [h.text for h in a.served] == ["Alice's server is in west-2."]
        assert [h.text for h in b.served] == ["Bob's server is in ap-1."] and a.answer_id != b.answer_id
        with pytest.raises(UnknownSearchError):
            await agent.feedback(a.answer_id, success=False, scope="user:bob")
        receipt = await agent.feedback(a.answer_id, success=True, scope="user:alice")
        assert receipt.source == "user"


def test_cli_stats_ledger_and_dashboard_take_a_scope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from remem_agent.cli import main

    with ReMem(tmp_path / "s") as mem:
        mem.add("Alice likes tea.", role="preference", scope="user:alice")
        mem.add("Bob likes coffee.", role="preference", scope="user:bob")
        mem.add("Bob's desk is 4B.", role="note", scope="user:bob")
    assert main(["stats", str(tmp_path / "s"), "--scope", "user:bob"]) == 0
    assert json.loads(capsys.readouterr().out)["memories"] == 2
    assert main(["ledger", str(tmp_path / "s"), "--list", "--scope", "user:alice", "--json"]) == 0
    assert [m["text"] for m in json.loads(capsys.readouterr().out)] == ["Alice likes tea."]
    out = tmp_path / "d.html"
    assert main(["dashboard", str(tmp_path / "s"), "-o", str(out), "--scope", "user:alice"]) == 0
    page = out.read_text()
    assert "Alice likes tea." in page and "Bob likes coffee." not in page
    assert main(["stats", str(tmp_path / "s"), "--scope", "not a scope"]) != 0


def test_mcp_tools_work_in_their_scope(tmp_path: Path) -> None:
    from remem_agent.integrations.mcp_server import RememTools, open_from_env

    with ReMem(tmp_path / "s") as mem:
        alice, bob = RememTools(mem, scope="user:alice"), RememTools(mem, scope="user:bob")
        mine = alice.remember("My server is in west-2.", entity="server", attribute="region")["id"]
        bob.remember("My server is in ap-1.", entity="server", attribute="region")
        assert alice.recall("Where is my server?")["ids"] == [mine]
        assert mine not in bob.recall("Where is my server?")["ids"]
        with pytest.raises(RememError):
            bob.inspect(mine)
        assert alice.stats()["memories"] == 1 and len(bob.list_memories()["memories"]) == 1
    with pytest.raises(UserInputError, match="scope"):
        open_from_env({"REMEM_PATH": str(tmp_path / "t"), "REMEM_SCOPE": "no spaces allowed"})
