"""``remem-mcp`` end to end: a real server subprocess driven by the official MCP client over stdio."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from remem_agent import ReMem

TOOLS = {"remember", "recall", "feedback", "inspect", "list_memories", "stats", "erase"}


def _console_script() -> Path | None:
    script = Path(sys.executable).parent / ("remem-mcp.exe" if sys.platform == "win32" else "remem-mcp")
    return script if script.is_file() else None


@asynccontextmanager
async def _session(
    store: Path, *, command: str | None = None, args: list[str] | None = None, **env: str
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=command or sys.executable,
        args=["-m", "remem_agent.integrations.mcp_server"] if args is None else args,
        env={"REMEM_PATH": str(store), "REMEM_EMBEDDER": "hash", **env},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _ok(session: ClientSession, name: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await session.call_tool(name, args)
    assert not res.is_error, f"{name}({args}) failed: {res.content}"
    out = res.structured_content
    assert isinstance(out, dict)
    return out


async def _err(session: ClientSession, name: str, args: dict[str, Any]) -> str:
    res = await session.call_tool(name, args)
    assert res.is_error, f"{name}({args}) should have failed: {res.structured_content}"
    text = " ".join(getattr(c, "text", "") for c in res.content)
    assert text
    return text


def _ledger_feedback(store: Path, search_id: str) -> dict[str, Any]:
    with ReMem(store) as mem, mem.store.read() as tx:
        rec = tx.search(search_id)
    assert rec is not None and rec.feedback is not None
    fb: dict[str, Any] = dict(rec.feedback)
    return fb


def test_console_script_is_installed() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert eps.get("remem-mcp") == "remem_agent.integrations.mcp_server:main"


async def test_session_explicit_and_inferred_feedback_and_errors(tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with _session(store) as s:
        # -- the seven tools, each with a JSON input schema ----------------------------------
        listed = {t.name: t for t in (await s.list_tools()).tools}
        assert set(listed) == TOOLS
        for tool in listed.values():
            assert tool.input_schema["type"] == "object"
            assert tool.description
        rec_schema = listed["remember"].input_schema
        assert rec_schema["required"] == ["text"]
        assert rec_schema["properties"]["text"]["description"]
        assert set(rec_schema["properties"]) == {"text", "entity", "attribute", "role", "task", "timestamp"}
        assert set(listed["recall"].input_schema["properties"]) == {"query", "k", "task", "as_of", "token_budget"}
        assert set(listed["feedback"].input_schema["required"]) == {"search_id", "success"}

        # -- remember -> recall -> feedback -> inspect ------------------------------------------
        plan = await _ok(
            s, "remember", {"text": "Customer Acme is on the Pro plan.", "entity": "acme", "attribute": "plan"}
        )
        assert plan["state"] == "ACTIVE" and plan["new"] is True
        await _ok(s, "remember", {"text": "Acme prefers email over phone.", "role": "preference"})
        r1 = await _ok(s, "recall", {"query": "Which plan is Acme on?", "task": "support"})
        assert r1["search_id"].startswith("s_")
        assert plan["id"] in r1["ids"]
        top = r1["items"][0]
        assert {"id", "text", "score", "state", "validity"} <= set(top)
        fb = await _ok(s, "feedback", {"search_id": r1["search_id"], "success": True, "used_ids": [plan["id"]]})
        assert fb["credit"][plan["id"]] > 0 and fb["source"] == "api"
        info = await _ok(s, "inspect", {"memory_id": plan["id"]})
        assert info["state"] == "ACTIVE"
        assert info["credits"][0]["search_id"] == r1["search_id"] and info["credits"][0]["credit"] > 0

        # explicit feedback disables inference: the next recall does not re-score r1
        r2 = await _ok(s, "recall", {"query": "Which plan is Acme on?", "task": "support"})
        assert r2["inferred_feedback"] == []

        # -- weak success: a later recall for the same task, no correction in between -----------
        r3 = await _ok(s, "recall", {"query": "How does Acme want to be contacted?", "task": "support"})
        assert [i["search_id"] for i in r3["inferred_feedback"]] == [r2["search_id"]]
        assert r3["inferred_feedback"][0]["success"] is True
        assert r3["inferred_feedback"][0]["weight"] == pytest.approx(0.3)
        # the top-ranked memory of r2 counts as cited (0.5 x 0.3); the rest are plain exposures
        top = r2["items"][0]["id"]
        assert r3["inferred_feedback"][0]["credit"][top] == pytest.approx(0.15)
        # a recall for another task leaves r3 pending
        other = await _ok(s, "recall", {"query": "Which plan is Acme on?", "task": "billing"})
        assert other["inferred_feedback"] == []

        # -- correction: remember supersedes a memory served by the pending recall `other` ------
        fix = await _ok(
            s, "remember", {"text": "Customer Acme is on the Enterprise plan.", "entity": "acme", "attribute": "plan"}
        )
        assert fix["supersedes"] == [plan["id"]]
        # `other` (billing) and r3 (support) both served the old plan and had no outcome yet
        failed = {i["search_id"]: i for i in fix["inferred_feedback"]}
        assert other["search_id"] in failed
        assert failed[other["search_id"]]["success"] is False
        assert failed[other["search_id"]]["blamed_ids"] == [plan["id"]]
        old = await _ok(s, "inspect", {"memory_id": plan["id"]})
        assert old["state"] == "INVALIDATED" and old["superseded_by"] == fix["id"]
        blamed = [c for c in old["credits"] if c["search_id"] == other["search_id"]]
        assert len(blamed) == 1 and blamed[0]["success"] is False and blamed[0]["blame"] > 0
        # the corrected recall is settled: a new billing recall infers nothing about it
        again = await _ok(s, "recall", {"query": "Which plan is Acme on?", "task": "billing"})
        assert again["inferred_feedback"] == []
        assert fix["id"] in again["ids"] and plan["id"] not in again["ids"]
        # explicit feedback after an inferred outcome is refused with a clear message
        msg = await _err(s, "feedback", {"search_id": other["search_id"], "success": True})
        assert "inferred" in msg

        # -- malformed calls: tool errors, and the server keeps serving --------------------------
        before = await _ok(s, "stats", {})
        assert "required" in (await _err(s, "remember", {})).lower()  # missing required arg
        assert "query" in await _err(s, "recall", {"k": 3})
        assert "k" in await _err(s, "recall", {"query": "plan", "k": "lots"})  # wrong type
        await _err(s, "remember", {"text": 42})
        await _err(s, "feedback", {"search_id": again["search_id"], "success": "yes"})
        await _err(s, "remember", {"text": "x", "role": "fact"})  # not one of the roles
        await _err(s, "recall", {"query": "plan", "as_of": "not a date"})
        assert "unknown search_id" in await _err(s, "feedback", {"search_id": "s_nope", "success": True})
        assert "unknown memory id" in await _err(s, "inspect", {"memory_id": "m_nope"})
        # ids that were not served by that search: rejected, and the recall stays pending
        assert "not served" in await _err(
            s, "feedback", {"search_id": again["search_id"], "success": True, "used_ids": ["m_nope"]}
        )
        await _err(s, "list_memories", {"state": "GONE"})
        after = await _ok(s, "stats", {})
        assert {k: after[k] for k in ("memories", "searches", "feedbacks")} == {
            k: before[k] for k in ("memories", "searches", "feedbacks")
        }
        # a valid call still works, and the failed feedback did not disable inference for `again`
        ok = await _ok(s, "feedback", {"search_id": again["search_id"], "success": True, "used_ids": [fix["id"]]})
        assert ok["credit"][fix["id"]] > 0
        listed_mem = await _ok(s, "list_memories", {"state": "INVALIDATED"})
        assert [m["id"] for m in listed_mem["memories"]] == [plan["id"]]
        assert after["auto_feedback"] is True

    # -- the ledger records the inferred outcomes as such ----------------------------------------
    weak = _ledger_feedback(store, r2["search_id"])
    assert weak["success"] is True and weak["source"] == "inferred" and weak["weight"] == pytest.approx(0.3)
    failure = _ledger_feedback(store, other["search_id"])
    assert failure["success"] is False and failure["source"] == "inferred" and failure["used"] == [plan["id"]]
    assert "source" not in _ledger_feedback(store, r1["search_id"])  # explicit: source "api"
    with ReMem(store) as mem:
        assert mem.verify().ok


async def test_auto_feedback_off_via_console_script(tmp_path: Path) -> None:
    script = _console_script()
    command: str | None = str(script) if script else None
    args: list[str] | None = [] if script else None
    store = tmp_path / "store"
    async with _session(store, command=command, args=args, REMEM_AUTO_FEEDBACK="0") as s:
        old = await _ok(s, "remember", {"text": "The office is in Berlin.", "entity": "office", "attribute": "city"})
        r1 = await _ok(s, "recall", {"query": "Where is the office?", "task": "t"})
        assert old["id"] in r1["ids"]
        fix = await _ok(s, "remember", {"text": "The office is in Munich.", "entity": "office", "attribute": "city"})
        assert fix["supersedes"] == [old["id"]] and fix["inferred_feedback"] == []
        r2 = await _ok(s, "recall", {"query": "Where is the office?", "task": "t"})
        assert r2["inferred_feedback"] == []
        assert (await _ok(s, "stats", {}))["auto_feedback"] is False
    with ReMem(store) as mem, mem.store.read() as tx:
        rec = tx.search(r1["search_id"])
        assert rec is not None and rec.feedback is None


async def test_a_restarted_server_settles_the_previous_sessions_recall(tmp_path: Path) -> None:
    """Clients start a server process per session: the waiting recall is in the ledger, not the process."""
    store = tmp_path / "store"
    async with _session(store) as s:
        old = await _ok(s, "remember", {"text": "The office is in Berlin.", "entity": "office", "attribute": "city"})
        r1 = await _ok(s, "recall", {"query": "Where is the office?", "task": "travel"})
        assert old["id"] in r1["ids"]
    async with _session(store) as s:
        assert (await _ok(s, "stats", {}))["pending_recalls"] == 1
        fix = await _ok(s, "remember", {"text": "The office is in Munich.", "entity": "office", "attribute": "city"})
        assert [i["search_id"] for i in fix["inferred_feedback"]] == [r1["search_id"]]
        assert (await _ok(s, "stats", {}))["pending_recalls"] == 0
    failure = _ledger_feedback(store, r1["search_id"])
    assert failure["success"] is False and failure["source"] == "inferred" and failure["used"] == [old["id"]]
    with ReMem(store) as mem:
        assert mem.verify().ok


async def test_erase_forgets_a_memory_of_its_own_scope_only(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with ReMem(store, embedder="hash") as mem:
        other = mem.add("Bob's locker code is 4711-9931.", scope="user:bob")
    async with _session(store, REMEM_SCOPE="user:alice") as s:
        leak = await _ok(s, "remember", {"text": "Alice's card PIN is 8842-0017.", "role": "note"})
        kept = await _ok(s, "remember", {"text": "Alice likes green tea.", "role": "preference"})
        assert leak["id"] in (await _ok(s, "recall", {"query": "Alice's card PIN"}))["ids"]
        done = await _ok(s, "erase", {"memory_ids": [leak["id"]], "reason": "user asked"})
        assert done["erased"] == [leak["id"]] and done["scrub"]["complete"] is True
        after = await _ok(s, "recall", {"query": "Alice's card PIN"})
        assert leak["id"] not in after["ids"] and kept["id"] in after["ids"]
        assert (await _ok(s, "inspect", {"memory_id": leak["id"]}))["state"] == "ERASED"
        # another scope's memory is unknown here; an empty list is refused by the schema
        assert "UnknownMemoryError" in await _err(s, "erase", {"memory_ids": [other]})
        await _err(s, "erase", {"memory_ids": []})
    with ReMem(store) as mem:
        assert mem.get(other).text.startswith("Bob's locker") and mem.verify().ok
        assert b"8842-0017" not in (store / "ledger.db").read_bytes()
