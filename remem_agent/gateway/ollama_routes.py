"""Ollama wire protocol: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON stream by default, ``"stream":
false`` for one JSON), ``GET /api/tags``, ``GET /api/version``, ``GET /api/ps`` and ``POST /api/show``.

``/api/generate`` is the chat path with one user turn: ``system`` (a system message) and ``prompt`` (the user
message), ``format``, ``options``, ``stream``, ``keep_alive`` and ``think`` as for ``/api/chat``; its reply's
text is ``response``. An empty ``prompt`` only checks the model, as Ollama's preload does (nothing recalled,
nothing sent). What needs Ollama's own prompt handling is refused with a 400 naming the field: ``raw``,
``template``, ``suffix``, ``images`` and a non-empty ``context`` (the reply carries no ``context``: keep the
conversation with ``/api/chat``).

Request fields the gateway reads: ``model``, ``messages`` (tool results named by ``tool_name`` are matched
to the assistant's open tool calls), ``tools``, ``format`` (``"json"`` or a JSON schema), ``options``
(``temperature``, ``num_predict``), ``stream``. For an Ollama upstream the remaining ``options``,
``keep_alive`` and ``think`` go to it untouched; for an OpenAI-compatible upstream the remaining
``options`` become top-level request fields (``seed``, ``top_p``, ``top_k``, ``stop``, ``grammar``...,
the names llama.cpp and vLLM share with Ollama). Other unknown fields go into ``ChatRequest.extra``.

Replies carry the ``x-remem-*`` headers and a ``remem`` field (``answer_id``, ``conversation_id``,
``served``, ``citations``) in the one JSON reply or in the final ``"done": true`` line. A failure after the
first line is an ``{"error": "..."}`` line and the stream ends; nothing is credited.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from remem_agent.adapters.base import ToolCall
from remem_agent.agent.chat_types import ChatReply
from remem_agent.agent.stream import ChatStream
from remem_agent.errors import ModelError
from remem_agent.gateway.auth import Caller, request_scope
from remem_agent.gateway.protocol import (
    ApiError,
    check_schema,
    count,
    embed_inputs,
    json_object,
    no_embeddings,
    number,
    stream_error,
)
from remem_agent.gateway.service import ChatCall, Meta, StreamEnd

if TYPE_CHECKING:
    from remem_agent.gateway.core import Gateway

CONSUMED = frozenset({"model", "messages", "tools", "format", "options", "stream"})
OLLAMA_ONLY = ("keep_alive", "think")
NDJSON = "application/x-ndjson"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def ollama_messages(raw: object) -> object:
    """Ollama messages in the OpenAI shape the agent validates: tool calls get ids, tool results point at them."""
    if not isinstance(raw, list):
        return raw  # the agent's validation says what is wrong
    out: list[object] = []
    open_calls: list[tuple[str, str]] = []  # (id, tool name) of calls not answered yet
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            out.append(m)
            continue
        msg = dict(m)
        calls = msg.get("tool_calls")
        if msg.get("role") == "assistant" and isinstance(calls, list):
            fixed = []
            for j, c in enumerate(calls):
                if isinstance(c, dict):
                    c = {"id": c.get("id") or f"call_{i}_{j}", "type": "function", **c}
                    fn = c.get("function")
                    open_calls.append((str(c["id"]), str(fn.get("name")) if isinstance(fn, dict) else ""))
                fixed.append(c)
            msg["tool_calls"] = fixed
        elif msg.get("role") == "tool" and not msg.get("tool_call_id"):
            name = msg.get("tool_name") or msg.get("name")
            match = next((c for c in open_calls if c[1] == name), open_calls[0] if open_calls else None)
            if match is not None:
                open_calls.remove(match)
                msg["tool_call_id"] = match[0]
                msg.setdefault("name", match[1])
        msg.pop("tool_name", None)
        out.append(msg)
    return out


def parse_call(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ChatCall:
    scope = request_scope(request.headers, None, caller)
    gw.authorize(caller, scope)
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'options' must be an object", code="invalid_value")
    options = dict(options or {})
    temperature = number(options.pop("temperature", None), "options.temperature", lo=0.0, hi=2.0)
    max_tokens = count(options.pop("num_predict", None), "options.num_predict")
    extra = {k: v for k, v in body.items() if k not in CONSUMED}
    if gw.router.adapter == "gateway:ollama":
        if options:
            extra["options"] = options
    else:
        for key in OLLAMA_ONLY:
            extra.pop(key, None)
        extra.update(options)  # llama.cpp / vLLM take these sampling fields at the top level
        if gw.router.adapter == "gateway:openai" and body.get("stream", True) is True:
            extra["stream_options"] = {"include_usage": True}  # eval_count of the final line: the upstream's count
    call = ChatCall(
        model=str(body.get("model")),
        messages=ollama_messages(body.get("messages")),
        scope=scope,
        tools=body.get("tools"),
        temperature=temperature,
        max_tokens=max_tokens,
        extra=extra,
        conversation=request.headers.get("x-remem-conversation"),
        task=request.headers.get("x-remem-task"),
    )
    fmt = body.get("format")
    if fmt == "json":
        call.validate = {"type": "object"}
        if gw.router.adapter == "gateway:ollama":
            call.extra["format"] = "json"  # untouched to an Ollama upstream
        else:
            call.schema = {"type": "object"}
    elif fmt not in (None, ""):
        call.schema = call.validate = check_schema(fmt, "format")
    return call


def _tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        try:
            args = json.loads(c.arguments)
        except ValueError:
            args = {"_raw": c.arguments}
        out.append({"function": {"name": c.name, "arguments": args if isinstance(args, dict) else {"_value": args}}})
    return out


def _done(reply: ChatReply, meta: Meta, model: str, started: float) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": _now(),
        "done": True,
        "done_reason": "length" if reply.finish_reason == "length" else "stop",
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "prompt_eval_count": reply.usage.prompt_tokens or 0,
        "eval_count": reply.usage.completion_tokens or 0,
        "remem": meta.body(),
    }


async def chat(gw: Gateway, request: Request, caller: Caller) -> Response:
    _, stream, call = await gw.read_chat(request, caller, parse_call, stream_default=True)
    model = call.model

    async def done(reply: ChatReply, meta: Meta) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = _tool_calls(reply.tool_calls)
        return {**_done(reply, meta, model, call.timing.started), "message": message}

    return await gw.respond(
        request,
        call,
        stream,
        body=done,
        events=lambda chat, first, meta, end: _ndjson(gw, call, chat, first, meta, model, end, request),
        media_type=NDJSON,
        stream_headers={},
    )


GENERATE_ONLY = frozenset({"prompt", "system"})
_GENERATE_REFUSED = {
    "raw": "raw prompts (no chat template) are not supported: the gateway speaks to chat models",
    "template": "prompt templates are not supported by the gateway",
    "suffix": "fill-in-the-middle (suffix) is not supported by the gateway",
    "images": "images are not supported by the gateway",
    "context": "context tokens are not supported: keep a conversation with /api/chat",
}


def parse_generate(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ChatCall:
    """The chat call of an ``/api/generate`` body: ``system`` and ``prompt`` as two messages."""
    for key, why in _GENERATE_REFUSED.items():
        if body.get(key) not in (None, False, "", []):
            raise ApiError(400, f"{key}: {why}", code="unsupported")
    prompt, system = body.get("prompt", ""), body.get("system")
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string", code="invalid_value")
    if system is not None and not isinstance(system, str):
        raise ApiError(400, "'system' must be a string", code="invalid_value")
    request.state.preload = not prompt.strip()
    messages = [
        *([{"role": "system", "content": system}] if system else []),
        {"role": "user", "content": prompt or "-"},
    ]
    rest = {k: v for k, v in body.items() if k not in GENERATE_ONLY and k not in _GENERATE_REFUSED}
    return parse_call(gw, {**rest, "messages": messages, "tools": None}, request, caller)


async def generate(gw: Gateway, request: Request, caller: Caller) -> Response:
    _, stream, call = await gw.read_chat(request, caller, parse_generate, stream_default=True)
    model = call.model
    if request.state.preload:  # Ollama's "load the model" call: answered without recall or upstream
        return JSONResponse({"model": model, "created_at": _now(), "response": "", "done": True, "done_reason": "load"})

    async def done(reply: ChatReply, meta: Meta) -> dict[str, Any]:
        return {**_done(reply, meta, model, call.timing.started), "response": reply.text}

    return await gw.respond(
        request,
        call,
        stream,
        body=done,
        events=lambda chat, first, meta, end: _ndjson(gw, call, chat, first, meta, model, end, request, generate=True),
        media_type=NDJSON,
        stream_headers={},
    )


def _line(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


async def _ndjson(
    gw: Gateway,
    call: ChatCall,
    chat_stream: ChatStream,
    first: Any,
    meta: Meta,
    model: str,
    end: StreamEnd,
    request: Request,
    *,
    generate: bool = False,
) -> AsyncIterator[bytes]:
    """The NDJSON lines of a stream: ``message`` pieces for ``/api/chat``, ``response`` pieces for generate."""

    def text(piece: str) -> dict[str, Any]:
        return {"response": piece} if generate else {"message": {"role": "assistant", "content": piece}}

    try:
        async for c in gw.service.chunks(chat_stream, first, call):
            if c.text:
                yield _line({"model": model, "created_at": _now(), **text(c.text), "done": False})
        reply = chat_stream.reply
        if reply is not None:
            if reply.tool_calls and not generate:
                msg = {"role": "assistant", "content": "", "tool_calls": _tool_calls(reply.tool_calls)}
                yield _line({"model": model, "created_at": _now(), "message": msg, "done": False})
            done = gw.service.meta(call, meta.conversation_id, reply)
            final = _done(reply, done, model, call.timing.started)
            yield _line({**final, **text("")})
    except (ModelError, TimeoutError) as exc:
        err = stream_error(exc)
        request.state.error = err.code
        yield _line(err.body("ollama"))
    finally:
        await end()


async def embed(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``POST /api/embed {"model", "input": text | [text, ...]}``: the upstream's embeddings, as Ollama returns
    them (nothing of the memory is read or written; ``truncate``, ``options``, ``keep_alive`` and
    ``dimensions`` are not passed on)."""
    started = time.perf_counter()
    body = json_object(await gw.read_body(request))
    model = await gw.service.check_model(body.get("model"))
    texts = embed_inputs(body.get("input"), "input")
    if not gw.router.embeds:
        raise no_embeddings()
    vectors, tokens = await gw.router.embed(model, texts)
    out = {
        "model": model,
        "embeddings": vectors,
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
    }
    if tokens is not None:
        out["prompt_eval_count"] = tokens
    return JSONResponse(out)


