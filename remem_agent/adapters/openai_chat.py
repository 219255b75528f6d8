"""Chat adapter for OpenAI and any OpenAI-compatible ``/v1/chat/completions`` server, over ``openai.AsyncOpenAI``.

Structured output goes through the server's own mechanism:

* ``schema_mode="json_schema"``: OpenAI's ``response_format={"type": "json_schema", "json_schema": {...}}``.
* ``schema_mode="json_object_schema"``: ``response_format={"type": "json_object", "schema": S}``, the dialect
  of ``llama_cpp.server`` (which rejects ``json_schema`` with HTTP 500) and of Anyscale-style servers.
* ``schema_mode="auto"`` (default): try ``json_schema``; if the server rejects it (HTTP 400/422/500 whose body
  mentions ``response_format``/``json_schema``) switch this adapter to ``json_object_schema`` for good and
  repeat that one call once, immediately.

The SDK's own retries are switched off (``max_retries=0``): transient failures surface as retryable
:class:`~remem_agent.errors.ModelError` for the single retry layer (:mod:`remem_agent.adapters.retry`).
An HTTP-200 body that is not a chat completion is a ``ModelError`` too (``status=200``, the body kept):
retryable only for an ``{"error": ...}`` object; a non-JSON body or JSON of the wrong shape is not.
The API key never appears in an error message, a ``repr`` or a log line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import httpx

from remem_agent._extras import require
from remem_agent.adapters import _openai_wire as wire
from remem_agent.adapters.base import (
    Capabilities,
    ChatRequest,
    ChatResponse,
    StreamChunk,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from remem_agent.adapters.retry import parse_retry_after
from remem_agent.errors import ModelError, UserInputError

if TYPE_CHECKING:
    import openai
else:
    openai = require("openai", "openai", feature="OpenAIChat")

log = logging.getLogger(__name__)

SchemaMode = Literal["json_schema", "json_object_schema", "auto"]
_SCHEMA_MODES = ("json_schema", "json_object_schema", "auto")
_NO_KEY = "sk-no-key"
_FALLBACK_STATUS = frozenset({400, 422, 500})


def _strict_ok(schema: Any) -> bool:
    """True if every object in ``schema`` meets OpenAI strict mode (closed, every property required)."""
    if isinstance(schema, list):
        return all(_strict_ok(s) for s in schema)
    if not isinstance(schema, Mapping):
        return True
    props = schema.get("properties")
    if schema.get("type") == "object" or isinstance(props, Mapping):
        props = props if isinstance(props, Mapping) else {}
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(props):
            return False
    return all(_strict_ok(v) for v in schema.values() if isinstance(v, Mapping | list))


def _schema_name(name: str) -> str:
    cleaned = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]
    return cleaned or "answer"


class OpenAIChat:
    """An OpenAI-compatible chat model.

    Args:
        model: the model name the server knows.
        base_url: API root including ``/v1``; defaults to ``$OPENAI_BASE_URL``, else OpenAI's.
        api_key: defaults to ``$OPENAI_API_KEY``, else ``"sk-no-key"`` (local servers ignore it).
        client: a ready ``openai.AsyncOpenAI`` (then base_url/api_key/http_client/timeout must not be given);
            it is used as ``client.with_options(max_retries=0)``.
        http_client: an ``httpx``/``httpx2`` ``AsyncClient`` for the SDK (tests pass a MockTransport).
        timeout: per-request timeout in seconds.
        schema_mode: ``"json_schema"``, ``"json_object_schema"`` or ``"auto"`` (see the module doc).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        http_client: Any = None,
        timeout: float = 60.0,
        schema_mode: SchemaMode = "auto",
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise UserInputError("model must be a non-empty string")
        if schema_mode not in _SCHEMA_MODES:
            raise UserInputError(f"schema_mode must be one of {_SCHEMA_MODES}, got {schema_mode!r}")
        if not timeout > 0:
            raise UserInputError(f"timeout must be > 0, got {timeout!r}")
        self._model = model
        self._auto = schema_mode == "auto"
        self._mode: Literal["json_schema", "json_object_schema"] = (
            "json_schema" if schema_mode == "auto" else schema_mode
        )
        self._owns_client = client is None
        if client is not None:
            if base_url is not None or api_key is not None or http_client is not None:
                raise UserInputError("pass either client or base_url/api_key/http_client, not both")
            self._client = client.with_options(max_retries=0)
            key = client.api_key
        else:
            key = api_key or os.environ.get("OPENAI_API_KEY") or _NO_KEY
            self._client = openai.AsyncOpenAI(
                api_key=key,
                base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
                timeout=timeout,
                max_retries=0,
                http_client=http_client,
            )
        # Kept only to scrub it out of server-echoed error text; never printed.
        self._secret = key if isinstance(key, str) and len(key) >= 4 else None

    # ------------------------------------------------------------------ protocol
    @property
    def name(self) -> str:
        return self._model

    @property
    def adapter(self) -> str:
        return "openai"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(native_json_schema=True, json_mode=True, tools=True, streaming=True)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The API key, for redaction by value in traces (never printed; ``repr`` leaves it out)."""
        return (self._secret,) if self._secret and self._secret != _NO_KEY else ()

    @property
    def schema_mode(self) -> str:
        """The structured-output dialect currently in use (``auto`` resolves to one of the two)."""
        return self._mode

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    def __repr__(self) -> str:
        mode = f"auto->{self._mode}" if self._auto else self._mode
        return f"OpenAIChat(model={self._model!r}, base_url={self.base_url!r}, schema_mode={mode!r})"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        started = time.perf_counter()
        mode = self._mode
        try:
            completion = await self._create(request, mode)
        except ModelError as exc:
            if not (self._auto and mode == "json_schema" and request.json_schema is not None):
                raise
            if not self._is_schema_rejection(exc):
                raise
            log.info(
                "server at %s rejected response_format=json_schema (HTTP %s); switching to json_object+schema",
                self.base_url,
                exc.status,
            )
            self._mode = "json_object_schema"
            completion = await self._create(request, "json_object_schema")
        return self._to_response(completion, started)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Server-sent events as :class:`StreamChunk` pieces; closing the iterator closes the HTTP response.

        No fallback and no retry here: a stream that fails after its first byte cannot be replayed, so
        the error surfaces (a ``ModelError``) and the caller decides.
        """
        kwargs = self._kwargs(request, self._mode)
        kwargs["stream"] = True
        try:
            events = await self._client.chat.completions.create(**kwargs)
        except openai.APIError as exc:
            raise self._map_error(exc) from exc
        try:
            async for event in events:
                chunk = self._chunk(event)
                if chunk is not None:
                    yield chunk
        except openai.APIError as exc:
            raise self._map_error(exc) from exc
        except httpx.HTTPError as exc:  # the connection dropped mid-stream
            raise ModelError(f"chat stream {self._model!r} at {self.base_url} broke: {type(exc).__name__}") from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # an event that is not a completion chunk
            raise ModelError(
                f"chat stream {self._model!r} at {self.base_url} sent a malformed event: {type(exc).__name__}",
                status=200,
            ) from exc
        finally:
            await events.close()

    async def aclose(self) -> None:
        """Close the SDK client if this adapter created it."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> OpenAIChat:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals
    def _kwargs(self, request: ChatRequest, mode: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": [m.to_dict() for m in request.messages],
        }
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if request.tools:
            kwargs["tools"] = [t.to_dict() for t in request.tools]
        if request.tool_choice is not None:
            kwargs["tool_choice"] = (
                request.tool_choice
                if request.tool_choice in ("auto", "none", "required")
                else {"type": "function", "function": {"name": request.tool_choice}}
            )
        if request.extra:  # provider fields the library does not model: sent as they are
            kwargs["extra_body"] = dict(request.extra)
        if request.json_schema is not None:
            schema = dict(request.json_schema)
            if mode == "json_schema":
                kwargs["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {
                        "name": _schema_name(request.schema_name),
                        "schema": schema,
                        "strict": _strict_ok(schema),
                    },
                }
            else:
                kwargs["response_format"] = {"type": "json_object", "schema": schema}
        return kwargs

    async def _create(self, request: ChatRequest, mode: str) -> dict[str, Any]:
        """The decoded JSON body of one completion; a malformed body is a ``ModelError`` (see ``_malformed``)."""
        kwargs = self._kwargs(request, mode)
        try:
            raw = await self._client.chat.completions.with_raw_response.create(**kwargs)
            text = raw.text
        except openai.APIError as exc:
            raise self._map_error(exc) from exc
        return self._decode_body(text)

    def _decode_body(self, text: str) -> dict[str, Any]:
        """A completion body as a JSON object; anything else is a ``ModelError`` naming what came back."""
        try:
            data = json.loads(text)
        except ValueError as exc:  # an HTML page, an empty body: usually a base_url that is not the API
            raise self._malformed("a body that is not JSON", text) from exc
        if not isinstance(data, dict):
            raise self._malformed(f"a JSON {type(data).__name__}, not an object", text)
        return data

    def _malformed(self, what: str, body: str, *, retryable: bool = False) -> ModelError:
        """An HTTP-200 reply that is not a chat completion.

        Retryable only where a retry can help: an ``{"error": ...}`` object sent with status 200 (routers
        report upstream failures so). A body that is not JSON (an HTML page, an empty body) or JSON of
        the wrong shape (no choices, a choice without a message, content that is not a string) comes
        back the same on every attempt, from a base_url that is not an OpenAI-compatible API: not retryable.
        """
        shown = self._redact(body)[: wire.BODY_LIMIT]
        hint = "" if retryable else "; check that base_url is an OpenAI-compatible /v1 API"
        return ModelError(
            f"chat completion {self._model!r} at {self.base_url} returned {what} (HTTP 200){hint}: "
            f"{shown[: wire.MESSAGE_BODY_LIMIT]!r}",
            status=200,
            body=shown,
            retryable=retryable,
        )

    def _redact(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, "[redacted]")
        return text

    def _map_error(self, exc: openai.APIError) -> ModelError:
        where = f"chat completion {self._model!r} at {self.base_url}"
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(f"{where} timed out", retryable=True)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = type(cause).__name__ if cause is not None else "connection error"
            return ModelError(f"{where} could not connect ({detail})", retryable=True)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            try:
                body = exc.response.text
            except Exception:  # noqa: BLE001 - a streamed/unread body: fall back to the parsed one
                body = str(exc.body) if exc.body is not None else ""
            body = self._redact(body)[: wire.BODY_LIMIT]
            retryable = status in wire.TRANSIENT_STATUS or status >= 500
            retry_after = parse_retry_after(exc.response.headers) if retryable else None
            shown = body[: wire.MESSAGE_BODY_LIMIT]
            return ModelError(
                f"{where} failed: HTTP {status}: {shown}",
                status=status,
                body=body,
                retryable=retryable,
                retry_after=retry_after,
            )
        return ModelError(f"{where} failed: {type(exc).__name__}: {self._redact(str(exc))[: wire.MESSAGE_BODY_LIMIT]}")

    @staticmethod
    def _is_schema_rejection(exc: ModelError) -> bool:
        if exc.status not in _FALLBACK_STATUS:
            return False
        text = (exc.body or "").lower()
        return "response_format" in text or "json_schema" in text

    def _to_response(self, data: dict[str, Any], started: float) -> ChatResponse:
        """Validate the shape of a decoded completion and map it; anything else is a ``ModelError``."""

        def body() -> str:  # the body as the error message shows it (only encoded when one is raised)
            return json.dumps(data)

        error = data.get("error")
        if error is not None and not data.get("choices"):
            raise self._malformed("an error object instead of choices", body(), retryable=True)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise self._malformed("no choices", body())
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise self._malformed("a choice without a message", body())
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise self._malformed(f"message content that is a {type(content).__name__}, not a string", body())
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        model = data.get("model")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise self._malformed("tool_calls that are not a list", body())
        tool_calls: list[ToolCall] = []
        for i, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise self._malformed("a tool call without a function name", body())
            args = fn.get("arguments")
            args = args if isinstance(args, str) else json.dumps(args if args is not None else {})
            call_id = c.get("id") if isinstance(c.get("id"), str) and c.get("id") else f"call_{i}"
            tool_calls.append(ToolCall(id=call_id, name=fn["name"], arguments=args))
        finish = wire.FINISH.get(str(choice.get("finish_reason")), "other")
        if tool_calls and finish == "stop":  # some servers say "stop" after a forced tool call
            finish = "tool_calls"
        return ChatResponse(
            text=content or "",
            finish_reason=finish,
            usage=Usage(wire.count(usage.get("prompt_tokens")), wire.count(usage.get("completion_tokens"))),
            model=model if isinstance(model, str) and model else self._model,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            tool_calls=tuple(tool_calls),
        )

    @staticmethod
    def _chunk(event: Any) -> StreamChunk | None:
        """One SSE event (an SDK ``ChatCompletionChunk``) as a :class:`StreamChunk`; None for an empty event."""
        usage = getattr(event, "usage", None)
        u = Usage(
            wire.count(getattr(usage, "prompt_tokens", None)), wire.count(getattr(usage, "completion_tokens", None))
        )
        if not event.choices:
            return StreamChunk(usage=u) if usage is not None else None
        choice = event.choices[0]
        delta = choice.delta
        text = delta.content or "" if delta is not None else ""
        if not isinstance(text, str):
            raise TypeError("delta content is not a string")
        deltas = tuple(
            ToolCallDelta(
                index=int(c.index) if c.index is not None else i,
                id=c.id,
                name=c.function.name if c.function is not None else None,
                arguments=(c.function.arguments or "") if c.function is not None else "",
            )
            for i, c in enumerate((delta.tool_calls or []) if delta is not None else [])
        )
        reason = choice.finish_reason
        return StreamChunk(
            text=text,
            tool_calls=deltas,
            finish_reason=wire.FINISH.get(str(reason), "other") if reason else None,
            usage=u if usage is not None else None,
        )


__all__ = ["OpenAIChat", "parse_retry_after"]
