"""The conversation path against real servers on loopback: a multi-turn agent with a tool.

* OpenAI adapter -> a real ``llama_cpp.server`` (SmolLM2-135M, ``chatml-function-calling``): real SSE, real
  tool calls. The 135M model's prose is weak, so the turns that must cite pass a llama.cpp ``grammar``
  through ``extra`` (unknown fields reach the server untouched) to fix the reply's words; the tool call
  and its arguments are the model's own.
* Ollama adapter -> a loopback server speaking Ollama's ``/api/chat`` (plain JSON and chunked NDJSON),
  through the real ``ollama`` client.

Each test checks: the caller's system prompt survives, memories are injected, tool calls round-trip,
inline citations are extracted and credited, a correction in the next user turn blames the right memory,
and streaming works over the real wire format.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _llama_server import llama_server, needs_llama_server
from _ollama_server import FakeOllama, chat_ok, chat_stream

from remem_agent import ReMem
from remem_agent.adapters import RetryPolicy
from remem_agent.agent import MemoryAgent, load_traces

pytest.importorskip("openai")
pytest.importorskip("ollama")

SYSTEM = "You are Ops Bot, terse and exact."
PING = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Ping the server of a region",
        "parameters": {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]},
    },
}
FAST = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.0)


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[ReMem]:
    m = ReMem(tmp_path / "store")
    m.add("Our server is in east-1.", entity="server", attribute="region", timestamp=1)
    m.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=2)
    m.add("The on-call engineer this week is Priya.", entity="oncall", attribute="person", timestamp=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def fc_server() -> Iterator[str]:
    with llama_server("chatml-function-calling") as base:
        yield base


@pytest.fixture()
async def sent() -> AsyncIterator[tuple[httpx.AsyncClient, list[dict[str, Any]]]]:
    """An HTTP client that records every JSON body it sends (what the server really received)."""
    bodies: list[dict[str, Any]] = []

    async def record(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content))

    async with httpx.AsyncClient(trust_env=False, timeout=120.0, event_hooks={"request": [record]}) as client:
        yield client, bodies


def _label(served: Any, needle: str, aliases: dict[str, str]) -> str:
    mid = next(h.id for h in served if needle in h.text)
    return next(k for k, v in aliases.items() if v == mid)


def _grammar(text: str) -> dict[str, str]:
    return {"grammar": "root ::= " + json.dumps(text)}


@needs_llama_server
async def test_agent_with_a_tool_over_a_real_llama_cpp_server(
    mem: ReMem, tmp_path: Path, fc_server: str, sent: tuple[httpx.AsyncClient, list[dict[str, Any]]]
) -> None:
    from remem_agent.adapters.openai_chat import OpenAIChat

    client, bodies = sent
    model = OpenAIChat("smollm2", base_url=fc_server, api_key="sk-test-123456", http_client=client)
    agent = MemoryAgent(mem, model, trace=tmp_path / "t.jsonl", retry=FAST, max_tokens=48, strip_citations=True)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Please ping our server in its current region."},
    ]
    # turn 1, call 1: the model must call the tool (forced); its arguments are its own
    first = await agent.chat(msgs, tools=[PING], tool_choice="ping")
    assert first.finish_reason == "tool_calls" and first.tool_calls[0].name == "ping"
    assert isinstance(json.loads(first.tool_calls[0].arguments), dict)
    body = bodies[-1]
    assert body["messages"][0] == {"role": "system", "content": SYSTEM}  # the caller's prompt, first, intact
    assert "Long-term memory" in body["messages"][1]["content"] and "west-2" in body["messages"][1]["content"]
    assert "east-1" not in body["messages"][1]["content"]  # the superseded fact is not injected
    assert body["tools"][0]["function"]["name"] == "ping"
    # the caller runs the tool and sends the result: same turn, no new recall, a cited answer
    label = _label(first.served, "west-2", dict(first.aliases))
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [c.to_dict() for c in first.tool_calls]},
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "pong from west-2 in 12 ms"},
    ]
    searches = mem.stats().searches
    second = await agent.chat(msgs, tools=[PING], tool_choice="none", extra=_grammar(f"It is up in west-2 [{label}]."))
    assert mem.stats().searches == searches and not second.recalled and second.answer_id == first.answer_id
    assert bodies[-1]["messages"][-1]["role"] == "tool"  # the tool result reached the server
    west = first.aliases[label]
    assert second.citations == (west,) and second.text == "It is up in west-2." and "[M" in second.raw
    # turn 2: the user corrects the answer -> the memory the answer used is blamed
    msgs += [
        {"role": "assistant", "content": second.text},
        {"role": "user", "content": "No, that's outdated. Who is on call this week?"},
    ]
    oncall = (
        _label(second.served, "Priya", dict(second.aliases)) if any("Priya" in h.text for h in second.served) else None
    )
    third = await agent.chat(msgs, extra=_grammar("Priya is on call." + (f" [{oncall}]" if oncall else "")))
    assert third.recalled and third.answer_id != first.answer_id
    credit = mem.inspect(west).credits[-1]
    assert credit.search_id == first.search_id and not credit.success and credit.blame > 0
    # streaming over real SSE: pieces arrive one by one, the label split across them is stripped
    msgs += [{"role": "assistant", "content": third.text}, {"role": "user", "content": "Where is our server again?"}]
    stream = agent.chat_stream(msgs, extra=_grammar("The server is in west-2 [M1] now."))
    pieces = [c.text async for c in stream]
    assert len(pieces) > 3 and "".join(pieces) == "The server is in west-2 now."
    assert stream.reply is not None and stream.reply.citations == (stream.reply.aliases["M1"],)
    assert bodies[-1]["stream"] is True
    # the user's thumbs up credits the memory the streamed reply cited inline
    cited = stream.reply.citations[0]
    receipt = await agent.feedback(stream.reply.answer_id, success=True, reason="thumbs up")
    assert receipt.credit[cited] > 0 and mem.inspect(cited).credits[-1].search_id == stream.reply.search_id
    lines = load_traces(tmp_path / "t.jsonl")
    assert {ln["kind"] for ln in lines} == {"chat", "outcome"}
    assert "sk-test-123456" not in (tmp_path / "t.jsonl").read_text()


def _ollama_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": args}}


async def test_agent_with_a_tool_over_the_ollama_protocol(mem: ReMem, tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await _tool_over_ollama(mem, tmp_path, stack)


async def _tool_over_ollama(mem: ReMem, tmp_path: Path, stack: contextlib.AsyncExitStack) -> None:
    from remem_agent.adapters.ollama_chat import OllamaChat

    with FakeOllama() as server:
        model = OllamaChat("qwen2.5:0.5b", host=server.url)
        stack.push_async_callback(model.aclose)  # its HTTP pool: no socket left open
        agent = MemoryAgent(mem, model, trace=tmp_path / "t.jsonl", retry=FAST)
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Please ping our server in its current region."},
        ]
        server.push(chat_ok("", tool_calls=[_ollama_call("ping", {"region": "west-2"})]))
        first = await agent.chat(msgs, tools=[PING])
        assert first.finish_reason == "tool_calls" and json.loads(first.tool_calls[0].arguments) == {"region": "west-2"}
        body = server.requests[-1].body
        assert body["messages"][0] == {"role": "system", "content": SYSTEM}
        assert "west-2" in body["messages"][1]["content"] and body["tools"][0]["function"]["name"] == "ping"
        west = next(h.id for h in first.served if "west-2" in h.text)
        assert west in first.used  # the tool arguments repeat the memory's value
        label = next(k for k, v in first.aliases.items() if v == west)
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [c.to_dict() for c in first.tool_calls]},
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "pong", "name": "ping"},
        ]
        server.push(chat_stream(["It is ", "up in west-2 [", f"{label}", "]."]))
        stream = agent.chat_stream(msgs, tools=[PING], strip_citations=True)
        pieces = [c.text async for c in stream]
        assert "".join(pieces) == "It is up in west-2." and len([p for p in pieces if p]) >= 2
        assert stream.reply is not None and stream.reply.citations == (west,) and not stream.reply.recalled
        sent_tool = server.requests[-1].body["messages"][-1]
        assert sent_tool["role"] == "tool" and sent_tool.get("tool_name") == "ping"
        assert server.requests[-1].body["messages"][-2]["tool_calls"][0]["function"]["arguments"] == {
            "region": "west-2"
        }
        msgs += [
            {"role": "assistant", "content": "It is up in west-2."},
            {"role": "user", "content": "Wrong, it moved."},
        ]
        server.push(chat_ok("Sorry."))
        await agent.chat(msgs)
        credit = mem.inspect(west).credits[-1]
        assert credit.search_id == first.search_id and not credit.success and credit.blame > 0
