"""``remem serve`` without a real model: bad input, auth and scopes, limits, faults of a misbehaving upstream.

The upstream is the loopback Ollama-protocol server (tests/_ollama_server.py) behind the gateway's Ollama
adapter, while clients speak OpenAI or Ollama to the gateway (front protocol and upstream kind are
independent). Fault tests run the gateway on a real uvicorn server; input checks use httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _gateway import UPSTREAM_FAULTS, client_of, nothing_credited, one_memory, running
from _ollama_server import FakeOllama, Reply, chat_ok, chat_stream, error

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.adapters.base import Capabilities, ChatRequest, ChatResponse, StreamChunk
from remem_agent.gateway import GatewayConfig, check_bind, create_app, load_api_keys
from remem_agent.gateway.auth import ApiKeys, request_scope
from remem_agent.gateway.config import GatewayConfigError, Limits

MODEL = "qwen2.5:0.5b"
ALICE, BOB, ADMIN = "sk-alice-000000000000001", "sk-bob-00000000000000002", "sk-admin-0000000000000003"
KEYS = {ALICE: ("user:alice", "user:alice/*"), BOB: ("user:bob",), ADMIN: ("*",)}
USER = [{"role": "user", "content": "Where is our server hosted these days?"}]


def _config(fake: FakeOllama | None, tmp_path: Path, **over: Any) -> GatewayConfig:
    base: dict[str, Any] = {
        "upstream": fake.url if fake else None,
        "upstream_kind": "ollama",
        "models": (MODEL,),
        "trace": str(tmp_path / "trace.jsonl"),
        "retry_attempts": 2,
        "retry_max_wait_s": 0.2,
        "upstream_timeout_s": 1.0,
    }
    return GatewayConfig(**{**base, **over})


@pytest.fixture()
def fake() -> Iterator[FakeOllama]:
    with FakeOllama() as server:
        server.default = chat_ok("It is in west-2 [M1].", model=MODEL)
        yield server


mem = one_memory  # the one-memory store of tests/_gateway.py, as this module's ``mem`` fixture


@contextmanager
def serving(fake: FakeOllama, mem: ReMem, tmp_path: Path, **over: Any) -> Iterator[httpx.Client]:
    keys = over.pop("keys", None)
    app = create_app(_config(fake, tmp_path, **over), memory=mem, keys=keys)
    with client_of(app) as client:
        yield client


def _trace(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "trace.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------------------------------ faults
def test_a_429_is_retried_then_served(fake: FakeOllama, mem: ReMem, tmp_path: Path) -> None:
    fake.push(Reply(429, {"error": "slow down"}, headers={"Retry-After": "0"}))
    with serving(fake, mem, tmp_path) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "It is in west-2 [M1]."
        assert len(fake.requests) == 2
        assert 'remem_gateway_upstream_errors_total{kind="429"} 1' in c.get("/metrics").text


@pytest.mark.parametrize(("replies", "status", "code"), UPSTREAM_FAULTS)
def test_upstream_failures_are_clean_errors(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, replies: list[Reply], status: int, code: str
) -> None:
    fake.push(*replies)
    with serving(fake, mem, tmp_path) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert set(r.json()["error"]) == {"message", "type", "code"}
        assert fake.url not in r.text  # the upstream's address is not echoed
        if status == 429:
            assert r.headers["retry-after"].isdigit()
        o = c.post("/api/chat", json={"model": MODEL, "messages": USER, "stream": False})
        assert o.status_code == 200  # the gateway keeps serving (the script is used up: default success)
        assert o.json()["message"]["content"] == "It is in west-2 [M1]."
    (line, ok) = [ln for ln in _trace(tmp_path) if ln["kind"] == "chat"]
    assert line["error"] and line["error"].startswith("model error") and ok["error"] is None
    nothing_credited(mem)


def test_a_stream_cut_by_the_upstream_ends_with_an_error_event(fake: FakeOllama, mem: ReMem, tmp_path: Path) -> None:
    import openai

    cut = chat_stream(["It is ", "in west-2 ", "[M1]."], model=MODEL)
    cut.cut_after = 2
    fake.push(Reply(ndjson=cut.ndjson, cut_after=0), cut)  # before any byte: retried; after: an error event
    with serving(fake, mem, tmp_path) as c:
        client = openai.OpenAI(base_url=str(c.base_url) + "/v1", api_key="x", http_client=httpx.Client(trust_env=False))
        pieces = []
        with pytest.raises(openai.APIError, match="upstream"):
            for chunk in client.chat.completions.create(model=MODEL, messages=USER, stream=True):  # type: ignore[arg-type]
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        assert pieces == ["It is ", "in west-2 "] and len(fake.requests) == 2
        # Ollama front: the same cut is an {"error": ...} line
        fake.push(cut)
        with c.stream("POST", "/api/chat", json={"model": MODEL, "messages": USER}) as r:
            lines = [json.loads(x) for x in r.iter_lines() if x]
        assert r.status_code == 200 and "error" in lines[-1] and lines[0]["message"]["content"] == "It is "
        assert c.get("/healthz").json()["status"] == "ok"
        assert "remem_gateway_in_flight 0" in c.get("/metrics").text  # every stream gave its slot back
    errors = [ln["error"] for ln in _trace(tmp_path) if ln["kind"] == "chat"]
    assert len(errors) == 2 and all(e and "mid-stream" in e for e in errors)
    nothing_credited(mem)


def test_overload_is_429_with_retry_after_not_a_queue(fake: FakeOllama, mem: ReMem, tmp_path: Path) -> None:
    # a slow upstream (0.6 s, within the test timeout) and a barrier: the three calls overlap on a loaded machine
    fake.default = Reply(200, chat_ok("ok", model=MODEL).body, delay=0.6)
    limits = Limits(max_concurrency=1, max_queue=0)
    start = threading.Barrier(3)
    with serving(fake, mem, tmp_path, limits=limits) as c:
        results: list[httpx.Response] = []

        def call() -> None:
            start.wait()
            results.append(c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER}))

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r.status_code for r in results)
        assert codes[0] == 200 and codes[-1] == 429, [(r.status_code, r.text[:200]) for r in results]
        refused = next(r for r in results if r.status_code == 429)
        assert refused.headers["retry-after"] == "1" and refused.json()["error"]["code"] == "overloaded"
        assert len(fake.requests) == codes.count(200)


# -------------------------------------------------------------------------------------- bad input
def _nested(depth: int, *, key: str = "a") -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(depth):
        node = {key: node}
    return node


@pytest.fixture()
def asgi(mem: ReMem, tmp_path: Path) -> Iterator[tuple[httpx.AsyncClient, FunctionChatModel]]:
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    limits = Limits(max_body_bytes=4000, max_messages=5)
    app = create_app(_config(None, tmp_path, limits=limits), memory=mem, model=model)
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"), model


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400, "invalid_value"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user"}]}).encode(), 400, "invalid_value"),
        (
            json.dumps(
                {"model": MODEL, "messages": USER, "temperature": "hot", "options": {"temperature": 9}}
            ).encode(),
            400,
            "invalid_value",
        ),
        (json.dumps({"model": MODEL, "messages": USER, "stream": "yes"}).encode(), 400, "invalid_value"),
        (json.dumps({"model": MODEL, "messages": USER * 6}).encode(), 400, "too_many_messages"),
        (json.dumps({"model": "gpt-9", "messages": USER}).encode(), 404, "model_not_found"),
        (json.dumps({"model": 3, "messages": USER}).encode(), 400, "invalid_value"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}).encode(), 413, None),
        (b'{"model": "' + MODEL.encode() + b'", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "too_deep"),
        (json.dumps({"model": MODEL, "messages": USER, "metadata": _nested(100)}).encode(), 400, "too_deep"),
        (
            json.dumps(
                {
                    "model": MODEL,
                    "messages": USER,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "deep", "schema": _nested(200, key="items")},
                    },
                }
            ).encode(),
            400,
            "too_deep",
        ),
        (
            b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "where \\ud800 is it"}]}',
            400,
            "invalid_unicode",
        ),
        (
            b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "hi"}], "user": "\\udfff"}',
            400,
            "invalid_unicode",
        ),
    ],
    ids=[
        "malformed",
        "array",
        "messages-str",
        "no-content",
        "temperature",
        "stream",
        "too-many",
        "model",
        "model-type",
        "too-large",
        "nested-1000",
        "nested-100",
        "schema-nested-200",
        "lone-surrogate",
        "lone-surrogate-user",
    ],
)
async def test_bad_chat_requests_get_the_protocol_error_shape_and_write_nothing(
    asgi: tuple[httpx.AsyncClient, FunctionChatModel], mem: ReMem, body: bytes, status: int, code: str | None
) -> None:
    client, model = asgi
    before = mem.stats()
    for path in ("/v1/chat/completions", "/api/chat"):
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (path, r.text)
        err = r.json()["error"]
        if path == "/api/chat":
            assert isinstance(err, str) and err
        else:
            assert set(err) == {"message", "type", "code"} and (code is None or err["code"] == code)
    assert model.requests == [] and mem.stats() == before


async def test_memory_endpoints(asgi: tuple[httpx.AsyncClient, FunctionChatModel], mem: ReMem) -> None:
    client, _ = asgi
    bad = [
        ({"entity": "server"}, 400),
        ({"text": 3}, 400),
        ({"text": "x", "role": "opinion"}, 400),
        ({"text": "x", "timestamp": "yesterday-ish"}, 400),
        ({"text": "x", "colour": "red"}, 400),
    ]
    for body, status in bad:
        r = await client.post("/v1/memories", json=body)
        assert r.status_code == status and r.json()["error"]["message"], body
    assert len(mem.list()) == 1
    r = await client.post(
        "/v1/memories",
        json={
            "text": "Dana owns billing.",
            "entity": "billing",
            "attribute": "owner",
            "role": "state",
            "task": "ops",
            "timestamp": "2026-01-05",
        },
    )
    assert r.status_code == 201
    mid = r.json()["id"]
    listed = (await client.get("/v1/memories", params={"limit": 1, "offset": 1})).json()
    assert [m["id"] for m in listed["data"]] == [mid]
    assert (await client.get("/v1/memories", params={"state": "bogus"})).status_code == 400
    assert (await client.get("/v1/memories", params={"limit": "-1"})).status_code == 400
    for odd in ("١٠", "²", "１０", "1e3", " 5"):  # Unicode digits str.isdigit accepts, and other non-integers
        r = await client.get("/v1/memories", params={"limit": odd})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value", (odd, r.text)
        assert (await client.get("/v1/memories", params={"offset": odd})).status_code == 400
    info = (await client.get(f"/v1/memories/{mid}")).json()
    assert info["memory"]["state"] == "ACTIVE" and info["history"][0]["kind"] == "add"
    assert (await client.get("/v1/memories/m_nope")).status_code == 404
    assert (await client.post("/v1/feedback", json={"answer_id": "a_nope", "success": True})).status_code == 404
    assert (await client.post("/v1/feedback", json={"answer_id": "a_x", "success": "yes"})).status_code == 400
    chat = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
    aid = chat.headers["x-remem-answer-id"]
    first = await client.post("/v1/feedback", json={"answer_id": aid, "success": True})
    assert first.status_code == 200 and first.json()["repeated"] is False
    same = await client.post("/v1/feedback", json={"answer_id": aid, "success": True})
    assert same.status_code == 200 and same.json()["repeated"] is True  # the same verdict: counted once
    assert same.json()["credit"] == first.json()["credit"]
    again = await client.post("/v1/feedback", json={"answer_id": aid, "success": False})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"  # one verdict per answer
    unknown = await client.post("/v1/feedback", json={"answer_id": "a_nope", "success": True})
    assert "unknown answer_id" in unknown.json()["error"]["message"]
    stats = (await client.get("/v1/stats")).json()
    assert stats["memories"] == 2 and stats["feedbacks"] == 1
    assert (await client.get("/v1/verify")).json()["ok"] is True
    assert (await client.get("/v1/models")).json()["data"][0]["id"] == MODEL
    assert (await client.get("/api/tags")).json()["models"][0]["name"] == MODEL


async def test_response_format_is_sent_as_a_schema_and_the_reply_checked(
    asgi: tuple[httpx.AsyncClient, FunctionChatModel],
) -> None:
    client, model = asgi
    schema = {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "where", "schema": schema}}
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "response_format": fmt})
    assert model.requests[-1].json_schema == schema and model.requests[-1].schema_name == "where"
    assert r.json()["remem"]["schema_valid"] is False  # the fake's reply is prose, returned as it was
    o = await client.post("/api/chat", json={"model": MODEL, "messages": USER, "format": schema, "stream": False})
    assert model.requests[-1].json_schema == schema and o.json()["remem"]["schema_valid"] is False
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "response_format": bad})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_schema"


def test_fields_reach_an_ollama_upstream(fake: FakeOllama, mem: ReMem, tmp_path: Path) -> None:
    with serving(fake, mem, tmp_path) as c:
        c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "top_p": 0.5, "seed": 7})
        sent = fake.requests[-1].body
        assert sent["options"]["top_p"] == 0.5 and sent["options"]["seed"] == 7
        assert "temperature" not in sent["options"] and "num_predict" not in sent["options"]  # none sent: none added
        assert "Long-term memory" in sent["messages"][0]["content"] and "west-2" in sent["messages"][0]["content"]
        msgs = [
            {"role": "user", "content": "Please ping our server in its current region."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "ping", "arguments": {"region": "west-2"}}}],
            },
            {"role": "tool", "content": "pong", "tool_name": "ping"},
        ]
        tools = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
        body = {
            "model": MODEL,
            "messages": msgs,
            "tools": tools,
            "stream": False,
            "format": "json",
            "options": {"num_ctx": 2048, "temperature": 0.3},
            "keep_alive": "1m",
        }
        r = c.post("/api/chat", json=body)
        assert r.status_code == 200, r.text
        sent = fake.requests[-1].body
        assert sent["options"]["num_ctx"] == 2048 and sent["options"]["temperature"] == 0.3
        assert (
            sent["format"] == "json" and sent["keep_alive"] == "1m" and sent["tools"][0]["function"]["name"] == "ping"
        )
        assert sent["messages"][-1] == {"role": "tool", "content": "pong", "tool_name": "ping"}


# ----------------------------------------------------------------------------------- keys and scopes
def test_scope_of_a_request() -> None:
    keys = ApiKeys(KEYS)
    alice = keys.authenticate(f"Bearer {ALICE}")
    assert alice is not None and alice.key_id and ALICE not in alice.key_id
    assert request_scope({}, None, alice) == "default"  # two patterns: no implicit choice
    bob = keys.authenticate(f"Bearer {BOB}")
    assert bob is not None and request_scope({}, None, bob) == "user:bob"
    assert request_scope({"x-remem-user": "alice", "x-remem-agent": "ops"}, "ignored", alice) == "user:alice/agent:ops"
    assert request_scope({}, "carol", alice) == "user:carol"
    assert alice.may("user:alice/agent:ops") and not alice.may("user:bob") and not bob.may("user:bob/agent:x")
    assert keys.authenticate(None) is None and keys.authenticate("Bearer nope") is None
    assert keys.authenticate(f"Basic {ALICE}") is None
    with pytest.raises(ValueError, match="user"):
        request_scope({"x-remem-user": "al ice"}, None, alice)


async def test_keys_and_scopes_are_enforced(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    app = create_app(_config(None, tmp_path), memory=mem, model=model, keys=KEYS)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    body = {"model": MODEL, "messages": USER}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = await client.post("/api/chat", json=body, headers={"authorization": "Bearer wrong-key-000000000"})
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    as_bob = {"authorization": f"Bearer {BOB}"}
    for path in ("/v1/chat/completions", "/api/chat"):
        r = await client.post(path, json={**body, "stream": False}, headers={**as_bob, "x-remem-user": "alice"})
        assert r.status_code == 403, path
    r = await client.post("/v1/chat/completions", json={**body, "user": "alice"}, headers=as_bob)
    assert r.status_code == 403 and r.json()["error"]["code"] == "scope_forbidden"
    r = await client.post("/v1/memories", json={"text": "Bob's note.", "user": "alice"}, headers=as_bob)
    assert r.status_code == 403 and len(mem.list()) == 1  # nothing written
    ok = await client.post("/v1/chat/completions", json=body, headers=as_bob)
    assert ok.status_code == 200
    as_alice = {"authorization": f"Bearer {ALICE}", "x-remem-user": "alice"}
    r = await client.post(
        "/v1/feedback", json={"answer_id": ok.headers["x-remem-answer-id"], "success": True}, headers=as_alice
    )
    assert r.status_code == 403  # Bob's answer is not Alice's to judge
    assert (await client.get("/v1/verify", headers=as_alice)).status_code == 403
    assert (await client.get("/v1/verify", headers={"authorization": f"Bearer {ADMIN}"})).json()["ok"]
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/metrics")).status_code == 401


def test_a_reachable_bind_needs_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from remem_agent.cli import main

    with pytest.raises(GatewayConfigError, match="non-loopback"):
        check_bind(GatewayConfig(host="0.0.0.0"), {})
    check_bind(GatewayConfig(host="0.0.0.0"), KEYS)
    check_bind(GatewayConfig(host="::1"), {})
    assert main(["serve", "--host", "0.0.0.0", "--store", str(tmp_path / "s"), "--upstream", "http://127.0.0.1:9"]) == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err
    keyfile = tmp_path / "keys.yaml"
    keyfile.write_text(f"{ALICE}: [user:alice]\n{ADMIN}: '*'\n")
    assert load_api_keys(keyfile) == {ALICE: ("user:alice",), ADMIN: ("*",)}
    keyfile.write_text("short: [user:alice]\n")
    with pytest.raises(GatewayConfigError) as exc:
        load_api_keys(keyfile)
    assert "short" not in str(exc.value)  # a key is never put into a message


def test_the_gateway_takes_its_embedder_from_the_registry(tmp_path: Path) -> None:
    """Every registry name and alias builds what the registry builds; an unknown one lists the registry's names."""
    from remem_agent.embedders.registry import EMBEDDER_NAMES, make_embedder
    from remem_agent.errors import UserInputError
    from remem_agent.gateway.core import Gateway, _embedder

    for name in (*EMBEDDER_NAMES, "auto", "concept-hash", "ST", " torch "):
        assert _embedder(name).name == make_embedder(name).name, name  # built lazily: no model loads here
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    gw = Gateway(_config(None, tmp_path, store=str(tmp_path / "s"), embedder="concept-hash"), model=model)
    try:
        assert gw.memory.embedder.name == make_embedder("hash").name
    finally:
        asyncio.run(gw.aclose())
    with pytest.raises(GatewayConfigError) as exc:
        Gateway(_config(None, tmp_path, store=str(tmp_path / "u"), embedder="word2vec"), model=model)
    assert isinstance(exc.value, UserInputError) and "'word2vec'" in str(exc.value)
    assert all(name in str(exc.value) for name in EMBEDDER_NAMES), str(exc.value)
    assert not (tmp_path / "u").exists()  # refused before the store is opened


