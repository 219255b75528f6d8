"""OpenAIChat over the real ``openai.AsyncOpenAI`` SDK.

Most tests answer through an in-process ``httpx.MockTransport`` (no network). One end-to-end test starts a
real ``llama_cpp.server`` with SmolLM2-135M on 127.0.0.1 and checks that a schema-constrained answer validates.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from _llama_server import llama_server as start_llama_server  # noqa: E402
from _llama_server import needs_llama_server  # noqa: E402

from remem_agent.adapters import ChatModel, ChatRequest, Message, RetryPolicy, call_with_retries  # noqa: E402
from remem_agent.adapters.openai_chat import OpenAIChat, parse_retry_after  # noqa: E402
from remem_agent.errors import ModelError, UserInputError  # noqa: E402

API_KEY = "sk-test-SECRET-9d1e44c0b7a2"
BASE = "http://llm.test/v1"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["title", "tags"],
    "additionalProperties": False,
}
POLICY = RetryPolicy(max_attempts=4, initial_backoff=0.5, max_backoff=5.0)
LLAMA_500_BODY = {
    "error": {
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
        "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}

Handler = Callable[[httpx.Request], httpx.Response]


def completion(content: str = '{"title": "cats", "tags": []}', finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test-2024",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 8, "total_tokens": 29},
    }


def ok(content: str = '{"title": "cats", "tags": []}', finish_reason: str = "stop") -> Handler:
    return lambda request: httpx.Response(200, json=completion(content, finish_reason))


def status(code: int, body: Any, headers: dict[str, str] | None = None) -> Handler:
    return lambda request: httpx.Response(code, json=body, headers=headers)


def read_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("read timed out", request=request)


class Recorder:
    """A scripted server: request n is answered by handler n (the last one repeats)."""

    def __init__(self, *handlers: Handler) -> None:
        self.handlers = list(handlers)
        self.requests: list[httpx.Request] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
            handler = self.handlers[min(len(self.requests) - 1, len(self.handlers) - 1)]
        return handler(request)

    def body(self, i: int) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.requests[i].content)
        return parsed


class SleepRecorder:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


Factory = Callable[..., OpenAIChat]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., OpenAIChat]]:
    """``make(recorder, **kwargs)``: an OpenAIChat whose HTTP goes to ``recorder``; closed after the test."""
    clients: list[httpx.AsyncClient] = []

    def factory(recorder: Recorder, **kwargs: Any) -> OpenAIChat:
        http_client = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
        clients.append(http_client)
        kwargs.setdefault("base_url", BASE)
        kwargs.setdefault("api_key", API_KEY)
        return OpenAIChat("gpt-test", http_client=http_client, **kwargs)

    yield factory
    for client in clients:
        await client.aclose()


def ask(**kwargs: Any) -> ChatRequest:
    base: dict[str, Any] = {
        "messages": (Message("system", "answer in JSON"), Message("user", "a note about cats")),
        "json_schema": SCHEMA,
        "temperature": 0.2,
        "max_tokens": 64,
        "seed": 7,
    }
    base.update(kwargs)
    return ChatRequest(**base)


# --------------------------------------------------------------------------- MockTransport tests
async def test_success_sends_json_schema_response_format(make: Factory) -> None:
    rec = Recorder(ok())
    chat = make(rec, schema_mode="json_schema")
    assert isinstance(chat, ChatModel)
    assert chat.adapter == "openai" and chat.name == "gpt-test"
    assert chat.capabilities.native_json_schema

    resp = await chat.complete(ask(stop=("END",), schema_name="cat note!"))

    (req,) = rec.requests
    assert req.method == "POST"
    assert str(req.url) == f"{BASE}/chat/completions"
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    body = rec.body(0)
    assert body["model"] == "gpt-test"
    assert body["messages"] == [
        {"role": "system", "content": "answer in JSON"},
        {"role": "user", "content": "a note about cats"},
    ]
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64 and body["seed"] == 7
    assert body["stop"] == ["END"]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "cat_note_", "schema": SCHEMA, "strict": True},
    }
    assert resp.text == '{"title": "cats", "tags": []}'
    assert resp.finish_reason == "stop"
    assert resp.usage.prompt_tokens == 21 and resp.usage.completion_tokens == 8
    assert resp.model == "gpt-test-2024"


async def test_non_strict_schema_and_plain_requests(make: Factory) -> None:
    rec = Recorder(ok())
    chat = make(rec)
    loose = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]}
    await chat.complete(ask(json_schema=loose))
    assert rec.body(0)["response_format"]["json_schema"]["strict"] is False
    await chat.complete(ask(json_schema=None, seed=None, max_tokens=None))
    plain = rec.body(1)
    assert "response_format" not in plain and "seed" not in plain and "max_tokens" not in plain
    assert "stop" not in plain


async def test_json_object_schema_mode_sends_llama_cpp_dialect(make: Factory) -> None:
    rec = Recorder(ok())
    await make(rec, schema_mode="json_object_schema").complete(ask())
    assert rec.body(0)["response_format"] == {"type": "json_object", "schema": SCHEMA}


async def test_429_retry_after_is_honoured_by_the_retry_layer(make: Factory) -> None:
    rec = Recorder(status(429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": "7"}), ok())
    chat = make(rec)
    sleep = SleepRecorder()
    errors: list[ModelError] = []
    resp = await call_with_retries(
        lambda: chat.complete(ask()), POLICY, sleep=sleep, on_retry=lambda n, exc, d: errors.append(exc)
    )
    assert resp.text == '{"title": "cats", "tags": []}'
    assert sleep.waits == [7.0]
    assert len(rec.requests) == 2
    (exc,) = errors
    assert exc.status == 429 and exc.retryable and exc.retry_after == 7.0
    assert "Rate limit reached" in (exc.body or "")


async def test_429_with_http_date_retry_after(make: Factory) -> None:
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    rec = Recorder(status(429, {"error": {"message": "slow down"}}, {"Retry-After": when}))
    with pytest.raises(ModelError) as info:
        await make(rec).complete(ask())
    assert info.value.retryable
    assert info.value.retry_after is not None and 27.0 <= info.value.retry_after <= 30.0


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "garbage"}) is None
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None


async def test_500_then_success(make: Factory) -> None:
    rec = Recorder(status(500, {"error": {"message": "upstream overloaded"}}), ok())
    chat = make(rec)
    sleep = SleepRecorder()
    errors: list[ModelError] = []
    resp = await call_with_retries(
        lambda: chat.complete(ask()),
        POLICY,
        sleep=sleep,
        on_retry=lambda n, exc, d: errors.append(exc),
        rng=random.Random(3),
    )
    assert resp.finish_reason == "stop"
    assert len(rec.requests) == 2
    assert len(sleep.waits) == 1 and 0.0 <= sleep.waits[0] <= POLICY.initial_backoff
    assert errors[0].status == 500 and errors[0].retryable and errors[0].retry_after is None


async def test_adapter_does_not_retry_by_itself(make: Factory) -> None:
    """The SDK's own retries are off: one complete() is exactly one HTTP request, even on 5xx/429."""
    for handler in (status(503, {"error": {"message": "busy"}}), status(429, {"error": {"message": "x"}})):
        rec = Recorder(handler)
        with pytest.raises(ModelError) as info:
            await make(rec).complete(ask())
        assert info.value.retryable
        assert len(rec.requests) == 1
        assert rec.requests[0].headers.get("x-stainless-retry-count") in (None, "0")


