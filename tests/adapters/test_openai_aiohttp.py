"""The gateway in front of an OpenAI-protocol upstream (``--upstream-kind openai``, the aiohttp path of
``remem_agent/adapters/openai_aiohttp.py``): what reaches the upstream, and every fault of a misbehaving one.

The upstream is the scripted loopback server of tests/_ollama_server.py answering ``/v1/chat/completions``
with OpenAI-shaped bodies and server-sent events; the gateway runs on a real uvicorn server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _gateway import UPSTREAM_FAULTS, client_of, nothing_credited, one_memory
from _ollama_server import FakeOllama, Reply, error

from remem_agent import ReMem
from remem_agent.gateway import GatewayConfig, create_app

MODEL = "fake-gpt"
USER = [{"role": "user", "content": "Where is our server hosted these days?"}]
UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"


def completion(content: str = "It is in west-2 [M1].", **message: Any) -> Reply:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content, **message}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6},
    }
    return Reply(200, body)


def sse(pieces: list[str], *, cut_after: int | None = None) -> Reply:
    def event(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    lines = [event({"role": "assistant", "content": ""})] + [event({"content": p}) for p in pieces]
    return Reply(ndjson=[*lines, event({}, "stop")], sse=True, cut_after=cut_after)


@pytest.fixture()
def fake() -> Iterator[FakeOllama]:
    with FakeOllama(paths=("/v1/chat/completions",)) as server:
        server.default = completion()
        yield server


mem = one_memory  # the one-memory store of tests/_gateway.py, as this module's ``mem`` fixture


@contextmanager
def serving(fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    monkeypatch.setenv("REMEM_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    config = GatewayConfig(
        upstream=f"{fake.url}/v1",
        upstream_kind="openai",
        upstream_api_key_env="REMEM_TEST_UPSTREAM_KEY",
        models=(MODEL,),
        trace=str(tmp_path / "trace.jsonl"),
        retry_attempts=2,
        retry_max_wait_s=0.2,
        upstream_timeout_s=1.0,
    )
    with client_of(create_app(config, memory=mem)) as c:
        yield c


def test_what_reaches_the_upstream(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        r = c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": USER, "top_p": 0.5, "logit_bias": {"1": 2}}
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "It is in west-2 [M1]."
        assert r.headers["x-remem-served"]
        sent = fake.requests[-1]
        assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        body = sent.body
        assert body["model"] == MODEL and body["top_p"] == 0.5 and body["logit_bias"] == {"1": 2}  # unknown fields
        # exactly the sampling fields the client sent, nothing added: none here
        assert not {"temperature", "max_tokens", "seed", "stream"} & set(body), body
        assert "Long-term memory" in body["messages"][0]["content"] and "west-2" in body["messages"][0]["content"]
        assert not any(k.startswith("__remem") for k in body)  # the gateway's private keys stay in the gateway
        assert UPSTREAM_KEY not in r.text and UPSTREAM_KEY not in (tmp_path / "trace.jsonl").read_text()
        sampling = {"temperature": 0.7, "max_tokens": 20, "seed": 3}
        assert c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, **sampling}).status_code == 200
        assert {k: fake.requests[-1].body.get(k) for k in sampling} == sampling


def test_a_tool_call_and_a_stream_come_back(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "ping", "arguments": '{"region": "west-2"}'}}
    fake.push(completion("", tool_calls=[call]), sse(["It is ", "in west-2 ", "[M1]."]))
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "tools": tools})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (
            choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "ping"
        )
        assert fake.requests[-1].body["tools"][0]["function"]["name"] == "ping"
        with c.stream("POST", "/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True}) as s:
            events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]" and fake.requests[-1].body["stream"] is True
        text = "".join(
            ev["choices"][0]["delta"].get("content") or "" for ev in map(json.loads, events[:-1]) if ev.get("choices")
        )
        assert text == "It is in west-2 [M1]."


def test_a_429_is_retried_then_served(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.push(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0"}))
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
        assert r.status_code == 200 and len(fake.requests) == 2
        assert 'remem_gateway_upstream_errors_total{kind="429"} 1' in c.get("/metrics").text


@pytest.mark.parametrize(
    ("replies", "status", "code"),
    [*UPSTREAM_FAULTS, pytest.param([Reply(200, {"choices": []})], 502, "upstream_error", id="no-choices")],
)
def test_upstream_failures_are_clean_errors(
    fake: FakeOllama,
    mem: ReMem,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replies: list[Reply],
    status: int,
    code: str,
) -> None:
    fake.push(*replies)
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert fake.url not in r.text and UPSTREAM_KEY not in r.text
        if status == 429:
            assert r.headers["retry-after"].isdigit()
        ok = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
        assert ok.status_code == 200  # the gateway keeps serving
    nothing_credited(mem)


def test_a_cut_stream_is_retried_before_its_first_byte_and_an_error_event_after(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = ["It is ", "in west-2 ", "[M1]."]
    fake.push(sse(pieces, cut_after=0), sse(pieces, cut_after=3))  # role chunk + 2 pieces, then the cut
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        with c.stream("POST", "/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True}) as s:
            events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
        assert s.status_code == 200 and len(fake.requests) == 2
        text = "".join(ev["choices"][0]["delta"].get("content") or "" for ev in events if ev.get("choices"))
        assert text == "It is in west-2 " and "error" in events[-1]
        assert "remem_gateway_in_flight 0" in c.get("/metrics").text
    nothing_credited(mem)


def test_a_server_without_json_schema_gets_json_object(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "where", "schema": schema}}
    fake.push(error(400, "response_format json_schema is not supported"), completion('{"region": "west-2"}'))
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "response_format": fmt})
        assert r.status_code == 200, r.text
        first, second = (q.body["response_format"] for q in fake.requests)
        assert first["type"] == "json_schema" and second == {"type": "json_object", "schema": schema}


def test_a_streamed_ollama_reply_counts_the_tokens_the_upstream_counted(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = sse(["It is ", "in west-2 ", "[M1]."])
    usage = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
             "usage": {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38}}  # fmt: skip
    assert stream.ndjson is not None
    fake.push(Reply(ndjson=[*stream.ndjson, usage], sse=True))
    with serving(fake, mem, tmp_path, monkeypatch) as c:
        with c.stream("POST", "/api/chat", json={"model": MODEL, "messages": USER}) as s:
            lines = [json.loads(ln) for ln in s.iter_lines() if ln.strip()]
        assert fake.requests[-1].body["stream_options"] == {"include_usage": True}  # asked of the upstream
        assert lines[-1]["done"] and lines[-1]["eval_count"] == 7 and lines[-1]["prompt_eval_count"] == 31
        # a client that did not stream sends no stream_options (an OpenAI API refuses them then)
        c.post("/api/chat", json={"model": MODEL, "messages": USER, "stream": False})
        assert "stream_options" not in fake.requests[-1].body


def test_both_openai_adapters_read_replies_by_one_set_of_wire_rules() -> None:
    from remem_agent.adapters import _openai_wire as wire
    from remem_agent.adapters import openai_aiohttp, openai_chat

    assert openai_chat.wire is wire and openai_aiohttp.wire is wire
    assert [wire.count(v) for v in (12, 0, -1, True, 3.0, None, "7")] == [12, 0, None, None, None, None, None]
    assert wire.FINISH["tool_calls"] == "tool_calls" and "content_filter" not in wire.FINISH
    assert 429 in wire.TRANSIENT_STATUS and 500 not in wire.TRANSIENT_STATUS  # every 5xx is retried by its own rule
