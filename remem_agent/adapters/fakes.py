"""Chat models for tests and demos, shipped in the package: no network, fully deterministic."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from remem_agent.adapters.base import Capabilities, ChatRequest, ChatResponse, Usage
from remem_agent.errors import ModelError

Reply = str | ChatResponse | BaseException


def _as_response(reply: str | ChatResponse, name: str) -> ChatResponse:
    if isinstance(reply, ChatResponse):
        return reply
    return ChatResponse(text=reply, finish_reason="stop", usage=Usage(None, len(reply.split())), model=name)


@dataclass
class ScriptedChatModel:
    """Replies from a script, in order: a string, a full ChatResponse, or an exception to raise.

    Every request is kept in ``requests`` so tests can assert what was sent. Running out of script is
    a ModelError (a test that asks more than it scripted should fail loudly).
    """

    replies: Iterable[Reply]
    name: str = "scripted"
    capabilities: Capabilities = field(default_factory=Capabilities)
    adapter: str = "scripted"
    requests: list[ChatRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._script = list(self.replies)
        self._lock = asyncio.Lock()

    async def complete(self, request: ChatRequest) -> ChatResponse:
        async with self._lock:
            self.requests.append(request)
            if not self._script:
                raise ModelError(f"ScriptedChatModel {self.name!r} ran out of replies")
            reply = self._script.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return _as_response(reply, self.name)


@dataclass
class FunctionChatModel:
    """Replies computed by a function of the request (sync or async)."""

    fn: Callable[[ChatRequest], str | ChatResponse | Awaitable[str | ChatResponse]]
    name: str = "function"
    capabilities: Capabilities = field(default_factory=Capabilities)
    adapter: str = "function"
    requests: list[ChatRequest] = field(default_factory=list)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        out = self.fn(request)
        if inspect.isawaitable(out):
            out = await out
        return _as_response(out, self.name)
