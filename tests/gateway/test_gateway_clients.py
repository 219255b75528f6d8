"""Real clients against ``remem serve`` (uvicorn on loopback) in front of a real ``llama_cpp.server`` + SmolLM2.

Clients: the ``openai`` SDK (sync, async + streaming, a tool round trip), LangChain's ``ChatOpenAI``, the OpenAI
Agents SDK (``OpenAIChatCompletionsModel`` + ``Runner.run`` with a ``@function_tool``) and the ``ollama`` client
against ``/api/chat`` (stream and not; the upstream stays llama.cpp's OpenAI API: front protocol and upstream kind
are independent). The 135M model's words are weak, so replies that must cite pass a llama.cpp ``grammar`` as an
unknown field (``extra_body``, or an Ollama option): it reaches llama.cpp only if the gateway passes unknown fields
through untouched, which these tests therefore also check.

Every test: a memory added through ``POST /v1/memories`` is in the memory block the upstream received (the
trace's ``memory_block``) and cited by the reply; the next user turn correcting the answer blames it (inferred
outcome, in the ledger); explicit ``POST /v1/feedback`` on the next answer credits it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _gateway import running
from _llama_server import llama_server, needs_llama_server

from remem_agent import ReMem
from remem_agent.gateway import GatewayConfig, create_app

pytest.importorskip("openai")
pytestmark = needs_llama_server

SYSTEM = "You are Ops Bot, terse and exact."
QUESTION = "Where is our server hosted these days?"
CORRECTION = "No, that's outdated. Where is it really?"
PING = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Ping the server of a region",
        "parameters": {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]},
    },
}
UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"


def grammar(text: str) -> dict[str, str]:
    return {"grammar": "root ::= " + json.dumps(text)}


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with llama_server("chatml-function-calling") as base:
        yield base


class Gw:
    """A running gateway and what the tests read from it."""

    def __init__(self, base: str, mem: ReMem, trace: Path) -> None:
        self.base, self.mem, self.trace = base, mem, trace
        self.http = httpx.Client(base_url=base, trust_env=False, timeout=120)

    def add(self, text: str, **fields: Any) -> str:
        r = self.http.post("/v1/memories", json={"text": text, **fields})
        assert r.status_code == 201, r.text
        mid: str = r.json()["id"]
        return mid

    def credits(self, mid: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/memories/{mid}")
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["credits"]
        return out

    def feedback(self, answer_id: str, success: bool) -> dict[str, Any]:
        r = self.http.post("/v1/feedback", json={"answer_id": answer_id, "success": success, "reason": "test"})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def lines(self, kind: str = "chat") -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in self.trace.read_text().splitlines() if x.strip()]
        return [r for r in rows if r.get("kind") == kind]

    def block(self, answer_id: str) -> str:
        """The memory block the upstream received for an answer (first call of its turn)."""
        return next(ln["memory_block"] or "" for ln in self.lines() if ln["answer_id"] == answer_id)

    def check_learning(self, mid: str, first_answer: str, second_answer: str) -> None:
        """Turn 1 was corrected by turn 2 (inferred failure); turn 2 gets explicit success feedback."""
        inferred = [c for c in self.credits(mid) if not c["success"]]
        assert len(inferred) == 1 and inferred[0]["blame"] > 0  # the correction reached the ledger
        outcomes = self.lines("outcome")
        assert any(o["answer_id"] == first_answer and o["outcome"]["source"] == "inferred" for o in outcomes)
        receipt = self.feedback(second_answer, True)
        assert receipt["credit"].get(mid, 0) > 0 and receipt["source"] == "user"
        assert [c["success"] for c in self.credits(mid)] == [False, True]
        assert self.http.get("/v1/verify").json()["ok"] is True


_OPEN_CLIENTS: list[Any] = []


def request_closes(client: Any) -> None:
    """Close ``client`` (an official SDK client holding an httpx client) when the test's gateway stops."""
    _OPEN_CLIENTS.append(client)


