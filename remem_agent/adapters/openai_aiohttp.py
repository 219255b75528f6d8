"""An OpenAI-protocol adapter over one pooled aiohttp session: :class:`OpenAIChat`'s rules, the gateway's upstream.

Why not the SDK: against a loopback upstream one non-streaming call through ``openai.AsyncOpenAI``
(httpx underneath) cost several times the CPU of the same call through aiohttp, and httpx alone most of
that difference (``evals/perf/gateway.py`` measures the whole gateway). A gateway pays it on every request,
on the cores it shares with recall, so the hot path speaks HTTP itself. Everything else is
:class:`OpenAIChat`'s: the request body (``_kwargs``, with ``extra`` fields merged in as the SDK's
``extra_body`` would be), the reply checks (``_to_response``, ``_malformed``), the ``json_schema`` fallback
for servers that reject it, and the error shape (status, redacted body, retryable, ``Retry-After``).
The SDK client is kept for listing models (``/v1/models``, rare).

The session is created lazily inside the running event loop (aiohttp binds a session to its loop) and
shared by every model name; connections are bounded and reused (keep-alive).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from remem_agent._extras import require
from remem_agent.adapters import _openai_wire as wire
from remem_agent.adapters.base import ChatRequest, StreamChunk, ToolCallDelta, Usage
from remem_agent.adapters.openai_chat import OpenAIChat
from remem_agent.adapters.retry import parse_retry_after
from remem_agent.errors import ModelError

if TYPE_CHECKING:
    import aiohttp
    import openai
else:
    aiohttp = require("aiohttp", "gateway", feature="remem serve --upstream-kind openai")


def _proxied() -> bool:
    return any(k.lower() in ("http_proxy", "https_proxy", "all_proxy") and v for k, v in os.environ.items())


class UpstreamSession:
    """One aiohttp session for every upstream call of a gateway process: pooled, bounded, with timeouts."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float, max_connections: int) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(5.0, timeout_s))
        # a stream may run long; only a silent upstream (no byte for timeout_s) is a timeout
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=min(5.0, timeout_s), sock_read=timeout_s)
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max, keepalive_timeout=30)
            # Honour HTTP(S)_PROXY like the SDK's httpx client did, but only when one is set: with trust_env
            # aiohttp looks up the proxy variables and reads ~/.netrc on every request (5% of the gateway's
            # CPU in the profile).
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, trust_env=_proxied())
        return self._session

    def post(self, path: str, body: bytes, *, stream: bool) -> Any:
        """The session's ``post`` context manager for ``path`` (relative to the base URL)."""
        timeout = self._stream_timeout if stream else self._timeout
        return self._open().post(f"{self.base_url}{path}", data=body, timeout=timeout)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # A closed transport closes its socket in a callback of the loop's next turns: let them run, or a loop
            # that stops right after this (server shutdown) leaves the sockets to the garbage collector.
            for _ in range(2):
                await asyncio.sleep(0)