def _model_entry(gw: Gateway, name: str) -> dict[str, Any]:
    modified = datetime.fromtimestamp(gw.started, UTC).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": modified, "size": 0, "digest": "", "details": _DETAILS}


_DETAILS = {"format": "remem-gateway", "family": "", "parameter_size": "", "quantization_level": ""}


async def tags(gw: Gateway, request: Request, caller: Caller) -> Response:
    return JSONResponse({"models": [_model_entry(gw, n) for n in await gw.router.models()]})


async def version(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``GET /api/version``: the gateway's own version (Ollama UIs call it to detect a server)."""
    from remem_agent import __version__

    return JSONResponse({"version": __version__})


async def ps(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``GET /api/ps``: the models served, as Ollama lists its loaded ones (no size: they live elsewhere)."""
    far = "9999-12-31T23:59:59Z"  # served for as long as the gateway runs
    models = [{**_model_entry(gw, n), "expires_at": far, "size_vram": 0} for n in await gw.router.models()]
    return JSONResponse({"models": models})


async def show(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``POST /api/show {"model": NAME}``: what the gateway knows of a model it serves (404 for another)."""
    body = json_object(await gw.read_body(request))
    name = body.get("model", body.get("name"))
    name = await gw.service.check_model(name)
    caps = gw.router.capabilities
    return JSONResponse(
        {
            "modified_at": _model_entry(gw, name)["modified_at"],
            "details": _DETAILS,
            "model_info": {},
            "parameters": "",
            "template": "",
            "capabilities": ["completion", *(["tools"] if caps.tools else [])],
        }
    )
