"""OllamaChat driven through the real ``ollama.AsyncClient`` against a loopback fake Ollama server."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("ollama")

from _ollama_server import FakeOllama, Reply, chat_ok, closed_port_url, error

from remem_agent.adapters import ChatModel, ChatRequest, Message, RetryPolicy, call_with_retries
from remem_agent.adapters.ollama_chat import OllamaChat
from remem_agent.errors import ModelError, UserInputError

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["title", "tags"],
    "additionalProperties": False,
}
POLICY = RetryPolicy(max_attempts=4, initial_backoff=0.5, max_backoff=5.0)


def ask(**kwargs: object) -> ChatRequest:
    base: dict[str, object] = {
        "messages": (Message("system", "be terse"), Message("user", "title and tags for a cat note")),
        "json_schema": SCHEMA,
        "temperature": 0.3,
        "max_tokens": 77,
        "seed": 42,
    }
    base.update(kwargs)
    return ChatRequest(**base)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback traffic must never be routed through a proxy from the environment."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)


@pytest.fixture
def server() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        yield fake


Factory = Callable[..., OllamaChat]


@pytest.fixture
async def make() -> AsyncIterator[Factory]:
    """Build OllamaChat adapters and close them (and their HTTP pools) after the test."""
    made: list[OllamaChat] = []

    def factory(model: str = "m", **kwargs: Any) -> OllamaChat:
        chat = OllamaChat(model, **kwargs)
        made.append(chat)
        return chat

    yield factory
    for chat in made:
        await chat.aclose()


class SleepRecorder:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_request_carries_schema_and_options_and_response_is_mapped(server: FakeOllama, make: Factory) -> None:
    answer = '{"title": "cats", "tags": ["pet"]}'
    server.push(chat_ok(answer, model="llama-test:1b", prompt_eval_count=13, eval_count=9))
    chat = make("llama-test:1b", host=server.url, keep_alive="3m", options={"num_ctx": 1024, "seed": 1})
    assert isinstance(chat, ChatModel)
    assert chat.adapter == "ollama" and chat.name == "llama-test:1b"
    assert chat.capabilities.native_json_schema

    resp = await chat.complete(ask(stop=("\n\n",)))

    (req,) = server.requests
    assert req.path == "/api/chat"
    body = req.body
    assert body["model"] == "llama-test:1b"
    assert body["stream"] is False
    assert body["format"] == SCHEMA
    assert body["messages"] == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "title and tags for a cat note"},
    ]
    # request settings override the adapter's options; the other options pass through
    assert body["options"] == {"num_ctx": 1024, "seed": 42, "temperature": 0.3, "num_predict": 77, "stop": ["\n\n"]}
    assert body["keep_alive"] == "3m"
    assert resp.text == answer
    assert resp.finish_reason == "stop"
    assert resp.usage.prompt_tokens == 13 and resp.usage.completion_tokens == 9
    assert resp.model == "llama-test:1b"
    assert resp.latency_ms > 0
    await chat.aclose()


async def test_plain_request_sends_no_format(server: FakeOllama, make: Factory) -> None:
    chat = make("m", host=server.url)
    resp = await chat.complete(ask(json_schema=None, seed=None, max_tokens=None))
    body = server.requests[0].body
    assert "format" not in body
    assert body["options"] == {"temperature": 0.3}
    assert resp.text == '{"ok": true}'


async def test_503_then_success_through_the_retry_layer(server: FakeOllama, make: Factory) -> None:
    server.push(error(503, "server busy, please retry"), chat_ok("done"))
    chat = make("m", host=server.url)
    sleep = SleepRecorder()
    retried: list[ModelError] = []
    resp = await call_with_retries(
        lambda: chat.complete(ask()),
        POLICY,
        sleep=sleep,
        on_retry=lambda attempt, exc, delay: retried.append(exc),
        rng=random.Random(0),
    )
    assert resp.text == "done"
    assert len(server.requests) == 2
    assert len(sleep.waits) == 1 and 0.0 <= sleep.waits[0] <= POLICY.initial_backoff
    (exc,) = retried
    assert exc.status == 503 and exc.retryable
    assert exc.body == "server busy, please retry"


async def test_429_is_retryable_and_retried_until_attempts_run_out(server: FakeOllama, make: Factory) -> None:
    server.default = error(429, "too many requests")
    chat = make("m", host=server.url)
    with pytest.raises(ModelError) as info:
        await chat.complete(ask())
    assert info.value.status == 429 and info.value.retryable
    assert len(server.requests) == 1  # the adapter itself never retries

    sleep = SleepRecorder()
    with pytest.raises(ModelError):
        await call_with_retries(lambda: chat.complete(ask()), POLICY, sleep=sleep, rng=random.Random(0))
    assert len(server.requests) == 1 + POLICY.max_attempts
    assert len(sleep.waits) == POLICY.max_attempts - 1


async def test_400_is_not_retryable_and_keeps_the_body(server: FakeOllama, make: Factory) -> None:
    server.push(error(400, "invalid format: json schema not supported"))
    chat = make("m", host=server.url)
    sleep = SleepRecorder()
    with pytest.raises(ModelError) as info:
        await call_with_retries(lambda: chat.complete(ask()), POLICY, sleep=sleep)
    exc = info.value
    assert exc.status == 400
    assert not exc.retryable
    assert exc.body == "invalid format: json schema not supported"
    assert "invalid format" in str(exc)
    assert len(server.requests) == 1
    assert sleep.waits == []
    assert exc.__cause__ is not None


async def test_404_unknown_model_is_not_retryable(server: FakeOllama, make: Factory) -> None:
    server.push(error(404, 'model "nope" not found, try pulling it first'))
    with pytest.raises(ModelError) as info:
        await make("nope", host=server.url).complete(ask())
    assert info.value.status == 404 and not info.value.retryable
    assert "not found" in (info.value.body or "")


async def test_done_reason_length_is_reported_as_truncation(server: FakeOllama, make: Factory) -> None:
    server.push(chat_ok('{"title": "ca', done_reason="length"), chat_ok("x", done_reason="load"))
    chat = make("m", host=server.url)
    resp = await chat.complete(ask())
    assert resp.finish_reason == "length"
    assert resp.text == '{"title": "ca'
    assert (await chat.complete(ask())).finish_reason == "other"


async def test_connection_refused_is_retryable(make: Factory) -> None:
    chat = make("m", host=closed_port_url())
    with pytest.raises(ModelError) as info:
        await chat.complete(ask())
    assert info.value.retryable
    assert info.value.status is None
    assert isinstance(info.value.__cause__, ConnectionError)

    sleep = SleepRecorder()
    with pytest.raises(ModelError):
        await call_with_retries(lambda: chat.complete(ask()), RetryPolicy(max_attempts=3), sleep=sleep)
    assert len(sleep.waits) == 2


async def test_timeout_is_retryable(server: FakeOllama, make: Factory) -> None:
    server.push(Reply(200, chat_ok().body, delay=1.0))
    chat = make("m", host=server.url, timeout=0.2)
    with pytest.raises(ModelError) as info:
        await chat.complete(ask())
    assert info.value.retryable
    assert "timed out" in str(info.value)


async def test_malformed_body_is_a_non_retryable_model_error(server: FakeOllama, make: Factory) -> None:
    server.push(Reply(200, "<html>not json</html>"))
    with pytest.raises(ModelError) as info:
        await make("m", host=server.url).complete(ask())
    assert not info.value.retryable


async def test_host_defaults_to_ollama_host_env(
    server: FakeOllama, monkeypatch: pytest.MonkeyPatch, make: Factory
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", server.url)
    chat = make("m")
    assert (await chat.complete(ask())).text == '{"ok": true}'
    assert len(server.requests) == 1
    assert chat.host.startswith(server.url)
    assert server.url in repr(chat)


def test_bad_arguments() -> None:
    with pytest.raises(UserInputError):
        OllamaChat("")
    with pytest.raises(UserInputError):
        OllamaChat("m", timeout=0)