def test_two_keys_never_see_each_others_memories(fake: FakeOllama, tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "iso")
    try:
        with serving(fake, mem, tmp_path, keys=KEYS) as c:
            alice = {"authorization": f"Bearer {ALICE}", "x-remem-user": "alice"}
            bob = {"authorization": f"Bearer {BOB}"}
            a = c.post(
                "/v1/memories",
                json={"text": "Alice's server moved to west-2.", "entity": "server", "attribute": "region"},
                headers=alice,
            ).json()["id"]
            b = c.post(
                "/v1/memories",
                json={"text": "Bob's server is in east-1.", "entity": "server", "attribute": "region"},
                headers=bob,
            ).json()["id"]
            for headers, mine, theirs in ((alice, a, b), (bob, b, a)):
                r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER}, headers=headers)
                served = r.headers["x-remem-served"].split(",")
                assert mine in served and theirs not in served
                assert theirs not in json.dumps(fake.requests[-1].body)
                listed = c.get("/v1/memories", headers=headers).json()["data"]
                assert [m["id"] for m in listed] == [mine]
                assert c.get(f"/v1/memories/{theirs}", headers=headers).status_code == 404
    finally:
        mem.close()


async def test_concurrent_streams_release_their_slots(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    app = create_app(_config(None, tmp_path, limits=Limits(max_concurrency=2, max_queue=32)), memory=mem, model=model)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    rs = await asyncio.gather(
        *(
            client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True})
            for _ in range(6)
        )
    )
    assert all(r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") for r in rs)
    metrics = (await client.get("/metrics")).text
    assert "remem_gateway_in_flight 0" in metrics and 'stage="recall"' in metrics
    assert 'remem_gateway_requests_total{method="POST",route="/v1/chat/completions",status="200"} 6' in metrics


def test_logs_traces_and_spans_hold_no_prompt_and_no_key(
    fake: FakeOllama, mem: ReMem, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from remem_agent.agent.telemetry import OpenTelemetrySpans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    caplog.set_level(logging.DEBUG, logger="remem_agent")
    # a token no id, time or number of a log line can contain by chance (a bare "4417" once matched one)
    secret_prompt = "My locker code is QX-4417-ZV; where is our server hosted these days?"
    app = create_app(_config(fake, tmp_path), memory=mem, keys=KEYS, telemetry=OpenTelemetrySpans(provider))
    fake.push(error(500, "boom"), error(500, "boom"))  # a failure too: errors must not echo either
    with client_of(app) as c:
        headers = {"authorization": f"Bearer {BOB}"}
        msgs = [{"role": "user", "content": secret_prompt}]
        assert (
            c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs}, headers=headers).status_code == 502
        )
        assert (
            c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs}, headers=headers).status_code == 200
        )
        r = c.post("/api/chat", json={"model": MODEL, "messages": msgs}, headers=headers)
        assert r.status_code == 200 and "done" in r.text
    spans = exporter.get_finished_spans()
    assert spans
    dumped = json.dumps([{**dict(s.attributes or {}), "status": s.status.description} for s in spans], default=str)
    text = caplog.text + dumped
    for secret in ("locker code", "QX-4417-ZV", BOB):
        assert secret not in text
    assert BOB not in (tmp_path / "trace.jsonl").read_text()  # the trace keeps prompts by design, never keys
    access = [json.loads(r.getMessage()) for r in caplog.records if r.name == "remem_agent.gateway.access"]
    assert {a["status"] for a in access} == {200, 502} and all(a["key"] and a["key"].startswith("k_") for a in access)


