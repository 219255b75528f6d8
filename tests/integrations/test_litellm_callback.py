"""``RememCallback`` with the real ``litellm`` SDK against a loopback OpenAI-protocol server: the memory block is
in what LiteLLM sends, the reply carries ``remem``, outcomes come from feedback and from the next turn, streams
are learned from at their end, scopes come from metadata or the call's user, and bad input is refused before
anything is sent."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ollama_server import FakeOllama, Reply

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of LiteLLM's price list
litellm = pytest.importorskip("litellm")

from remem_agent import ReMem, UserInputError  # noqa: E402
from remem_agent.integrations.litellm import RememCallback  # noqa: E402

QUESTION = "Where is our server hosted these days?"


def _completion(content: str) -> Reply:
    return Reply(body={
        "id": "chatcmpl-up", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36},
    })  # fmt: skip


def _stream(pieces: list[str]) -> Reply:
    def event(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip

    lines = [event({"role": "assistant", "content": ""}), *(event({"content": p}) for p in pieces), event({}, "stop")]
    return Reply(ndjson=lines, sse=True)


@pytest.fixture()
def upstream() -> Iterator[FakeOllama]:
    with FakeOllama(paths=("/v1/chat/completions",)) as fake:
        fake.default = _completion("It is in west-2 [M1].")
        yield fake


@pytest.fixture()
def callback(tmp_path: Path) -> Iterator[RememCallback]:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    mem.add("Alice's server moved to east-1.", entity="server", attribute="region", scope="user:alice")
    cb = RememCallback(mem)
    litellm.logging_callback_manager._reset_all_callbacks()  # LiteLLM copies callbacks into lists it keeps
    litellm.callbacks = [cb]
    yield cb
    litellm.logging_callback_manager._reset_all_callbacks()
    litellm.callbacks = []
    mem.close()  # each test closes the callback's agent in its own loop


async def _call(upstream: FakeOllama, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return await litellm.acompletion(
        model="openai/m", api_base=upstream.url + "/v1", api_key="sk-test", messages=messages, **kw
    )


async def test_a_completion_gets_memory_and_learns_from_feedback(upstream: FakeOllama, callback: RememCallback) -> None:
    r = await _call(upstream, [{"role": "user", "content": QUESTION}])
    sent = upstream.requests[-1].body["messages"]
    assert sent[0]["role"] == "system" and "west-2" in sent[0]["content"] and sent[-1]["content"] == QUESTION
    memory = r.remem
    assert memory["citations"] == memory["served"] and len(memory["served"]) == 1
    receipt = await callback.feedback(memory["answer_id"], success=True)
    assert receipt.source == "user" and receipt.credit[memory["citations"][0]] == 1.0
    await callback.aclose()


async def test_the_next_turn_settles_the_answer(upstream: FakeOllama, callback: RememCallback) -> None:
    first = await _call(upstream, [{"role": "user", "content": QUESTION}])
    turn2 = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "No, that's wrong: it moved."},
    ]
    await _call(upstream, turn2)
    served = first.remem["served"][0]
    credit = callback.memory.inspect(served).credits[-1]
    assert not credit.success and credit.blame > 0  # the correction failed the first answer
    await callback.aclose()


async def test_a_stream_is_learned_from_at_its_end(upstream: FakeOllama, callback: RememCallback) -> None:
    upstream.push(_stream(["It is ", "in west-2 ", "[M1]."]))
    stream = await _call(upstream, [{"role": "user", "content": QUESTION}], stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "It is in west-2 [M1]."
    assert "west-2" in upstream.requests[-1].body["messages"][0]["content"]
    for _ in range(250):  # LiteLLM logs a stream's success in the background
        if callback.memory.stats().searches and not callback._calls:
            break
        await asyncio.sleep(0.02)
    assert not callback._calls  # finished: its answer waits for an outcome
    await callback.aclose()


async def test_scopes_from_metadata_or_user_and_opting_out(upstream: FakeOllama, callback: RememCallback) -> None:
    r = await _call(upstream, [{"role": "user", "content": QUESTION}], user="alice")
    assert "east-1" in upstream.requests[-1].body["messages"][0]["content"]  # alice's memory only
    assert "west-2" not in upstream.requests[-1].body["messages"][0]["content"] and r.remem["served"]
    await _call(upstream, [{"role": "user", "content": QUESTION}], metadata={"remem_scope": "user:bob"})
    assert upstream.requests[-1].body["messages"][0]["role"] == "user"  # bob has no memory: no block
    await _call(upstream, [{"role": "user", "content": QUESTION}], metadata={"remem": False})
    assert upstream.requests[-1].body["messages"] == [{"role": "user", "content": QUESTION}]
    await callback.aclose()


async def test_bad_messages_are_refused_before_anything_is_sent(upstream: FakeOllama, callback: RememCallback) -> None:
    searches = callback.memory.stats().searches
    with pytest.raises(Exception) as info:
        await _call(upstream, [{"role": "wizard", "content": "hi"}])
    assert isinstance(info.value, UserInputError) or "unknown role" in str(info.value)
    assert not upstream.requests and callback.memory.stats().searches == searches
    await callback.aclose()


async def test_the_litellm_sdk_as_a_client_of_the_gateway_keeps_the_answer_id(tmp_path: Path) -> None:
    """LiteLLM (as a client, no callback) drops the gateway's extra ``remem`` chunk of a stream; the answer id
    still reaches it as the completion's own ``id`` (``chatcmpl-<answer id>``), which feedback takes."""
    from _gateway import running

    from remem_agent.adapters import FunctionChatModel
    from remem_agent.gateway import GatewayConfig, create_app

    litellm.logging_callback_manager._reset_all_callbacks()
    litellm.callbacks = []
    mem = ReMem(tmp_path / "gw")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name="qwen")
    app = create_app(GatewayConfig(models=("qwen",), trace="off"), memory=mem, model=model)
    try:
        with running(app) as base:
            kw = {"model": "openai/qwen", "api_base": base + "/v1", "api_key": "unused"}
            msgs = [{"role": "user", "content": QUESTION}]
            done = await litellm.acompletion(messages=msgs, **kw)
            assert done.id.startswith("chatcmpl-a_")
            stream = await litellm.acompletion(messages=msgs, stream=True, **kw)
            ids = {c.id async for c in stream}
            (streamed,) = ids
            assert streamed.startswith("chatcmpl-a_") and streamed != done.id
            import httpx

            async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
                for given in (done.id, streamed):
                    r = await http.post("/v1/feedback", json={"answer_id": given, "success": True})
                    assert r.status_code == 200, r.text
    finally:
        mem.close()


