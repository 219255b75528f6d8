"""``POST /v1/messages`` through the official ``anthropic`` client, against the gateway app in process with a
local fake model, and against an Ollama-protocol upstream: what reaches the model, streaming events, tools,
structured output, keys and scopes, errors in Anthropic's shape, and bad input refused before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from _gateway import in_process_app, two_scope_memory
from _ollama_server import FakeOllama, chat_ok

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.adapters.base import ChatRequest, ChatResponse, ToolCall

anthropic = pytest.importorskip("anthropic")

MODEL = "qwen2.5:0.5b"
ALICE, BOB = "sk-alice-000000000000001", "sk-bob-00000000000000002"
KEYS = {ALICE: ("user:alice",), BOB: ("user:bob",)}
QUESTION = "Where is our server hosted these days?"
PING = {
    "name": "ping",
    "description": "Ping the server of a region",
    "input_schema": {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]},
}


def _reply(req: ChatRequest) -> str | ChatResponse:
    last = req.messages[-1]
    if req.tools and last.role == "user":
        return ChatResponse(
            text="Let me check.", tool_calls=(ToolCall(id="toolu_1", name="ping", arguments='{"region": "west-2"}'),),
            finish_reason="tool_calls",
        )  # fmt: skip
    if req.json_schema is not None:
        return json.dumps({"region": "west-2"})
    if last.role == "tool":
        return f"The server answered: {last.content} [M1]."
    return "It is in west-2 [M1]."


mem = two_scope_memory  # tests/_gateway.py's store, as this module's ``mem`` fixture


@pytest.fixture()
def model() -> FunctionChatModel:
    return FunctionChatModel(_reply, name=MODEL)


def _app(mem: ReMem, tmp_path: Path, model: FunctionChatModel | None, **over: Any) -> Any:
    return in_process_app(mem, tmp_path, model, (MODEL,), **over)


def _client(app: Any, key: str = "x") -> Any:
    """The official async client on the app in process (the SDK's own HTTP package: httpx2 since 2.x)."""
    transport_of = pytest.importorskip("httpx2") if anthropic.__version__ >= "2" else httpx
    http = transport_of.AsyncClient(transport=transport_of.ASGITransport(app=app), base_url="http://gw")
    return anthropic.AsyncAnthropic(base_url="http://gw", api_key=key, http_client=http, max_retries=0)


async def test_a_message_with_memory_and_its_feedback(mem: ReMem, tmp_path: Path, model: FunctionChatModel) -> None:
    client = _client(_app(mem, tmp_path, model))
    try:
        raw = await client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": QUESTION}]
        )
        msg = await raw.parse()
        answer = raw.headers["x-remem-answer-id"]
        assert msg.id.startswith(f"msg_{answer}-") and msg.stop_reason == "end_turn"
        assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "It is in west-2 [M1]."
        assert msg.model_extra is not None and msg.model_extra["remem"]["citations"]
        sent = model.requests[-1]
        assert [m.role for m in sent.messages] == ["system", "system", "user"] and sent.max_tokens == 64
        assert sent.messages[0].content == "Be brief." and "west-2" in sent.messages[1].content
        ok = await client.post("/v1/feedback", cast_to=object, body={"answer_id": msg.id, "success": True})
        assert isinstance(ok, dict) and ok["source"] == "user"  # the message id names its answer
    finally:
        await client.close()