async def test_a_client_gone_before_the_first_byte_frees_its_slots(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    app = create_app(_config(None, tmp_path, limits=Limits(max_concurrency=1, max_queue=0)), memory=mem, model=model)
    body = json.dumps({"model": MODEL, "messages": USER, "stream": True}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("gw", 80),
        "root_path": "",
        "state": {},
    }
    inbox = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        raise OSError("the client went away")

    with pytest.raises(Exception):  # noqa: B017 - starlette re-raises the disconnect in its own words
        await app(scope, receive, send)
    gw = app.state.gateway
    assert gw.gate.active == 0  # the gateway's slot is free ...
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True})
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")  # ... and so is the agent's
    first = next(ln for ln in _trace(tmp_path) if ln["kind"] == "chat")
    assert first["error"] == "the consumer stopped reading before the end"
    nothing_credited(mem)


async def test_unknown_paths_methods_and_the_strip_header(asgi: tuple[httpx.AsyncClient, FunctionChatModel]) -> None:
    client, _ = asgi
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = await client.delete("/api/chat")
    assert r.status_code == 405 and isinstance(r.json()["error"], str)
    body = {"model": MODEL, "messages": USER}
    r = await client.post("/v1/chat/completions", json=body, headers={"x-remem-strip-citations": "1"})
    assert r.json()["choices"][0]["message"]["content"] == "It is in west-2."
    assert r.json()["remem"]["citations"] == r.json()["remem"]["served"]  # stripped from the text, still credited


