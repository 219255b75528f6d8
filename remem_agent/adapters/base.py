"""The chat-model seam: one async ``complete(request) -> response`` and capability flags.

Every provider (OpenAI-compatible, Ollama, llama.cpp in-process, the fakes) is an adapter behind this
protocol; nothing else in the library branches on the provider. Adapters translate the request into
their native structured-output mechanism when ``capabilities.native_json_schema`` is set, map SDK
errors to :class:`~remem_agent.errors.ModelError` (``retryable`` for transient ones) and never retry
themselves: retries live in one place, :mod:`remem_agent.adapters.retry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

MessageRole = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length", "error", "other"]


@dataclass(frozen=True, slots=True)
class Message:
    role: MessageRole
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What to ask. ``json_schema``: the answer must be a JSON object valid against it."""

    messages: tuple[Message, ...]
    json_schema: Mapping[str, Any] | None = None
    schema_name: str = "answer"
    temperature: float = 0.0
    max_tokens: int | None = 512
    seed: int | None = 0
    stop: tuple[str, ...] = ()


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


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter can enforce natively.

    ``native_json_schema``: the server constrains output to a given JSON schema (OpenAI
    ``response_format=json_schema``, Ollama ``format=<schema>``, llama.cpp grammars).
    ``json_mode``: it can at least force syntactically valid JSON.
    """

    native_json_schema: bool = False
    json_mode: bool = False


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
