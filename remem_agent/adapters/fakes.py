"""Chat models for tests and demos, shipped in the package: no network, fully deterministic."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from remem_agent.adapters.base import (
    Capabilities,
    ChatRequest,
    ChatResponse,
    StreamChunk,
    ToolCallDelta,
    Usage,
)
from remem_agent.errors import ModelError

FAKE_CAPABILITIES = Capabilities(tools=True, streaming=True)

Reply = str | ChatResponse | BaseException


def _as_response(reply: str | ChatResponse, name: str) -> ChatResponse:
    if isinstance(reply, ChatResponse):
        return reply
    return ChatResponse(text=reply, finish_reason="stop", usage=Usage(None, len(reply.split())), model=name)


async def _chunks(resp: ChatResponse) -> AsyncIterator[StreamChunk]:
    """A reply as a real stream would send it: word pieces, then tool-call pieces, then the finish."""
    for piece in re.findall(r"\S+\s*|\s+", resp.text):
        await asyncio.sleep(0)  # a real suspension point between chunks, as over a socket
        yield StreamChunk(text=piece)
    for i, call in enumerate(resp.tool_calls):
        yield StreamChunk(tool_calls=(ToolCallDelta(index=i, id=call.id, name=call.name),))
        half = len(call.arguments) // 2
        for part in (call.arguments[:half], call.arguments[half:]):
            yield StreamChunk(tool_calls=(ToolCallDelta(index=i, arguments=part),))
    yield StreamChunk(finish_reason=resp.finish_reason, usage=resp.usage)


@dataclass
class ScriptedChatModel:
    """Replies from a script, in order: a string, a full ChatResponse, or an exception to raise.

    Every request is kept in ``requests`` so tests can assert what was sent. Running out of script is
    a ModelError (a test that asks more than it scripted should fail loudly).
    """

    replies: Iterable[Reply]
    name: str = "scripted"
    capabilities: Capabilities = FAKE_CAPABILITIES
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

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """The next scripted reply in pieces (an exception in the script is raised before the first one)."""
        resp = await self.complete(request)
        async for chunk in _chunks(resp):
            yield chunk


@dataclass
class FunctionChatModel:
    """Replies computed by a function of the request (sync or async)."""

    fn: Callable[[ChatRequest], str | ChatResponse | Awaitable[str | ChatResponse]]
    name: str = "function"
    capabilities: Capabilities = FAKE_CAPABILITIES
    adapter: str = "function"
    requests: list[ChatRequest] = field(default_factory=list)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        out = self.fn(request)
        if inspect.isawaitable(out):
            out = await out
        return _as_response(out, self.name)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        resp = await self.complete(request)
        async for chunk in _chunks(resp):
            yield chunk