def test_sdk_streams_accept_the_final_remem_chunk(mem: ReMem, tmp_path: Path) -> None:
    """LangChain's and the Agents SDK's stream parsers take the extra chunk (choices: []) without a hiccup."""
    langchain_openai = pytest.importorskip("langchain_openai")
    agents = pytest.importorskip("agents")
    import openai

    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    with running(create_app(_config(None, tmp_path), memory=mem, model=model)) as base:
        llm = langchain_openai.ChatOpenAI(
            model=MODEL, base_url=base + "/v1", api_key="x", http_client=httpx.Client(trust_env=False)
        )
        assert "".join(str(c.content) for c in llm.stream("Where is our server hosted these days?")).startswith("It is")

        async def run() -> str:
            client = openai.AsyncOpenAI(
                base_url=base + "/v1", api_key="x", http_client=httpx.AsyncClient(trust_env=False)
            )
            agent = agents.Agent(name="ops", model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
            result = agents.Runner.run_streamed(agent, "Where is our server hosted these days?")
            async for _ in result.stream_events():
                pass
            await client.close()
            return str(result.final_output)

        agents.set_tracing_disabled(True)
        assert asyncio.run(run()) == "It is in west-2 [M1]."


def test_without_the_extra_the_import_error_names_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "import sys; sys.modules['starlette'] = None\nimport remem_agent.gateway"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and "pip install 'remem-agent[gateway]'" in out.stderr
    cli = "import sys; sys.modules['starlette'] = None\nfrom remem_agent.cli import main\n"
    cli += "raise SystemExit(main(['serve']))"
    out = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "remem-agent[gateway]" in out.stderr


async def test_a_superseding_fact_fails_the_waiting_answer(asgi: tuple[httpx.AsyncClient, FunctionChatModel]) -> None:
    client, _ = asgi
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
    (served,) = r.json()["remem"]["served"]
    fact = {"text": "Our server moved to east-3.", "entity": "server", "attribute": "region"}
    assert (await client.post("/v1/memories", json=fact)).status_code == 201
    info = (await client.get(f"/v1/memories/{served}")).json()
    assert info["memory"]["state"] == "INVALIDATED"
    (credit,) = info["credits"]
    assert credit["success"] is False and credit["blame"] > 0  # inferred from the correction, through the API
    late = await client.post("/v1/feedback", json={"answer_id": r.headers["x-remem-answer-id"], "success": True})
    assert late.status_code == 409  # already judged (failed by the correction): another verdict conflicts
    bad = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER},
        headers={"x-remem-conversation": "no spaces allowed"},
    )
    assert bad.status_code == 400