async def test_a_tool_call_passes_through_and_its_arguments_count_as_use(
    upstream: FakeOllama, callback: RememCallback
) -> None:
    """Tools reach the model untouched, the tool call comes back to the caller, and the value the call carries
    (west-2) counts as the served memory's use."""
    tools = [{"type": "function", "function": {"name": "open_ticket", "description": "Open a ticket",
              "parameters": {"type": "object", "properties": {"region": {"type": "string"}},
                             "required": ["region"]}}}]  # fmt: skip
    upstream.push(Reply(body={
        "id": "chatcmpl-up", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "open_ticket", "arguments": '{"region": "west-2"}'}}]}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36},
    }))  # fmt: skip
    r = await _call(upstream, [{"role": "user", "content": "Open a ticket for our server's region."}], tools=tools)
    sent = upstream.requests[-1].body
    assert sent["tools"] == tools and "west-2" in sent["messages"][0]["content"]
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "open_ticket" and call.function.arguments == '{"region": "west-2"}'
    receipt = await callback.feedback(r.remem["answer_id"], success=True)
    assert receipt.credit[r.remem["served"][0]] > 0  # used through the call's argument, not cited
    await callback.aclose()


async def test_structured_output_passes_through(upstream: FakeOllama, callback: RememCallback) -> None:
    """A ``response_format`` JSON schema reaches the model as the caller wrote it, with the memory block."""
    schema = {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    upstream.push(_completion('{"region": "west-2"}'))
    r = await _call(upstream, [{"role": "user", "content": QUESTION}], response_format=fmt)
    sent = upstream.requests[-1].body
    assert sent["response_format"]["json_schema"]["schema"] == schema and "west-2" in sent["messages"][0]["content"]
    assert r.choices[0].message.content == '{"region": "west-2"}' and len(r.remem["served"]) == 1
    await callback.aclose()
