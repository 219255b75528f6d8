"""Malformed HTTP-200 bodies from model servers, for every HTTP adapter, against a real loopback HTTP server.

Each case must end in a typed error (``ModelError``; for the embedder, ``EmbeddingError`` when the JSON is
well formed but its vectors are not), with a bounded number of requests through the one retry layer, and
``MemoryAgent.ask`` must raise ``ModelError`` and still write its trace line.

Which malformed bodies are retryable (documented in the adapters): only a JSON ``{"error": ...}`` object
sent with status 200 (routers report upstream failures so). A body that is not JSON (an HTML page, an
empty body) or JSON of another shape comes back the same on every attempt: not retryable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ollama_server import FakeOllama, Reply

from remem_agent.adapters import ChatRequest, Message, RetryPolicy, call_with_retries
from remem_agent.errors import EmbeddingError, ModelError

POLICY = RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.0)
HTML = "<!doctype html><html><head><title>Sign in</title></head><body>Proxy login</body></html>"


def _completion(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    }
    body.update(over)
    return body


def _choice(message: Any) -> dict[str, Any]:
    return _completion(choices=[{"index": 0, "message": message, "finish_reason": "stop"}])


# case -> (reply, retryable)
OPENAI_CASES: dict[str, tuple[Reply, bool]] = {
    "not json (text/plain)": (Reply(200, "this is not json"), False),
    "not json (declared application/json)": (Reply(200, "{not json", content_type="application/json"), False),
    "html page": (Reply(200, HTML, content_type="text/html; charset=utf-8"), False),
    "empty body": (Reply(200, "", content_type="application/json"), False),
    "json list": (Reply(200, "[1, 2]", content_type="application/json"), False),
    "json string": (Reply(200, '"ok"', content_type="application/json"), False),
    "no choices key": (Reply(200, {"id": "x", "object": "chat.completion"}), False),
    "empty choices": (Reply(200, _completion(choices=[])), False),
    "choices null": (Reply(200, _completion(choices=None)), False),
    "choice is a string": (Reply(200, _completion(choices=["hello"])), False),
    "choice without message": (Reply(200, _completion(choices=[{"index": 0, "finish_reason": "stop"}])), False),
    "message null": (Reply(200, _choice(None)), False),
    "message is a string": (Reply(200, _choice("hello")), False),
    "content is a number": (Reply(200, _choice({"role": "assistant", "content": 42})), False),
    "content is a list": (Reply(200, _choice({"role": "assistant", "content": [{"type": "text"}]})), False),
    "content is an object": (Reply(200, _choice({"role": "assistant", "content": {"a": 1}})), False),
    "error object with 200": (Reply(200, {"error": {"message": "upstream overloaded", "code": 502}}), True),
}

OLLAMA_CASES: dict[str, tuple[Reply, bool]] = {
    "not json (text/plain)": (Reply(200, "this is not json"), False),
    "not json (declared application/json)": (Reply(200, "{not json", content_type="application/json"), False),
    "html page": (Reply(200, HTML, content_type="text/html; charset=utf-8"), False),
    "empty body": (Reply(200, "", content_type="application/json"), False),
    "json list": (Reply(200, "[1, 2]", content_type="application/json"), False),
    "empty object": (Reply(200, {}), False),
    "no message": (Reply(200, {"model": "m", "done": True}), False),
    "message null": (Reply(200, {"model": "m", "done": True, "message": None}), False),
    "message is a string": (Reply(200, {"model": "m", "done": True, "message": "hi"}), False),
    "content is a number": (Reply(200, {"model": "m", "done": True, "message": {"role": "a", "content": 42}}), False),
    "content is a list": (Reply(200, {"model": "m", "done": True, "message": {"role": "a", "content": [1]}}), False),
    "error object with 200": (Reply(200, {"error": "model runner crashed"}), True),
}

# case -> (reply, expected error type, retryable)
EMBED_CASES: dict[str, tuple[Reply, type[Exception], bool]] = {
    "not json": (Reply(200, "nope"), ModelError, False),
    "html page": (Reply(200, HTML, content_type="text/html"), ModelError, False),
    "empty body": (Reply(200, "", content_type="application/json"), ModelError, False),
    "json list": (Reply(200, "[1]", content_type="application/json"), ModelError, False),
    "data null": (Reply(200, {"data": None}), ModelError, False),
    "error object with 200": (Reply(200, {"error": {"message": "overloaded"}}), ModelError, True),
    "item is a string": (Reply(200, {"data": ["x"]}), ModelError, False),
    "bad index": (Reply(200, {"data": [{"index": "0", "embedding": [1.0, 0.0, 0.0]}]}), ModelError, False),
    "embedding null": (Reply(200, {"data": [{"index": 0, "embedding": None}]}), EmbeddingError, False),
    "embedding is a string": (Reply(200, {"data": [{"index": 0, "embedding": "abc"}]}), EmbeddingError, False),
    "nested embedding": (Reply(200, {"data": [{"index": 0, "embedding": [[1.0]]}]}), EmbeddingError, False),
    "wrong width": (Reply(200, {"data": [{"index": 0, "embedding": [1.0, 2.0]}]}), EmbeddingError, False),
}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OLLAMA_API_KEY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server() -> Iterator[FakeOllama]:
    with FakeOllama(paths=("/v1/chat/completions", "/api/chat", "/v1/embeddings")) as fake:
        yield fake


def _request() -> ChatRequest:
    return ChatRequest(messages=(Message("user", "where is the server?"),), max_tokens=16)


async def _no_sleep(seconds: float) -> None:
    return None


def _script(server: FakeOllama, reply: Reply, n: int) -> None:
    """Answer the next ``n`` requests with ``reply`` (the default success would hide an unbounded retry)."""
    server.push(*[reply] * n)


@pytest.mark.parametrize("case", list(OPENAI_CASES))
async def test_openai_malformed_body_is_a_typed_bounded_model_error(server: FakeOllama, case: str) -> None:
    pytest.importorskip("openai")
    from remem_agent.adapters.openai_chat import OpenAIChat

    reply, retryable = OPENAI_CASES[case]
    _script(server, reply, POLICY.max_attempts + 2)
    async with OpenAIChat("m", base_url=server.url + "/v1", api_key="sk-test-loopback-key") as chat:
        with pytest.raises(ModelError) as info:
            await call_with_retries(lambda: chat.complete(_request()), POLICY, sleep=_no_sleep)
    err = info.value
    assert type(err) is ModelError and err.retryable is retryable and err.status == 200
    assert "HTTP 200" in str(err) and "sk-test-loopback-key" not in str(err)
    assert len(server.requests) == (POLICY.max_attempts if retryable else 1)  # bounded: no endless retry


@pytest.mark.parametrize("case", list(OLLAMA_CASES))
async def test_ollama_malformed_body_is_a_typed_bounded_model_error(server: FakeOllama, case: str) -> None:
    pytest.importorskip("ollama")
    from remem_agent.adapters.ollama_chat import OllamaChat

    reply, retryable = OLLAMA_CASES[case]
    _script(server, reply, POLICY.max_attempts + 2)
    async with OllamaChat("m", host=server.url) as chat:
        with pytest.raises(ModelError) as info:
            await call_with_retries(lambda: chat.complete(_request()), POLICY, sleep=_no_sleep)
    err = info.value
    assert type(err) is ModelError and err.retryable is retryable and err.status == 200
    assert "HTTP 200" in str(err)
    assert len(server.requests) == (POLICY.max_attempts if retryable else 1)


@pytest.mark.parametrize("case", list(EMBED_CASES))
def test_embedder_malformed_body_is_typed_and_bounded(server: FakeOllama, case: str) -> None:
    from remem_agent.embedders.openai_compat import OpenAIEmbedder

    reply, kind, retryable = EMBED_CASES[case]
    _script(server, reply, 8)
    emb = OpenAIEmbedder("m", base_url=server.url + "/v1", dim=3, max_attempts=3, sleep=lambda s: None)
    with emb, pytest.raises(kind) as info:
        emb.embed(["a note"])
    assert type(info.value) is kind
    assert len(server.requests) == (3 if retryable else 1)  # its own bounded retries (max_attempts=3)


def _openai_chat(server: FakeOllama) -> Any:
    pytest.importorskip("openai")
    from remem_agent.adapters.openai_chat import OpenAIChat

    return OpenAIChat("m", base_url=server.url + "/v1", api_key="sk-none")


def _ollama_chat(server: FakeOllama) -> Any:
    pytest.importorskip("ollama")
    from remem_agent.adapters.ollama_chat import OllamaChat

    return OllamaChat("m", host=server.url)


@pytest.mark.parametrize("adapter", ["openai", "ollama"])
@pytest.mark.parametrize("case", ["html page", "error object with 200"])
async def test_memory_agent_raises_model_error_and_writes_a_trace_line(
    server: FakeOllama, tmp_path: Path, adapter: str, case: str
) -> None:
    from remem_agent import ReMem
    from remem_agent.agent import MemoryAgent

    reply, retryable = (OPENAI_CASES if adapter == "openai" else OLLAMA_CASES)[case]
    _script(server, reply, POLICY.max_attempts + 2)
    model = _openai_chat(server) if adapter == "openai" else _ollama_chat(server)
    trace_path = tmp_path / "trace.jsonl"
    mem = ReMem(tmp_path / "store")
    try:
        mem.add("Our server is in west-2.", entity="server", attribute="region")
        agent = MemoryAgent(mem, model, trace=trace_path, retry=POLICY)
        with pytest.raises(ModelError) as info:
            await agent.ask("Where is our server?", task="ops")
        assert info.value.status == 200
        lines = trace_path.read_text().splitlines()
        assert len(lines) == 1
        record = json.loads(lines[0])
        assert record["error"].startswith("model error:") and "HTTP 200" in record["error"]
        assert record["answer"] is None and record["served"]  # the recall happened, the call failed
        retries = record["attempts"][0]["retries"]
        assert len(retries) == (POLICY.max_attempts - 1 if retryable else 0)
        assert len(server.requests) == (POLICY.max_attempts if retryable else 1)
        assert mem.verify().ok
    finally:
        await model.aclose()
        mem.close()