class _SlowStream:
    """A streaming ChatModel that sends a piece every 0.3 s, forever (until closed)."""

    name, adapter = MODEL, "slow"
    capabilities = Capabilities(tools=True, streaming=True)

    def __init__(self) -> None:
        self.closed = False

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(text="unused")

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        try:
            while True:
                yield StreamChunk(text="la ")
                await asyncio.sleep(0.3)
        finally:
            self.closed = True


async def test_a_stream_longer_than_the_limit_ends_with_an_error(mem: ReMem, tmp_path: Path) -> None:
    model = _SlowStream()
    app = create_app(_config(None, tmp_path, limits=Limits(max_stream_seconds=1.0)), memory=mem, model=model)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True})
    events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    assert events[-1]["error"]["code"] == "stream_timeout" and "[DONE]" not in r.text
    assert 2 <= sum(1 for e in events if e.get("choices")) <= 6 and model.closed
    o = await client.post("/api/chat", json={"model": MODEL, "messages": USER})
    assert json.loads(o.text.splitlines()[-1])["error"].startswith("the stream exceeded")
    assert app.state.gateway.gate.active == 0
    nothing_credited(mem)


async def test_identical_requests_get_their_own_answer_ids(asgi: tuple[httpx.AsyncClient, FunctionChatModel]) -> None:
    client, _ = asgi
    first, second = [await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER}) for _ in "ab"]
    ids = [r.headers["x-remem-answer-id"] for r in (first, second)]
    assert ids[0] != ids[1] and [r.json()["remem"]["answer_id"] for r in (first, second)] == ids
    assert first.json()["id"] != second.json()["id"]  # the completion id carries the answer id
    # the follow-up of the second settles the second: the first still takes its own verdict
    said = second.json()["choices"][0]["message"]["content"]
    turn2 = [*USER, {"role": "assistant", "content": said}, {"role": "user", "content": "No, that's wrong."}]
    assert (await client.post("/v1/chat/completions", json={"model": MODEL, "messages": turn2})).status_code == 200
    late = await client.post("/v1/feedback", json={"answer_id": ids[1], "success": True})
    assert late.status_code == 409  # judged by the correction
    assert (await client.post("/v1/feedback", json={"answer_id": ids[0], "success": True})).status_code == 200