@pytest.fixture()
def gw(upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gw]:
    monkeypatch.setenv("REMEM_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    mem = ReMem(tmp_path / "store")
    trace = tmp_path / "trace.jsonl"
    config = GatewayConfig(
        upstream=upstream, models=("smollm2",), trace=str(trace), upstream_api_key_env="REMEM_TEST_UPSTREAM_KEY"
    )
    with running(create_app(config, memory=mem)) as base:
        g = Gw(base, mem, trace)
        yield g
        g.http.close()
        while _OPEN_CLIENTS:
            _OPEN_CLIENTS.pop().close()
    mem.close()


def test_openai_sync_client(gw: Gw, caplog: pytest.LogCaptureFixture) -> None:
    import openai

    caplog.set_level(logging.INFO, logger="remem_agent.gateway")
    mid = gw.add("Our server moved to west-2.", entity="server", attribute="region")
    client = openai.OpenAI(base_url=gw.base + "/v1", api_key="sk-client", http_client=httpx.Client(trust_env=False))
    request_closes(client)
    msgs: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=msgs, max_tokens=30, extra_body=grammar("It is in west-2 [M1].")
    )
    first = raw.parse()
    a1 = raw.headers["x-remem-answer-id"]
    assert first.id == f"chatcmpl-{a1}"  # the completion's own id carries the answer id every client keeps
    assert first.choices[0].message.content == "It is in west-2 [M1]."  # the unknown field reached llama.cpp
    assert mid in raw.headers["x-remem-served"].split(",")
    assert first.model_extra is not None and first.model_extra["remem"]["citations"] == [mid]
    assert "west-2" in gw.block(a1)
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": CORRECTION},
    ]
    second = client.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=30, extra_body=grammar("West-2, as stored [M1].")
    )
    assert second.model_extra is not None
    a2 = second.model_extra["remem"]["answer_id"]
    assert a2 != a1 and second.model_extra["remem"]["conversation_id"] == raw.headers["x-remem-conversation"]
    gw.check_learning(mid, a1, a2)
    again = gw.http.post("/v1/feedback", json={"answer_id": second.id, "success": True})  # by the completion id
    assert again.status_code == 200 and again.json()["repeated"] is True
    # the access log: one JSON line per request, never a prompt, a reply or a key
    access = [r.getMessage() for r in caplog.records if r.name == "remem_agent.gateway.access"]
    assert access and all(json.loads(a)["event"] == "request" for a in access)
    for secret in (QUESTION, "west-2", UPSTREAM_KEY, "sk-client"):
        assert secret not in caplog.text
    assert UPSTREAM_KEY not in gw.trace.read_text()


async def test_openai_async_client_streaming(gw: Gw) -> None:
    import openai

    mid = gw.add("Our server moved to west-2.", entity="server", attribute="region")
    client = openai.AsyncOpenAI(
        base_url=gw.base + "/v1", api_key="x", http_client=httpx.AsyncClient(trust_env=False, timeout=120)
    )
    msgs: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    raw = await client.chat.completions.with_raw_response.create(
        model="smollm2", messages=msgs, max_tokens=30, stream=True, extra_body=grammar("It is in west-2 [M1] now.")
    )
    a1 = raw.headers["x-remem-answer-id"]
    pieces, remem, ids = [], None, set()
    async for chunk in raw.parse():
        ids.add(chunk.id)
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.model_extra and "remem" in chunk.model_extra:
            remem = chunk.model_extra["remem"]
    assert len(pieces) > 3 and "".join(pieces) == "It is in west-2 [M1] now."
    assert remem is not None and remem["answer_id"] == a1 and remem["citations"] == [mid]
    assert ids == {f"chatcmpl-{a1}"}  # every chunk names the answer, the first one included
    assert "west-2" in gw.block(a1)
    msgs += [{"role": "assistant", "content": "".join(pieces)}, {"role": "user", "content": CORRECTION}]
    stream = await client.chat.completions.create(
        model="smollm2",
        messages=msgs,
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=grammar("West-2 [M1]."),
    )
    a2, usage = None, None
    async for chunk in stream:
        if chunk.model_extra and "remem" in chunk.model_extra:
            a2 = chunk.model_extra["remem"]["answer_id"]
        usage = chunk.usage or usage
    assert a2 is not None and usage is not None  # llama.cpp 0.3.36 reports no usage in streams: zeros
    await asyncio.to_thread(gw.check_learning, mid, a1, a2)
    await client.close()