async def test_a_streamed_message_sends_the_protocols_events(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel
) -> None:
    client = _client(_app(mem, tmp_path, model))
    try:
        async with client.messages.stream(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": QUESTION}]
        ) as stream:
            kinds, remem = [], None
            async for event in stream:
                kinds.append(event.type)
                if event.type == "message_delta":
                    remem = (event.model_extra or {}).get("remem")
            final = await stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
        assert final.content[0].text == "It is in west-2 [M1]." and final.stop_reason == "end_turn"
        assert remem is not None and remem["citations"] and remem["answer_id"] in final.id
    finally:
        await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_use_round_trip_is_one_turn(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel, stream: bool
) -> None:
    client = _client(_app(mem, tmp_path, model))
    ask = [{"role": "user", "content": "Ping our server, please."}]
    try:
        if stream:
            async with client.messages.stream(model=MODEL, max_tokens=64, tools=[PING], messages=ask) as s:
                first = await s.get_final_message()
        else:
            first = await client.messages.create(model=MODEL, max_tokens=64, tools=[PING], messages=ask)
        assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["text", "tool_use"]
        use = first.content[1]
        assert use.name == "ping" and use.input == {"region": "west-2"} and use.id == "toolu_1"
        assert model.requests[-1].tools[0].name == "ping"
        follow = [
            *ask,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "pong"}]},
        ]
        done = await client.messages.create(model=MODEL, max_tokens=64, tools=[PING], messages=follow)
        assert done.content[0].text == "The server answered: pong [M1]."
        sent = model.requests[-1].messages
        assert sent[-2].tool_calls[0].name == "ping" and sent[-1].role == "tool" and sent[-1].tool_call_id == use.id
        # the agent loop's later call continues the turn: the same answer
        assert done.model_extra["remem"]["answer_id"] == first.id.removeprefix("msg_").rsplit("-", 1)[0]
    finally:
        await client.close()


async def test_structured_output_by_output_config(mem: ReMem, tmp_path: Path, model: FunctionChatModel) -> None:
    client = _client(_app(mem, tmp_path, model))
    schema = {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]}
    try:
        msg = await client.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": QUESTION}],
            output_config={"format": {"type": "json_schema", "schema": schema}},
        )
        assert json.loads(msg.content[0].text) == {"region": "west-2"} and model.requests[-1].json_schema == schema
        assert msg.model_extra is not None and msg.model_extra["remem"]["schema_valid"] is True
    finally:
        await client.close()


async def test_keys_scopes_and_errors_in_anthropics_shape(mem: ReMem, tmp_path: Path, model: FunctionChatModel) -> None:
    app = _app(mem, tmp_path, model, keys=KEYS)
    alice, stranger = _client(app, ALICE), _client(app, "sk-nobody-0000000000000")
    try:
        msg = await alice.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": QUESTION}])
        assert msg.model_extra is not None and msg.model_extra["remem"]["served"]  # alice's own memory
        with pytest.raises(anthropic.AuthenticationError) as auth:
            await stranger.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert auth.value.body["type"] == "error" and auth.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.PermissionDeniedError):
            await alice.messages.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}], metadata={"user_id": "bob"}
            )
        with pytest.raises(anthropic.NotFoundError) as missing:
            await alice.messages.create(model="nope", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert missing.value.body["error"]["type"] == "not_found_error"
    finally:
        await alice.close()
        await stranger.close()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "frobnicate"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0]",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "enabled"}},
            "thinking",
        ),
        ({"max_tokens": 8, "messages": []}, "messages"),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, "messages[0]"),
        ({"max_tokens": -1, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "maybe"}},
            "tool_choice",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}
                ],
            },
            "tool",
        ),
    ],
)
async def test_bad_requests_are_400s_in_anthropics_shape_and_write_nothing(
    mem: ReMem, tmp_path: Path, model: FunctionChatModel, body: dict[str, Any], where: str
) -> None:
    app = _app(mem, tmp_path, model)
    searches = mem.stats().searches
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        r = await http.post("/v1/messages", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    out = r.json()
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    assert where in out["error"]["message"], out
    assert mem.stats().searches == searches and not model.requests  # nothing recalled, nothing sent


async def test_an_anthropic_client_in_front_of_an_ollama_model(mem: ReMem, tmp_path: Path) -> None:
    with FakeOllama() as fake:
        fake.default = chat_ok("It is in west-2 [M1].", model=MODEL)
        app = _app(mem, tmp_path, None, upstream=fake.url, upstream_kind="ollama")
        client = _client(app)
        try:
            msg = await client.messages.create(
                model=MODEL, max_tokens=32, stop_sequences=["END"], system="Be brief.",
                messages=[{"role": "user", "content": QUESTION}],
                extra_body={"temperature": 0.2},  # gone from the 2.x SDK's signature; older clients send it
            )  # fmt: skip
            assert msg.content[0].text == "It is in west-2 [M1]."
            sent = fake.requests[-1].body
            assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
            assert sent["options"]["num_predict"] == 32 and sent["options"]["temperature"] == 0.2
            assert sent["options"]["stop"] == ["END"]
        finally:
            await client.close()
            await app.state.gateway.aclose()  # no lifespan in process: close the upstream's HTTP pool here
