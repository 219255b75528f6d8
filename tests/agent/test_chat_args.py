"""The keyword arguments of a chat call, written once (``ChatArgs``): the per-call model and JSON schema are
explicit parameters, and a name the call does not take is refused before anything runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from remem_agent import ReMem, UserInputError
from remem_agent.adapters import FunctionChatModel, RetryPolicy, ScriptedChatModel
from remem_agent.agent import MemoryAgent, load_traces
from remem_agent.agent.chat_types import ChatArgs, RecallArgs

FAST = RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=0.0)
SCHEMA = {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]}


@pytest.fixture()
def mem(tmp_path: Path) -> ReMem:
    m = ReMem(tmp_path / "store")
    m.add("Our server is in west-2.", entity="server", attribute="region", timestamp=1)
    yield m
    m.close()


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_a_call_may_name_its_own_model_and_the_agents_is_not_asked(mem: ReMem, tmp_path: Path) -> None:
    default = ScriptedChatModel([], name="default-model")
    other = FunctionChatModel(lambda req: "west-2 [M1]", name="other-model", adapter="other")
    agent = MemoryAgent(mem, default, trace=tmp_path / "t.jsonl", retry=FAST)
    reply = asyncio.run(agent.chat(ask("Where is our server?"), model=other))
    assert reply.text.startswith("west-2") and len(other.requests) == 1 and default.requests == []
    (line,) = [r for r in load_traces(tmp_path / "t.jsonl") if r.get("kind") == "chat"]
    assert line["model"]["name"] == "other-model" and line["model"]["adapter"] == "other"


def test_a_streamed_call_uses_its_own_model_too(mem: ReMem, tmp_path: Path) -> None:
    default = ScriptedChatModel([], name="default-model")
    other = FunctionChatModel(lambda req: "west-2", name="other-model")
    agent = MemoryAgent(mem, default, trace=False, retry=FAST)

    async def run() -> str:
        stream = agent.chat_stream(ask("Where is our server?"), model=other)
        return "".join([c.text async for c in stream])

    assert asyncio.run(run()) == "west-2" and default.requests == [] and len(other.requests) == 1


def test_the_json_schema_reaches_the_model_as_a_request_field_not_an_extra(mem: ReMem) -> None:
    model = FunctionChatModel(lambda req: '{"region": "west-2"}')
    agent = MemoryAgent(mem, model, trace=False, retry=FAST)
    asyncio.run(agent.chat(ask("Where is our server?"), json_schema=SCHEMA, schema_name="where", extra={"top_p": 1}))
    (req,) = model.requests
    assert req.json_schema == SCHEMA and req.schema_name == "where" and dict(req.extra) == {"top_p": 1}
    asyncio.run(agent.chat(ask("And the lunch?")))
    assert model.requests[1].json_schema is None and model.requests[1].schema_name == "answer"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temprature": 0.1}, TypeError, "'temprature'"),
        ({"model": "gpt-4o"}, UserInputError, "ChatModel protocol"),
        ({"json_schema": "not a schema"}, UserInputError, "json_schema"),
        ({"schema_name": " "}, UserInputError, "schema_name"),
    ],
)
def test_bad_keyword_arguments_are_refused_before_any_call(
    mem: ReMem, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    model = ScriptedChatModel([])
    agent = MemoryAgent(mem, model, trace=False, retry=FAST)
    before = mem.stats().searches
    with pytest.raises(error, match=message):
        asyncio.run(agent.chat(ask("Where is our server?"), **kwargs))
    with pytest.raises(error, match=message):
        agent.chat_stream(ask("Where is our server?"), **kwargs)
    assert model.requests == [] and mem.stats().searches == before


def test_prepare_chat_takes_the_recall_arguments_only(mem: ReMem) -> None:
    agent = MemoryAgent(mem, ScriptedChatModel([]), trace=False, retry=FAST)
    with pytest.raises(TypeError, match="'temperature'"):
        asyncio.run(agent.prepare_chat(ask("Where is our server?"), temperature=0.2))  # type: ignore[call-arg]
    prepared = asyncio.run(agent.prepare_chat(ask("Where is our server?"), task="ops", k=1))
    assert "west-2" in "\n".join(m.content for m in prepared.messages)


def test_the_argument_lists_are_the_documented_ones() -> None:
    assert set(RecallArgs.__optional_keys__) == {
        "tools", "tool_choice", "conversation_id", "scope", "task", "k", "now", "token_budget",
    }  # fmt: skip
    assert set(ChatArgs.__optional_keys__) - set(RecallArgs.__optional_keys__) == {
        "strip_citations", "temperature", "max_tokens", "extra", "model", "json_schema", "schema_name",
    }  # fmt: skip
