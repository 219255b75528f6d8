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
    assert set(spans) == {"remem.chat", "remem.recall", "search_memory remem", "chat function", "remem.learn"}
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
    assert sorted(names) == ["chat function", "remem.chat", "remem.recall", "search_memory remem"]
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


async def test_memory_operations_are_spans_named_as_the_genai_memory_conventions(tmp_path: Path) -> None:
    mem, exporter, tel = _setup(tmp_path)
    agent = MemoryAgent(mem, FunctionChatModel(lambda req: "It is in west-2 [M1]."), trace=False, telemetry=tel)
    msgs = [{"role": "user", "content": "Where is our server?"}]
    first = await agent.chat(msgs)
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "No, that's wrong."}]
    await agent.chat(msgs)  # settles the first answer: a correction
    await agent.remember("Our server moved to east-1.", entity="server", attribute="region", scope="user:ann")
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    searches = [s for s in spans if s.name == "search_memory remem"]
    assert len(searches) == 2 and all(by_id[s.parent.span_id].name == "remem.recall" for s in searches)  # type: ignore[union-attr]
    search = searches[0].attributes
    assert search["gen_ai.operation.name"] == "search_memory" and search["gen_ai.provider.name"] == "remem"
    assert search["gen_ai.memory.namespace"] == "default" and search["gen_ai.memory.search.result.count"] == 1
    (feedback,) = [s for s in spans if s.name == "remem.feedback"]
    assert feedback.attributes["remem.answer_id"] == first.answer_id
    assert (
        feedback.attributes["remem.outcome.success"] is False
        and feedback.attributes["gen_ai.operation.name"] == "feedback"
    )
    assert by_id[feedback.parent.span_id].name == "remem.recall"  # type: ignore[union-attr]
    (update,) = [s for s in spans if s.name == "update_memory remem"]
    assert (
        update.attributes["gen_ai.memory.id"].startswith("m_")
        and update.attributes["gen_ai.memory.namespace"] == "user:ann"
    )
    mem.close()
