"""``POST /v1/responses`` through the official ``openai`` client (and the OpenAI Agents SDK's Responses model),
against the gateway app in process with a local fake model: what reaches the model, stored responses and
``previous_response_id``, streaming events, tools, structured output, scopes and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _pg_downgrades
import _sqlite_downgrades
import httpx
import openai
import pytest
from _gateway import in_process_app, two_scope_memory
from _pg_downgrades import DOWNGRADE_8_TO_7
from _sqlite_downgrades import SQLITE_8_TO_7

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.adapters.base import ChatRequest, ChatResponse, ToolCall
from remem_agent.store import responses as stored

MODEL = "qwen2.5:0.5b"
ALICE, BOB = "sk-alice-000000000000001", "sk-bob-00000000000000002"
KEYS = {ALICE: ("user:alice",), BOB: ("user:bob",)}
QUESTION = "Where is our server hosted these days?"
PING = {
    "type": "function",
    "name": "ping",
    "description": "Ping the server of a region",
    "parameters": {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]},
}


def _reply(req: ChatRequest) -> str | ChatResponse:
    last = req.messages[-1]
    if req.tools and last.role == "user":
        return ChatResponse(
            text="", tool_calls=(ToolCall(id="call_1", name="ping", arguments='{"region": "west-2"}'),),
            finish_reason="tool_calls",
        )  # fmt: skip
    if req.json_schema is not None:
        return json.dumps({"region": "west-2"})
    if last.role == "tool":
        return f"The server answered: {last.content} [M1]."
    return "It is in west-2 [M1]."


mem = two_scope_memory  # tests/_gateway.py's store, as this module's ``mem`` fixture


def _app(mem: ReMem, tmp_path: Path, model: FunctionChatModel | None, **over: Any) -> Any:
    return in_process_app(mem, tmp_path, model, (MODEL,), **over)


def _client(app: Any, key: str = "x") -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return openai.AsyncOpenAI(base_url="http://gw/v1", api_key=key, http_client=http, max_retries=0)


def _answer(r: Any) -> str:
    return str(r.model_extra["remem"]["answer_id"])


@pytest.fixture()
def model() -> FunctionChatModel:
    return FunctionChatModel(_reply, name=MODEL)


async def test_a_response_with_memory_then_its_continuation(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel
) -> None:
    client = _client(_app(mem, tmp_path, model))
    try:
        raw = await client.responses.with_raw_response.create(model=MODEL, input=QUESTION, instructions="Be brief.")
        first = raw.parse()
        answer = raw.headers["x-remem-answer-id"]
        assert first.id.startswith(f"resp_{answer}-") and first.status == "completed"
        assert first.output_text == "It is in west-2 [M1]." and first.instructions == "Be brief."
        assert first.model_extra is not None and first.model_extra["remem"]["answer_id"] == answer
        sent = model.requests[-1].messages
        assert [m.role for m in sent] == ["system", "system", "user"]
        assert sent[0].content == "Be brief." and "west-2" in sent[1].content and sent[2].content == QUESTION
        assert first.usage is not None and first.usage.total_tokens >= 0

        second = await client.responses.create(
            model=MODEL, input="Thanks. And which team runs it?", previous_response_id=first.id, instructions="Short."
        )
        assert second.previous_response_id == first.id and second.id != first.id
        sent = model.requests[-1].messages
        # the stored conversation, then the new input; the earlier instructions are not carried over
        assert [(m.role, m.content) for m in sent if m.role != "system" or "memory" not in m.content] == [
            ("system", "Short."),
            ("user", QUESTION),
            ("assistant", "It is in west-2 [M1]."),
            ("user", "Thanks. And which team runs it?"),
        ]
        # the continuation settled the first answer (the user moved on): a later verdict conflicts
        with pytest.raises(openai.ConflictError):
            await client.post("/feedback", cast_to=httpx.Response, body={"answer_id": first.id, "success": False})
        # the second is still waiting: feedback names it by the response id
        ok = await client.post("/feedback", cast_to=httpx.Response, body={"answer_id": second.id, "success": True})
        assert ok.status_code == 200
    finally:
        await client.close()


async def test_previous_response_ids_are_kept_per_scope_and_store_false_keeps_none(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel
) -> None:
    app = _app(mem, tmp_path, model, keys=KEYS)
    alice, bob = _client(app, ALICE), _client(app, BOB)
    try:
        first = await alice.responses.create(model=MODEL, input=QUESTION)
        with pytest.raises(openai.NotFoundError):  # another scope's id is unknown, as one that never existed
            await bob.responses.create(model=MODEL, input="and?", previous_response_id=first.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.create(model=MODEL, input="and?", previous_response_id="resp_a_0000000000000000")
        unstored = await alice.responses.create(model=MODEL, input=QUESTION, store=False)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.create(model=MODEL, input="and?", previous_response_id=unstored.id)
        assert (await alice.responses.create(model=MODEL, input="and?", previous_response_id=first.id)).output_text
    finally:
        await alice.close()
        await bob.close()


async def test_a_streamed_response_sends_the_protocols_events(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel
) -> None:
    client = _client(_app(mem, tmp_path, model))
    try:
        stream = await client.responses.create(model=MODEL, input=QUESTION, stream=True)
        kinds, deltas, final = [], [], None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type == "response.completed":
                final = event.response
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
                "response.content_part.done", "response.output_item.done"} <= set(kinds)  # fmt: skip
        assert "".join(deltas) == "It is in west-2 [M1]." and len(deltas) > 2
        assert final is not None and final.output_text == "It is in west-2 [M1]." and final.status == "completed"
        assert final.model_extra is not None and final.model_extra["remem"]["citations"]
        # the streamed response is stored too: it can be continued
        nxt = await client.responses.create(model=MODEL, input="and since when?", previous_response_id=final.id)
        assert nxt.output_text
    finally:
        await client.close()


async def test_a_tool_call_round_trip_is_one_turn(mem: ReMem, tmp_path: Path, model: FunctionChatModel) -> None:
    client = _client(_app(mem, tmp_path, model))
    try:
        for stream in (False, True):
            if stream:
                events = [e async for e in await client.responses.create(
                    model=MODEL, input="Ping our server, please.", tools=[PING], stream=True)]  # type: ignore[arg-type]  # fmt: skip
                kinds = [e.type for e in events]
                assert "response.function_call_arguments.delta" in kinds
                assert "response.function_call_arguments.done" in kinds
                first = next(e.response for e in events if e.type == "response.completed")
            else:
                first = await client.responses.create(model=MODEL, input="Ping our server, please.", tools=[PING])  # type: ignore[arg-type]
            (call,) = first.output
            assert (
                call.type == "function_call"
                and call.name == "ping"
                and json.loads(call.arguments) == {"region": "west-2"}
            )
            assert model.requests[-1].tools[0].name == "ping"
            follow = [
                {"role": "user", "content": "Ping our server, please."},
                {"type": "function_call", "call_id": call.call_id, "name": "ping", "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "pong"},
            ]
            done = await client.responses.create(model=MODEL, input=follow, tools=[PING])  # type: ignore[arg-type]
            assert done.output_text == "The server answered: pong [M1]."
            # the agent loop's later call continues the turn: the same answer, a response of its own
            assert done.id != first.id and _answer(done) == _answer(first)
    finally:
        await client.close()


async def test_structured_output_by_text_format(mem: ReMem, tmp_path: Path, model: FunctionChatModel) -> None:
    client = _client(_app(mem, tmp_path, model))
    schema = {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]}
    try:
        r = await client.responses.create(
            model=MODEL,
            input=QUESTION,
            text={"format": {"type": "json_schema", "name": "where", "schema": schema, "strict": True}},
        )
        assert json.loads(r.output_text) == {"region": "west-2"}
        assert model.requests[-1].json_schema == schema
        assert r.model_extra is not None and r.model_extra["remem"]["schema_valid"] is True
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"input": QUESTION, "frobnicate": 1}, "frobnicate"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
        ({"input": QUESTION, "tools": [{"type": "web_search"}]}, "web_search"),
        ({"input": QUESTION, "background": True}, "background"),
        ({"input": []}, "input"),
        ({"input": QUESTION, "previous_response_id": "chatcmpl-x"}, "previous_response_id"),
        ({"input": QUESTION, "temperature": "hot"}, "temperature"),
        ({"input": QUESTION, "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "tool"),
    ],
)
async def test_bad_requests_are_400s_in_openais_shape_and_write_nothing(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel, body: dict[str, Any], where: str
) -> None:
    app = _app(mem, tmp_path, model)
    searches = mem.stats().searches
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        r = await http.post("/v1/responses", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code"} and where in err["message"], err
    assert mem.stats().searches == searches and not model.requests  # nothing recalled, nothing sent


def test_stored_responses_chain_expire_and_stay_in_their_scope(store_location: Any) -> None:
    mem = ReMem(store_location("s"))
    try:
        user = {"role": "user", "content": "hi"}
        mem.store.transact(lambda tx: stored.put(tx, response_id="resp_1", scope="a", parent_id=None,
                                                 items=[user, {"role": "assistant", "content": "hello"}],
                                                 created_at=100.0))  # fmt: skip
        more = [{"role": "user", "content": "and?"}]
        mem.store.transact(lambda tx: stored.put(tx, response_id="resp_2", scope="a", parent_id="resp_1",
                                                 items=more, created_at=200.0))  # fmt: skip
        with mem.store.read() as tx:
            chain = stored.conversation(tx, "resp_2", scope="a", since=0.0)
            assert [m["content"] for m in chain or []] == ["hi", "hello", "and?"]
            assert stored.conversation(tx, "resp_2", scope="b", since=0.0) is None
            assert stored.conversation(tx, "resp_2", scope="a", since=150.0) is None  # its start has expired
            assert stored.conversation(tx, "resp_9", scope="a", since=0.0) is None
        assert mem.store.transact(lambda tx: stored.expire(tx, before=150.0)) == 1
        with mem.store.read() as tx:
            assert stored.conversation(tx, "resp_2", scope="a", since=0.0) is None  # cleared: the chain ends
        assert mem.verify().ok
    finally:
        mem.close()


def test_a_version_7_store_gains_the_responses_table_with_its_rows_intact(store_location: Any, backend: str) -> None:
    loc = store_location("old")
    with ReMem(loc) as mem:
        mid = mem.add("Our server moved to west-2.", entity="server", attribute="region")
    if backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(Path(loc) / "ledger.db")
        _sqlite_downgrades.downgrade(conn, SQLITE_8_TO_7)
        conn.close()
    else:
        import psycopg

        with psycopg.connect(str(loc), autocommit=True) as pg:
            _pg_downgrades.downgrade(pg, DOWNGRADE_8_TO_7)
    with ReMem(loc) as mem:
        assert mem.inspect(mid).memory.text == "Our server moved to west-2." and mem.verify().ok
        hi = [{"role": "user", "content": "hi"}]
        mem.store.transact(lambda tx: stored.put(tx, response_id="resp_x", scope="default", parent_id=None,
                                                 items=hi, created_at=1.0))  # fmt: skip
        with mem.store.read() as tx:
            assert stored.conversation(tx, "resp_x", scope="default", since=0.0) == hi


async def test_the_agents_sdk_default_model_speaks_responses(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel
) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    client = _client(_app(mem, tmp_path, model))
    pinged: list[str] = []

    @agents.function_tool
    def ping(region: str) -> str:
        """Ping the server of a region."""
        pinged.append(region)
        return "pong"

    try:
        agent = agents.Agent(
            name="ops",
            instructions="You are Ops Bot.",
            tools=[ping],
            model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        )
        result = await agents.Runner.run(agent, "Ping our server, please.", max_turns=4)
        assert pinged == ["west-2"] and result.final_output == "The server answered: pong [M1]."
        assert model.requests[0].messages[0].content == "You are Ops Bot."
    finally:
        await client.close()