def _server_timing(value: str) -> dict[str, float]:
    out = {}
    for part in value.split(","):
        name, *params = (p.strip() for p in part.split(";"))
        out[name] = float(next(p for p in params if p.startswith("dur="))[4:])
    return out


def test_every_chat_reply_says_the_gateways_own_time(fake: FakeOllama, mem: ReMem, tmp_path: Path) -> None:
    with serving(fake, mem, tmp_path) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
        timing = _server_timing(r.headers["server-timing"])
        assert set(timing) == {"remem", "upstream"} and min(timing.values()) >= 0 and timing["upstream"] > 0
        fake.push(chat_stream(["It is ", "in west-2 [M1]."]))
        with c.stream("POST", "/api/chat", json={"model": MODEL, "messages": USER}) as s:
            assert set(_server_timing(s.headers["server-timing"])) == {"remem", "upstream"}
            list(s.iter_lines())
        bad = c.post("/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
        assert bad.status_code == 400 and "server-timing" not in bad.headers  # nothing was timed


async def test_openapi_lists_every_route_the_app_serves(asgi: tuple[httpx.AsyncClient, FunctionChatModel]) -> None:
    from starlette.routing import Route

    from remem_agent.gateway.openapi import OPERATIONS

    client, _ = asgi
    r = await client.get("/openapi.json")  # public: no key needed even when keys are configured
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "remem gateway"
    served = {
        (m, re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path))  # Starlette's "{scope:path}": OpenAPI's "{scope}"
        for route in client._transport.app.routes  # type: ignore[attr-defined]
        if isinstance(route, Route)
        for m in (route.methods or set()) - {"HEAD"}
    }
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == served == set(OPERATIONS)  # no route undocumented, no document of a route not served
    chat = doc["paths"]["/v1/messages"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "model",
        "max_tokens",
        "messages",
    ]
    assert "x-remem-answer-id" in chat["responses"]["200"]["headers"]
    assert chat["responses"]["4XX"]["content"]["application/json"]["schema"]["properties"]["type"] == {"const": "error"}
    assert doc["paths"]["/readyz"]["get"]["security"] == []


