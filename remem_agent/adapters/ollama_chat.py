"""Chat adapter for an Ollama server's native ``/api/chat``, over ``ollama.AsyncClient``.

Structured output uses Ollama's native ``format=<JSON schema>``; sampling settings travel in ``options``
(``temperature``, ``seed``, ``num_predict`` = max_tokens, ``stop``). Failures are mapped to
:class:`~remem_agent.errors.ModelError`: HTTP 408/425/429/5xx, timeouts and connection errors are
retryable, any other status is not. An HTTP-200 body that is not a chat response (not JSON, an HTML page,
JSON of another shape) is a non-retryable ``ModelError`` with ``status=200``; only a JSON ``{"error": ...}``
object sent with 200 is retryable. The adapter never retries by itself (see
:mod:`remem_agent.adapters.retry`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import httpx

from remem_agent._extras import require
from remem_agent.adapters.base import (
    Capabilities,
    ChatRequest,
    ChatResponse,
    FinishReason,
    Message,
    StreamChunk,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from remem_agent.errors import ModelError, UserInputError

if TYPE_CHECKING:
    import ollama
else:
    ollama = require("ollama", "ollama", feature="OllamaChat")

_BODY_LIMIT = 2000
_MESSAGE_BODY_LIMIT = 300
_TRANSIENT_STATUS = frozenset({408, 425, 429})  # plus every 5xx
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


class OllamaChat:
    """A chat model served by Ollama.

    Args:
        model: the Ollama model tag (``"llama3.2"``, ``"qwen2.5:0.5b"``...).
        host: server URL; defaults to ``$OLLAMA_HOST``, else ``http://127.0.0.1:11434``.
        client: a ready ``ollama.AsyncClient`` (then host/timeout must not be given).
        timeout: per-request timeout in seconds.
        keep_alive: how long Ollama keeps the model loaded (``"5m"``, seconds, ``-1``...).
        options: extra Ollama options (``num_ctx``, ``top_p``...); the request's temperature, seed,
            max_tokens and stop override the same keys.
    """

    def __init__(
        self,
        model: str,
        *,
        host: str | None = None,
        client: ollama.AsyncClient | None = None,
        timeout: float = 120.0,
        keep_alive: float | str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise UserInputError("model must be a non-empty string")
        if not timeout > 0:
            raise UserInputError(f"timeout must be > 0, got {timeout!r}")
        self._model = model
        self._owns_client = client is None
        if client is not None:
            if host is not None:
                raise UserInputError("pass either client or host, not both")
            self._client = client
        else:
            # host=None lets the SDK read $OLLAMA_HOST and fall back to its default.
            self._client = ollama.AsyncClient(host=host, timeout=timeout)
        inner = getattr(self._client, "_client", None)  # the SDK's httpx client, for traces/errors only
        self._host = str(getattr(inner, "base_url", None) or host or os.environ.get("OLLAMA_HOST") or "ollama")
        self._keep_alive = keep_alive
        self._options = dict(options or {})

    # ------------------------------------------------------------------ protocol
    @property
    def name(self) -> str:
        return self._model

    @property
    def adapter(self) -> str:
        return "ollama"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(native_json_schema=True, json_mode=True, tools=True, streaming=True)

    @property
    def host(self) -> str:
        return self._host

    def __repr__(self) -> str:
        return f"OllamaChat(model={self._model!r}, host={self._host!r})"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        started = time.perf_counter()
        with self._errors_mapped():
            response = await self._client.chat(**self._kwargs(request, stream=False))
        return self._to_response(response, started)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Ollama's NDJSON stream as :class:`StreamChunk` pieces; closing the iterator closes the response."""
        with self._errors_mapped():
            parts = await self._client.chat(**self._kwargs(request, stream=True))
        index = 0
        try:
            with self._errors_mapped():
                async for part in parts:
                    calls = part.message.tool_calls or []
                    deltas = tuple(
                        ToolCallDelta(
                            index=index + i,
                            id=f"call_{index + i}",
                            name=c.function.name,
                            arguments=json.dumps(dict(c.function.arguments), ensure_ascii=False),
                        )
                        for i, c in enumerate(calls)
                    )
                    index += len(calls)
                    finish: FinishReason | None = None
                    if part.done:
                        finish = _FINISH.get(part.done_reason or "stop", "other")
                        finish = "tool_calls" if index and finish == "stop" else finish
                    yield StreamChunk(
                        text=part.message.content or "",
                        tool_calls=deltas,
                        finish_reason=finish,
                        usage=Usage(part.prompt_eval_count, part.eval_count) if part.done else None,
                    )
        finally:
            aclose = getattr(parts, "aclose", None)
            if aclose is not None:
                await aclose()

    def _kwargs(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        # ``extra``: the Ollama fields the SDK can send (its chat() takes no others): options are merged
        # under the request's own sampling settings; format (when no json_schema), keep_alive, think.
        extra = request.extra
        options = dict(self._options)
        if isinstance(extra.get("options"), Mapping):
            options.update(extra["options"])
        if request.temperature is not None:
            options["temperature"] = request.temperature
        if request.seed is not None:
            options["seed"] = request.seed
        if request.max_tokens is not None:
            options["num_predict"] = request.max_tokens
        if request.stop:
            options["stop"] = list(request.stop)
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": [_wire_message(m) for m in request.messages],
            "stream": stream,
            "options": options,
        }
        if request.tools:
            kwargs["tools"] = [t.to_dict() for t in request.tools]
        if request.json_schema is not None:
            # A plain-JSON deep copy: the SDK serialises it and must not share the caller's objects.
            kwargs["format"] = json.loads(json.dumps(request.json_schema))
        elif extra.get("format") is not None:
            kwargs["format"] = extra["format"]
        if self._keep_alive is not None:
            kwargs["keep_alive"] = self._keep_alive
        for key in ("keep_alive", "think"):
            if extra.get(key) is not None:
                kwargs[key] = extra[key]
        return kwargs

    @contextmanager
    def _errors_mapped(self) -> Iterator[None]:
        where = f"ollama chat {self._model!r} at {self._host}"
        try:
            yield
        except ollama.ResponseError as exc:
            status = exc.status_code
            body = str(exc.error)[:_BODY_LIMIT]
            retryable = status in _TRANSIENT_STATUS or status >= 500
            raise ModelError(
                f"{where} failed: HTTP {status}: {body[:_MESSAGE_BODY_LIMIT]}",
                status=status if status > 0 else None,
                body=body,
                retryable=retryable,
            ) from exc
        except httpx.TimeoutException as exc:
            raise ModelError(f"{where} timed out ({type(exc).__name__})", retryable=True) from exc
        except (ConnectionError, httpx.TransportError) as exc:
            # ollama turns httpx.ConnectError into the builtin ConnectionError (cause suppressed).
            raise ModelError(f"{where} could not connect ({type(exc).__name__})", retryable=True) from exc
        except json.JSONDecodeError as exc:  # an HTML page, an empty body: usually a host that is not Ollama
            raise self._malformed(where, "a body that is not JSON", exc) from exc
        except (ValueError, TypeError) as exc:  # JSON that is not a chat response (pydantic; a list or string)
            raise self._malformed(where, f"JSON that is not a chat response ({type(exc).__name__})", exc) from exc

    @staticmethod
    def _malformed(where: str, what: str, exc: Exception) -> ModelError:
        """An HTTP-200 reply that is not a chat response.

        Not retryable (the same host answers the same: usually a host that is not an Ollama server), except
        a JSON object with an ``"error"`` field and no message, which reports a failure behind the server.
        """
        doc = getattr(exc, "doc", None)  # a JSONDecodeError keeps the body
        body = doc if isinstance(doc, str) else None
        retryable = False
        errors = getattr(exc, "errors", None)  # a pydantic ValidationError names the input it rejected
        if callable(errors):
            for item in errors():
                value = item.get("input") if isinstance(item, dict) else None
                if isinstance(value, dict) and len(item.get("loc", ())) <= 1:  # the whole body
                    body = json.dumps(value, default=str)
                    retryable = "error" in value and not value.get("message")
                    break
        body = None if body is None else body[:_BODY_LIMIT]
        hint = "" if retryable else "; check that the host is an Ollama server"
        return ModelError(
            f"{where} returned {what} (HTTP 200){hint}: {(body or str(exc))[:_MESSAGE_BODY_LIMIT]!r}",
            status=200,
            body=body,
            retryable=retryable,
        )

    async def aclose(self) -> None:
        """Close the SDK client if this adapter created it."""
        if self._owns_client:
            close = cast(Callable[[], Awaitable[None]], self._client.close)  # untyped in the SDK
            await close()

    async def __aenter__(self) -> OllamaChat:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _to_response(self, response: ollama.ChatResponse, started: float) -> ChatResponse:
        reason = response.done_reason
        finish: FinishReason = _FINISH.get(reason, "other") if reason else ("stop" if response.done else "other")
        calls = tuple(
            ToolCall(
                id=f"call_{i}",  # Ollama gives tool calls no ids; the position names them
                name=c.function.name,
                arguments=json.dumps(dict(c.function.arguments), ensure_ascii=False),
            )
            for i, c in enumerate(response.message.tool_calls or [])
        )
        if calls and finish == "stop":
            finish = "tool_calls"
        return ChatResponse(
            text=response.message.content or "",
            finish_reason=finish,
            usage=Usage(response.prompt_eval_count, response.eval_count),
            model=response.model or self._model,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            tool_calls=calls,
        )


def _wire_message(m: Message) -> dict[str, Any]:
    """A message in Ollama's shape: tool-call arguments as objects, a tool result named by its tool."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"function": {"name": c.name, "arguments": _arguments(c.arguments)}} for c in m.tool_calls]
    if m.role == "tool" and m.name:
        out["tool_name"] = m.name
    return out


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


__all__ = ["OllamaChat"]