class OpenAIUpstream(OpenAIChat):
    """:class:`OpenAIChat` whose completions and streams go through an :class:`UpstreamSession`."""

    def __init__(self, model: str, *, client: openai.AsyncOpenAI, session: UpstreamSession) -> None:
        super().__init__(model, client=client)
        self._session = session

    @property
    def adapter(self) -> str:
        return "openai"

    def _body(self, request: ChatRequest, mode: str, *, stream: bool) -> bytes:
        kwargs = self._kwargs(request, mode)
        extra = kwargs.pop("extra_body", None) or {}
        if kwargs.get("temperature") is None:
            kwargs.pop("temperature", None)  # the server's default, as the SDK leaves an unset field out
        body: dict[str, Any] = {**kwargs, **extra}
        if stream:
            body["stream"] = True
        return json.dumps(body, ensure_ascii=False).encode()

    def _where(self) -> str:
        return f"chat completion {self._model!r} at {self.base_url}"

    def _transport_error(self, exc: BaseException) -> ModelError:
        if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            return ModelError(f"{self._where()} timed out", retryable=True)
        return ModelError(f"{self._where()} could not connect ({type(exc).__name__})", retryable=True)

    async def _status_error(self, resp: aiohttp.ClientResponse) -> ModelError:
        status = resp.status
        try:
            text = await resp.text(errors="replace")
        except (TimeoutError, aiohttp.ClientError):
            text = ""
        body = self._redact(text)[: wire.BODY_LIMIT]
        retryable = status in wire.TRANSIENT_STATUS or status >= 500
        retry_after = parse_retry_after(resp.headers) if retryable else None
        return ModelError(
            f"{self._where()} failed: HTTP {status}: {body[: wire.MESSAGE_BODY_LIMIT]}",
            status=status,
            body=body,
            retryable=retryable,
            retry_after=retry_after,
        )

    async def _create(self, request: ChatRequest, mode: str) -> dict[str, Any]:
        """The decoded JSON body of one completion (the same checks as :meth:`OpenAIChat._create`)."""
        payload = self._body(request, mode, stream=False)
        try:
            async with self._session.post("/chat/completions", payload, stream=False) as resp:
                if resp.status >= 400:
                    raise await self._status_error(resp)
                text = await resp.text(errors="replace")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._transport_error(exc) from exc
        return self._decode_body(text)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Server-sent events as :class:`StreamChunk` pieces; no retry (see :meth:`OpenAIChat.stream`)."""
        payload = self._body(request, self._mode, stream=True)
        try:
            async with self._session.post("/chat/completions", payload, stream=True) as resp:
                if resp.status >= 400:
                    raise await self._status_error(resp)
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, "event:" lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    chunk = self._event(data)
                    if chunk is not None:
                        yield chunk
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:  # the stream was cut
            # retryable: the retry layer only retries before the first chunk reached anyone (chat._open_stream)
            raise ModelError(
                f"chat stream {self._model!r} at {self.base_url} broke: {type(exc).__name__}", retryable=True
            ) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._transport_error(exc) from exc

    def _event(self, data: bytes) -> StreamChunk | None:
        try:
            event = json.loads(data)
            if not isinstance(event, dict):
                raise TypeError("an event that is not an object")
            if event.get("error") is not None and not event.get("choices"):
                shown = self._redact(json.dumps(event["error"]))[: wire.MESSAGE_BODY_LIMIT]
                raise ModelError(f"chat stream {self._model!r} at {self.base_url} failed: {shown}", status=200)
            return chunk_of(event)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(
                f"chat stream {self._model!r} at {self.base_url} sent a malformed event: {type(exc).__name__}",
                status=200,
            ) from exc


def chunk_of(event: Mapping[str, Any]) -> StreamChunk | None:
    """One decoded ``chat.completion.chunk`` as a :class:`StreamChunk` (None for an empty event); the dict
    twin of ``OpenAIChat._chunk``, which reads the SDK's objects."""
    usage = event.get("usage")
    u = Usage(wire.count((usage or {}).get("prompt_tokens")), wire.count((usage or {}).get("completion_tokens")))
    choices = event.get("choices") or []
    if not choices:
        return StreamChunk(usage=u) if usage is not None else None
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = delta.get("content") or ""
    if not isinstance(text, str):
        raise TypeError("delta content is not a string")
    deltas = []
    for i, c in enumerate(delta.get("tool_calls") or []):
        fn = c.get("function") or {}
        deltas.append(
            ToolCallDelta(
                index=int(c["index"]) if c.get("index") is not None else i,
                id=c.get("id"),
                name=fn.get("name"),
                arguments=fn.get("arguments") or "",
            )
        )
    reason = choice.get("finish_reason")
    return StreamChunk(
        text=text,
        tool_calls=tuple(deltas),
        finish_reason=wire.FINISH.get(str(reason), "other") if reason else None,
        usage=u if usage is not None else None,
    )
