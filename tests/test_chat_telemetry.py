"""A chat turn as OpenTelemetry spans (GenAI semantic conventions), checked with the SDK's in-memory exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from remem_agent import ModelError, ReMem
from remem_agent.adapters import ChatResponse, FunctionChatModel, RetryPolicy, ScriptedChatModel, Usage
from remem_agent.agent import MemoryAgent
from remem_agent.agent.telemetry import OpenTelemetrySpans


def _setup(tmp_path: Path) -> tuple[ReMem, InMemorySpanExporter, OpenTelemetrySpans]:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return mem, exporter, OpenTelemetrySpans(provider)


async def test_a_chat_turn_is_a_root_span_with_a_child_per_stage(tmp_path: Path) -> None:
    mem, exporter, tel = _setup(tmp_path)
    model = FunctionChatModel(lambda req: ChatResponse(text="west-2 [M1]", usage=Usage(42, 3), model="m-1"))
    agent = MemoryAgent(mem, model, trace=False, telemetry=tel)
    reply = await agent.chat([{"role": "user", "content": "Where is our server?"}], conversation_id="c1")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"remem.chat", "remem.recall", "chat function", "remem.learn"}
    root = spans["remem.chat"]
    assert root.attributes["gen_ai.conversation.id"] == "c1" and root.attributes["remem.answer_id"] == reply.answer_id
    for name in ("remem.recall", "chat function", "remem.learn"):
        assert spans[name].parent is not None and spans[name].parent.span_id == root.context.span_id
    call = spans["chat function"].attributes
    assert call["gen_ai.operation.name"] == "chat" and call["gen_ai.request.model"] == "function"
    assert call["gen_ai.usage.input_tokens"] == 42 and call["gen_ai.usage.output_tokens"] == 3
    assert call["gen_ai.response.model"] == "m-1" and tuple(call["gen_ai.response.finish_reasons"]) == ("stop",)
    assert spans["remem.learn"].attributes["remem.citations"] == 1
    assert all("Where is our server" not in str(dict(s.attributes or {})) for s in spans.values())  # no prompt text
    mem.close()


async def test_streamed_turn_and_a_failed_call_are_spans_too(tmp_path: Path) -> None:
    mem, exporter, tel = _setup(tmp_path)
    agent = MemoryAgent(mem, FunctionChatModel(lambda req: "west-2 it is"), trace=False, telemetry=tel)
    async for _ in agent.chat_stream([{"role": "user", "content": "Where is our server?"}]):
        pass
    names = [s.name for s in exporter.get_finished_spans()]
    assert sorted(names) == ["chat function", "remem.chat", "remem.recall"]
    call = next(s for s in exporter.get_finished_spans() if s.name == "chat function")
    assert "gen_ai.response.time_to_first_chunk" in call.attributes
    exporter.clear()
    failing = MemoryAgent(
        mem,
        ScriptedChatModel([ModelError("boom", retryable=False)]),
        trace=False,
        telemetry=tel,
        retry=RetryPolicy(max_attempts=1),
    )
    with pytest.raises(ModelError):
        await failing.chat([{"role": "user", "content": "Where is our server?"}])
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    call_span = by_name["chat scripted"]
    assert not call_span.status.is_ok and call_span.attributes["error.type"] == "ModelError"
    assert not by_name["remem.chat"].status.is_ok
    mem.close()