async def test_an_ollama_client_gives_feedback_by_its_conversation(
    asgi: tuple[httpx.AsyncClient, FunctionChatModel],
) -> None:
    import ollama

    client, _ = asgi
    app = client._transport.app  # type: ignore[attr-defined]
    chat = ollama.AsyncClient(host="http://gw", transport=httpx.ASGITransport(app=app),
                              headers={"x-remem-conversation": "ops-7"})  # fmt: skip
    part = await chat.chat(model=MODEL, messages=USER)
    assert part.message.content  # the client keeps no remem field and no header: the conversation names it
    ok = await client.post("/v1/feedback", json={"conversation": "ops-7", "success": True})
    assert ok.status_code == 200 and ok.json()["source"] == "user"
    again = await client.post("/v1/feedback", json={"conversation": "ops-7", "success": True})
    assert again.status_code == 404 and "conversation" in again.json()["error"]["message"]  # nothing waits now
    both = await client.post("/v1/feedback", json={"conversation": "ops-7", "answer_id": "a_1", "success": True})
    assert both.status_code == 400
    bad = await client.post("/v1/feedback", json={"conversation": "no spaces", "success": True})
    assert bad.status_code == 400


@pytest.mark.parametrize("capture", [True, False])
async def test_capture_corrections_keeps_the_users_value_in_the_callers_scope(
    mem: ReMem, tmp_path: Path, capture: bool
) -> None:
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
    app = create_app(_config(None, tmp_path, capture_corrections=capture), memory=mem, model=model)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    first = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
    said = first.json()["choices"][0]["message"]["content"]
    turn2 = [*USER, {"role": "assistant", "content": said}, {"role": "user", "content": "No, it's eu-central-1."}]
    second = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": turn2})
    assert second.status_code == 200
    texts = [m.text for m in mem.list()]
    kept = "server region: eu-central-1 (the user's correction of: Our server moved to west-2.)"
    assert (kept in texts) is capture and len(texts) == 1 + capture
    # the correction is kept before the turn's own recall: that recall serves it, and not the replaced fact
    now = {m.text: m.id for m in mem.list(state="ACTIVE")}
    assert second.json()["remem"]["served"] == [now[kept] if capture else now["Our server moved to west-2."]]
    assert mem.verify().ok
