"""The chat-model seam: one async ``complete(request) -> response`` and capability flags.

Every provider (OpenAI-compatible, Ollama, llama.cpp in-process, the fakes) is an adapter behind this
protocol; nothing else in the library branches on the provider. Adapters translate the request into
their native structured-output mechanism when ``capabilities.native_json_schema`` is set, map SDK
errors to :class:`~remem_agent.errors.ModelError` (``retryable`` for transient ones) and never retry
themselves: retries live in one place, :mod:`remem_agent.adapters.retry`.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, runtime_checkable

from remem_agent.errors import UserInputError

MessageRole = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "error", "other"]
ToolChoice = Literal["auto", "none", "required"] | str  # or the name of one tool the model must call


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A function call the model asked for. ``arguments`` is the JSON text exactly as the model wrote it."""

    id: str
    name: str
    arguments: str = "{}"

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI wire shape (``{"id", "type": "function", "function": {"name", "arguments"}}``)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool the model may call: a name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI wire shape, which Ollama and llama.cpp also take."""
        fn: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. ``tool_calls`` on an assistant message; ``tool_call_id`` on a tool result."""

    role: MessageRole
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI wire shape; keys beyond role/content appear only when set."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What to ask. ``json_schema``: the answer must be a JSON object valid against it.

    ``tools``/``tool_choice`` offer function calling (an adapter whose ``capabilities.tools`` is False
    refuses a request with tools with a ``UserInputError``). ``extra`` holds provider fields the
    library does not model; adapters pass them to the server untouched (the gateway uses this).
    ``temperature``, ``max_tokens`` and ``seed`` set to None are not sent: the model's own defaults apply.
    """

    messages: tuple[Message, ...]
    json_schema: Mapping[str, Any] | None = None
    schema_name: str = "answer"
    temperature: float | None = 0.0
    max_tokens: int | None = 512
    seed: int | None = 0
    stop: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """One reply. ``text`` is always the raw content; ``finish_reason == "length"`` means truncated."""

    text: str
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    latency_ms: float = 0.0
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """A piece of a streamed tool call: ``index`` says which; ``id``/``name`` come first, ``arguments`` in pieces."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamChunk:
    """A piece of a streamed reply; the last chunk carries ``finish_reason`` (and ``usage`` when known)."""

    text: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter can enforce natively.

    ``native_json_schema``: the server constrains output to a given JSON schema (OpenAI
    ``response_format=json_schema``, Ollama ``format=<schema>``, llama.cpp grammars).
    ``json_mode``: it can at least force syntactically valid JSON.
    ``tools``: function calling (tool definitions in, tool calls out).
    ``streaming``: the adapter implements :class:`StreamingChatModel` (else :func:`stream_reply` yields one chunk).
    """

    native_json_schema: bool = False
    json_mode: bool = False
    tools: bool = False  # passes tool definitions and returns tool calls
    streaming: bool = False  # has ``stream(request)`` yielding chunks as the model produces them


@runtime_checkable
class ChatModel(Protocol):
    """Anything that can complete a chat request asynchronously."""

    @property
    def name(self) -> str:
        """The model name as the provider knows it."""
        ...

    @property
    def adapter(self) -> str:
        """Short adapter id for traces: "openai", "ollama", "llamacpp", "scripted", ..."""
        ...

    @property
    def capabilities(self) -> Capabilities: ...

    async def complete(self, request: ChatRequest) -> ChatResponse: ...


@runtime_checkable
class StreamingChatModel(ChatModel, Protocol):
    """A chat model that can stream; it sets ``capabilities.streaming``."""

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Chunks as the model produces them. Closing the iterator early releases the connection."""
        ...


# The protocols' members: ``isinstance(model, ChatModel)`` (``StreamingChatModel``) is these present on the model
# (a method set to None does not count); typing recomputes them from the MRO on every check (~15 us for a chat
# model, ~27 us for a streaming one), so the checks on every call test them by name instead
CHAT_MEMBERS = ("adapter", "capabilities", "complete", "name")
STREAMING_MEMBERS = (*CHAT_MEMBERS, "stream")


def _has_members(model: object, members: tuple[str, ...], methods: tuple[str, ...]) -> bool:
    return all(hasattr(model, m) for m in members) and all(getattr(model, m) is not None for m in methods)


def can_stream(model: object) -> bool:
    """``isinstance(model, StreamingChatModel)`` without typing's per-call member scan (the same test, by name)."""
    return _has_members(model, STREAMING_MEMBERS, ("complete", "stream"))


def check_chat_model(value: object, what: str = "model") -> ChatModel:
    """``value`` when it implements :class:`ChatModel` (``isinstance``'s test, by name, as :func:`can_stream`),
    else a ``UserInputError`` naming the argument."""
    if not _has_members(value, CHAT_MEMBERS, ("complete",)):
        raise UserInputError(f"{what} must implement the ChatModel protocol (name, adapter, capabilities, complete)")
    return cast(ChatModel, value)


def open_stream(model: ChatModel, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
    """``stream_reply(model, request)``, without its relay when the model's ``stream`` is an async generator
    function: then that generator itself (created, not started, as ``stream_reply`` would create it on its first
    step), so each chunk passes one generator fewer; any other model gets ``stream_reply``."""
    try:
        direct = model.capabilities.streaming and can_stream(model)
        stream = cast(StreamingChatModel, model).stream if direct else None
    except Exception:  # noqa: BLE001 - stream_reply raises it at its first step, as before
        stream = None
    if stream is not None and inspect.isasyncgenfunction(stream):
        gen: AsyncGenerator[StreamChunk] = stream(request)
        return gen
    return stream_reply(model, request)


async def stream_reply(model: ChatModel, request: ChatRequest) -> AsyncGenerator[StreamChunk]:
    """Stream from any model: its own ``stream`` when it has one, else one chunk holding the whole reply."""
    if model.capabilities.streaming and can_stream(model):
        stream = cast(StreamingChatModel, model).stream(request)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    resp = await model.complete(request)
    yield StreamChunk(
        text=resp.text,
        tool_calls=tuple(
            ToolCallDelta(index=i, id=c.id, name=c.name, arguments=c.arguments) for i, c in enumerate(resp.tool_calls)
        ),
        finish_reason=resp.finish_reason,
        usage=resp.usage,
    )


class StreamAssembler:
    """Accumulates streamed chunks into the ``ChatResponse`` they add up to (text, tool calls, finish, usage)."""

    def __init__(self, model: str = "") -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self.finish_reason: FinishReason | None = None
        self.usage = Usage()
        self._model = model

    def add(self, chunk: StreamChunk) -> None:
        if chunk.text:
            self._text.append(chunk.text)
        for d in chunk.tool_calls:
            call = self._calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id:
                call["id"] = d.id
            if d.name and not call["name"]:  # the name arrives whole, in the call's first piece
                call["name"] = d.name
            call["arguments"] += d.arguments
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage

    @property
    def text(self) -> str:
        return "".join(self._text)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"] or "{}")
            for i, c in sorted(self._calls.items())
        )

    def response(self, latency_ms: float = 0.0) -> ChatResponse:
        calls = self.tool_calls()
        finish = self.finish_reason or ("tool_calls" if calls else "stop")
        return ChatResponse(
            text=self.text,
            finish_reason=finish,
            usage=self.usage,
            model=self._model,
            latency_ms=latency_ms,
            tool_calls=calls,
        )