async def test_given_client_is_used_without_sdk_retries() -> None:
    rec = Recorder(status(502, {"error": {"message": "bad gateway"}}))
    async with httpx.AsyncClient(transport=httpx.MockTransport(rec)) as http_client:
        sdk = openai.AsyncOpenAI(api_key=API_KEY, base_url=BASE, http_client=http_client, max_retries=5)
        chat = OpenAIChat("gpt-test", client=sdk)
        with pytest.raises(ModelError) as info:
            await chat.complete(ask())
    assert info.value.status == 502
    assert len(rec.requests) == 1
    with pytest.raises(UserInputError):
        OpenAIChat("gpt-test", client=sdk, api_key="x")


async def test_timeout_is_a_retryable_model_error(make: Factory) -> None:
    rec = Recorder(read_timeout)
    with pytest.raises(ModelError) as info:
        await make(rec).complete(ask())
    exc = info.value
    assert exc.retryable and exc.status is None
    assert "timed out" in str(exc)
    assert isinstance(exc.__cause__, openai.APITimeoutError)
    assert len(rec.requests) == 1


async def test_connection_error_is_retryable(make: Factory) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ModelError) as info:
        await make(Recorder(refuse)).complete(ask())
    assert info.value.retryable
    assert isinstance(info.value.__cause__, openai.APIConnectionError)


async def test_401_fails_fast_with_status_and_body(make: Factory) -> None:
    rec = Recorder(status(401, {"error": {"message": "Invalid authentication", "code": "invalid_api_key"}}), ok())
    chat = make(rec)
    sleep = SleepRecorder()
    with pytest.raises(ModelError) as info:
        await call_with_retries(lambda: chat.complete(ask()), POLICY, sleep=sleep)
    exc = info.value
    assert exc.status == 401 and not exc.retryable
    assert exc.body is not None and json.loads(exc.body)["error"]["code"] == "invalid_api_key"
    assert "401" in str(exc)
    assert isinstance(exc.__cause__, openai.AuthenticationError)
    assert len(rec.requests) == 1
    assert sleep.waits == []