def test_openai_tool_call_round_trip(gw: Gw) -> None:
    import openai

    mid = gw.add("Our server moved to west-2.", entity="server", attribute="region")
    client = openai.OpenAI(base_url=gw.base + "/v1", api_key="x", http_client=httpx.Client(trust_env=False))
    request_closes(client)
    msgs: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Please ping our server in its current region."},
    ]
    call = client.chat.completions.create(
        model="smollm2", messages=msgs, tools=[PING], tool_choice={"type": "function", "function": {"name": "ping"}}
    )
    tool_calls = call.choices[0].message.tool_calls
    assert call.choices[0].finish_reason == "tool_calls" and tool_calls and tool_calls[0].function.name == "ping"
    assert isinstance(json.loads(tool_calls[0].function.arguments), dict)
    assert call.model_extra is not None
    a1 = call.model_extra["remem"]["answer_id"]
    msgs += [
        call.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_calls[0].id, "content": "pong from west-2 in 12 ms"},
    ]
    done = client.chat.completions.create(
        model="smollm2", messages=msgs, tools=[PING], tool_choice="none", extra_body=grammar("Up in west-2 [M1].")
    )
    assert done.model_extra is not None and done.model_extra["remem"]["answer_id"] == a1  # same turn, same answer
    assert done.model_extra["remem"]["citations"] == [mid]
    chat_lines = [ln for ln in gw.lines() if ln["answer_id"] == a1]
    assert [ln["recalled"] for ln in chat_lines] == [True, False]  # one recall for the whole tool loop
    assert chat_lines[1]["messages"][-1]["role"] == "tool"
    msgs += [{"role": "assistant", "content": "Up in west-2 [M1]."}, {"role": "user", "content": CORRECTION}]
    again = client.chat.completions.create(model="smollm2", messages=msgs, extra_body=grammar("West-2 [M1]."))
    assert again.model_extra is not None
    gw.check_learning(mid, a1, again.model_extra["remem"]["answer_id"])


def test_langchain_chat_openai(gw: Gw) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    mid = gw.add("Our server moved to west-2.", entity="server", attribute="region")

    with httpx.Client(trust_env=False, timeout=120) as http:  # closed after the test: no socket left open

        def llm(text: str) -> ChatOpenAI:
            return ChatOpenAI(
                model="smollm2",
                base_url=gw.base + "/v1",
                api_key="x",  # type: ignore[arg-type]
                max_tokens=30,  # type: ignore[call-arg]
                extra_body=grammar(text),
                default_headers={"x-remem-conversation": "lc-1"},
                http_client=http,
            )

        history: list[Any] = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
        first = llm("It is in west-2 [M1].").invoke(history)
        assert first.content == "It is in west-2 [M1]."
        line = gw.lines()[-1]
        assert line["conversation_id"] == "lc-1" and line["scope"] == "default"
        assert "west-2" in (line["memory_block"] or "") and line["citations"] == [mid]
        history += [AIMessage(str(first.content)), HumanMessage(CORRECTION)]
        llm("West-2 [M1].").invoke(history)
        gw.check_learning(mid, line["answer_id"], gw.lines()[-1]["answer_id"])


