"""The chat path's spans and timings, shared by the call (:mod:`.chat`) and the stream (:mod:`.stream`).

Span names and attributes follow the OpenTelemetry GenAI conventions where they name one (``chat {model}``,
``gen_ai.*``); the memory stages are ``remem.chat`` (the root), ``remem.recall`` and ``remem.learn``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from remem_agent.adapters.base import ChatModel, ChatResponse
from remem_agent.agent.call import Sampling
from remem_agent.agent.telemetry import AttributeValue, Span, Telemetry
from remem_agent.types import SearchResult


def ms(t0: float, t1: float | None = None) -> float:
    """Milliseconds from ``t0`` to ``t1`` (default: now), on ``time.perf_counter``'s clock."""
    return round(((t1 if t1 is not None else time.perf_counter()) - t0) * 1000, 3)


@contextlib.contextmanager
def stage(tel: Telemetry, name: str, parent: Span | None, **attributes: AttributeValue) -> Iterator[Span]:
    """A child span for one stage; a failure inside marks it and is re-raised."""
    span = tel.start(name, attributes, parent)
    try:
        yield span
    except BaseException as exc:
        span.fail(exc)
        raise
    finally:
        span.end()


def record_search(span: Span, res: SearchResult) -> None:
    span.set("gen_ai.memory.search.result.count", len(res.items))
    span.set("remem.search_id", res.search_id)


def model_attributes(model: ChatModel, sampling: Sampling) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": model.adapter,
        "gen_ai.request.model": model.name,
    }
    if sampling.temperature is not None:
        attrs["gen_ai.request.temperature"] = sampling.temperature
    if sampling.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = sampling.max_tokens
    return attrs


def record_response(span: Span, resp: ChatResponse) -> None:
    span.set("gen_ai.response.model", resp.model or None)
    span.set("gen_ai.response.finish_reasons", [resp.finish_reason])
    span.set("gen_ai.usage.input_tokens", resp.usage.prompt_tokens)
    span.set("gen_ai.usage.output_tokens", resp.usage.completion_tokens)


def root_span(tel: Telemetry, conversation_id: str, *, stream: bool) -> Span:
    """The span of one chat call (``remem.chat``), parent of its stages."""
    return tel.start(
        "remem.chat",
        {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": conversation_id, "remem.stream": stream},
    )