async def test_auto_mode_falls_back_to_json_object_schema_and_remembers(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    def llama_like(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["response_format"]["type"] == "json_schema":
            return httpx.Response(500, json=LLAMA_500_BODY)
        return httpx.Response(200, json=completion())

    rec = Recorder(llama_like)
    chat = make(rec)
    assert chat.schema_mode == "json_schema"
    with caplog.at_level(logging.DEBUG):
        resp = await chat.complete(ask())
    assert resp.text == '{"title": "cats", "tags": []}'
    assert [rec.body(i)["response_format"]["type"] for i in range(2)] == ["json_schema", "json_object"]
    assert rec.body(1)["response_format"]["schema"] == SCHEMA
    assert chat.schema_mode == "json_object_schema"
    assert API_KEY not in caplog.text

    await chat.complete(ask())  # remembered: straight to json_object
    assert len(rec.requests) == 3
    assert rec.body(2)["response_format"]["type"] == "json_object"


async def test_fallback_only_in_auto_mode_and_only_for_schema_rejections(make: Factory) -> None:
    rec = Recorder(status(500, LLAMA_500_BODY))
    with pytest.raises(ModelError) as info:
        await make(rec, schema_mode="json_schema").complete(ask())
    assert info.value.status == 500 and len(rec.requests) == 1

    rec = Recorder(status(500, {"error": {"message": "CUDA out of memory"}}), ok())
    chat = make(rec)
    with pytest.raises(ModelError):
        await chat.complete(ask())
    assert len(rec.requests) == 1 and chat.schema_mode == "json_schema"

    rec = Recorder(
        status(400, {"error": {"message": "Invalid parameter: 'response_format' of type 'json_schema'"}}), ok()
    )
    chat = make(rec)
    await chat.complete(ask())
    assert len(rec.requests) == 2 and chat.schema_mode == "json_object_schema"


async def test_truncation_is_reported(make: Factory) -> None:
    rec = Recorder(ok('{"title": "ca', finish_reason="length"), ok("x", finish_reason="content_filter"))
    chat = make(rec)
    resp = await chat.complete(ask())
    assert resp.finish_reason == "length"
    assert resp.text == '{"title": "ca'
    assert (await chat.complete(ask())).finish_reason == "other"


async def test_api_key_never_leaks(make: Factory) -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {API_KEY}.", "code": "invalid_api_key"}}
    rec = Recorder(status(401, echo))
    chat = make(rec)
    assert API_KEY not in repr(chat) and API_KEY not in str(chat)
    with pytest.raises(ModelError) as info:
        await chat.complete(ask())
    exc = info.value
    for text in (str(exc), repr(exc), exc.body or "", repr(exc.args)):
        assert API_KEY not in text
    assert "[redacted]" in (exc.body or "")
    assert rec.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # it was sent, just never shown


async def test_defaults_from_environment(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env-host.test/v9")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    rec = Recorder(ok())
    await make(rec, base_url=None, api_key=None).complete(ask())
    assert str(rec.requests[0].url) == "http://env-host.test/v9/chat/completions"
    assert rec.requests[0].headers["authorization"] == "Bearer sk-from-env"

    monkeypatch.delenv("OPENAI_API_KEY")
    await make(rec, api_key=None).complete(ask())
    assert rec.requests[1].headers["authorization"] == "Bearer sk-no-key"


def test_bad_arguments() -> None:
    with pytest.raises(UserInputError):
        OpenAIChat("")
    with pytest.raises(UserInputError):
        OpenAIChat("m", schema_mode="grammar")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- real llama_cpp.server
@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    """A real ``llama_cpp.server`` with SmolLM2-135M on 127.0.0.1; yields its ``/v1`` base URL."""
    with start_llama_server("chatml") as base:
        yield base


@needs_llama_server
async def test_end_to_end_schema_answer_from_real_llama_cpp_server(llama_server: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as http_client:
        chat = OpenAIChat(
            "smollm2-135m", base_url=llama_server, api_key="sk-no-key", http_client=http_client, schema_mode="auto"
        )
        request = ChatRequest(
            messages=(
                Message("system", "You answer with JSON only."),
                Message("user", "Give a short title and up to three tags for a note about cats."),
            ),
            json_schema=SCHEMA,
            temperature=0.0,
            max_tokens=200,
            seed=0,
        )
        resp = await chat.complete(request)
        # llama_cpp.server answered json_schema with HTTP 500, so auto mode switched dialects.
        assert chat.schema_mode == "json_object_schema"
        assert resp.finish_reason == "stop", resp
        answer = json.loads(resp.text)
        jsonschema.validate(answer, SCHEMA)
        assert resp.usage.completion_tokens and resp.usage.completion_tokens > 0

        again = await chat.complete(request)  # remembered dialect: one request, still valid
        jsonschema.validate(json.loads(again.text), SCHEMA)