def test_openai_agents_sdk(gw: Gw) -> None:
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)
    mid = gw.add("Our server moved to west-2.", entity="server", attribute="region")
    pinged: list[str] = []

    @agents.function_tool
    def ping(region: str) -> str:
        """Ping the server of a region."""
        pinged.append(region)
        return f"pong from {region}"

    async def run(inputs: Any, reply: str) -> Any:
        client = openai.AsyncOpenAI(
            base_url=gw.base + "/v1", api_key="x", http_client=httpx.AsyncClient(trust_env=False, timeout=120)
        )
        agent = agents.Agent(
            name="ops",
            instructions=SYSTEM,
            tools=[ping],
            model=agents.OpenAIChatCompletionsModel(model="smollm2", openai_client=client),
            model_settings=agents.ModelSettings(tool_choice="ping", max_tokens=40, extra_body=grammar(reply)),
        )
        try:
            return await agents.Runner.run(agent, inputs, max_turns=4)
        finally:
            await client.close()

    first = asyncio.run(run("Please ping our server in its current region.", "The server in west-2 answered [M1]."))
    assert pinged and first.final_output == "The server in west-2 answered [M1]."
    turn = gw.lines()
    assert [ln["recalled"] for ln in turn] == [True, False] and turn[0]["tools"] == ["ping"]
    assert "west-2" in (turn[0]["memory_block"] or "") and turn[1]["citations"] == [mid]
    a1 = turn[0]["answer_id"]
    second = asyncio.run(run([*first.to_input_list(), {"role": "user", "content": CORRECTION}], "West-2 [M1]."))
    assert second.final_output == "West-2 [M1]."
    gw.check_learning(mid, a1, gw.lines()[-1]["answer_id"])


def test_ollama_client_against_api_chat(gw: Gw) -> None:
    ollama = pytest.importorskip("ollama")

    mid = gw.add("Our server moved to west-2.", entity="server", attribute="region")
    client = ollama.Client(host=gw.base, trust_env=False)
    request_closes(client)
    msgs: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    parts = list(
        client.chat(
            model="smollm2", messages=msgs, stream=True, options={"num_predict": 30, **grammar("In west-2 [M1].")}
        )
    )
    assert "".join(p.message.content or "" for p in parts) == "In west-2 [M1]." and parts[-1].done
    line = gw.lines()[-1]
    assert line["stream"] and "west-2" in (line["memory_block"] or "") and line["citations"] == [mid]
    msgs += [{"role": "assistant", "content": "In west-2 [M1]."}, {"role": "user", "content": CORRECTION}]
    reply = client.chat(model="smollm2", messages=msgs, stream=False, options=grammar("West-2 [M1]."))
    assert reply.message.content == "West-2 [M1]." and reply.done
    gw.check_learning(mid, line["answer_id"], gw.lines()[-1]["answer_id"])
    assert [m.model for m in client.list().models] == ["smollm2"]


def test_ollama_client_lists_shows_and_versions_and_the_probes_answer(gw: Gw) -> None:
    """What Ollama clients and UIs call besides chat (`ps`, `show`, `/api/version`), with the official client;
    and the liveness and readiness probes, ready while the upstream answers."""
    ollama = pytest.importorskip("ollama")

    client = ollama.Client(host=gw.base, trust_env=False)
    request_closes(client)
    assert [m.model for m in client.ps().models] == ["smollm2"]
    shown = client.show("smollm2")
    assert shown.capabilities is not None and "completion" in shown.capabilities
    with pytest.raises(ollama.ResponseError) as err:
        client.show("not-served")
    assert err.value.status_code == 404
    version = gw.http.get("/api/version")
    assert version.status_code == 200 and version.json()["version"]
    assert gw.http.get("/livez").json() == {"status": "alive"}
    ready = gw.http.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "ledger": "ok", "upstream": "ok"}


def test_readiness_names_an_unreachable_upstream(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    mem = ReMem(tmp_path / "store")
    try:
        config = GatewayConfig(upstream=dead, models=("m",), trace="off")
        with running(create_app(config, memory=mem)) as base, httpx.Client(base_url=base, trust_env=False) as http:
            r = http.get("/readyz")
            assert r.status_code == 503 and r.json()["ledger"] == "ok" and r.json()["upstream"] != "ok"
            assert "127.0.0.1" not in r.text  # the upstream's address is not echoed
            assert http.get("/livez").status_code == 200
    finally:
        mem.close()
