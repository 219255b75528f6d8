"""Spans for a chat turn, in OpenTelemetry's GenAI semantic conventions (optional extra ``otel``).

The middleware talks to a two-method seam (:class:`Telemetry`: start a span, end it) so that it never
imports OpenTelemetry itself: :class:`NoTelemetry` is the default, :class:`OpenTelemetrySpans` sends the
spans to the caller's tracer provider (and so to whatever collector it exports to). One chat call is a
``remem.chat`` span with a child per stage: ``remem.recall``, ``chat {model}`` (the model call, with the
``gen_ai.*`` attributes: operation, provider, request/response model, usage, finish reasons) and
``remem.learn`` (citations, value use, the waiting outcome). Prompt text is never put on a span.

Memory operations are spans of their own, named as the proposed GenAI memory conventions name them
(``{gen_ai.operation.name} {store}``, the store being ``remem``): ``search_memory remem`` (a recall, child of
``remem.recall``; ``gen_ai.memory.namespace`` is the scope, ``gen_ai.memory.search.result.count`` how many were
served) and ``update_memory remem`` (a memory added by ``MemoryAgent.remember``; ``gen_ai.memory.id``). The
conventions have no operation for an outcome, so a verdict is ``remem.feedback`` (``gen_ai.operation.name``
``feedback``, with ``remem.answer_id``, ``remem.outcome.success``, ``remem.outcome.source``); a new turn that
settles the previous answer in the same worker-thread hop as its recall puts ``remem.settled`` on the search
span instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from remem_agent._extras import require

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


MEMORY_STORE = "remem"


def memory_operation(operation: str, scope: str | None) -> tuple[str, dict[str, AttributeValue]]:
    """The span name and attributes of one memory operation (``search_memory``, ``update_memory``, ``feedback``)."""
    attrs: dict[str, AttributeValue] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": MEMORY_STORE}
    if scope is not None:
        attrs["gen_ai.memory.namespace"] = scope
    name = f"{operation} {MEMORY_STORE}" if operation != "feedback" else "remem.feedback"
    return name, attrs


class Span(Protocol):
    def set(self, key: str, value: AttributeValue | None) -> None: ...

    def fail(self, exc: BaseException) -> None: ...

    def end(self) -> None: ...


class Telemetry(Protocol):
    def start(self, name: str, attributes: Mapping[str, AttributeValue], parent: Span | None = None) -> Span: ...


class _NoSpan:
    def set(self, key: str, value: AttributeValue | None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


class NoTelemetry:
    """The default: spans cost nothing and go nowhere."""

    _span = _NoSpan()

    def start(self, name: str, attributes: Mapping[str, AttributeValue], parent: Span | None = None) -> Span:
        return self._span


class _OtelSpan:
    def __init__(self, span: Any) -> None:
        self.span = span

    def set(self, key: str, value: AttributeValue | None) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def fail(self, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.record_exception(exc)
        self.span.set_attribute("error.type", type(exc).__name__)
        self.span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))

    def end(self) -> None:
        self.span.end()


class OpenTelemetrySpans:
    """Spans through OpenTelemetry (extra ``otel``); ``tracer_provider`` defaults to the global one.

    Parents are passed explicitly rather than through the current context, so a streamed turn, whose
    stages run across the caller's ``async for`` iterations, still nests correctly.
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        require("opentelemetry.trace", "otel", feature="OpenTelemetrySpans")
        from opentelemetry import trace

        from remem_agent import __version__

        self._trace = trace
        self._tracer = trace.get_tracer("remem_agent", __version__, tracer_provider=tracer_provider)

    def start(self, name: str, attributes: Mapping[str, AttributeValue], parent: Span | None = None) -> Span:
        context = None
        if isinstance(parent, _OtelSpan):
            context = self._trace.set_span_in_context(parent.span)
        kind = self._trace.SpanKind.CLIENT if name.startswith("chat ") else self._trace.SpanKind.INTERNAL
        return _OtelSpan(self._tracer.start_span(name, context=context, kind=kind, attributes=dict(attributes)))
