"""OpenAI wire protocol: ``POST /v1/chat/completions`` (JSON or SSE), the legacy ``POST /v1/completions`` and
``GET /v1/models``.

``/v1/completions`` is the chat path with one user turn: its ``prompt`` (one string, or a list of one) is the
user message sent to the chat model upstream, and the reply's text is ``choices[0].text`` (streamed as
``text_completion`` chunks). ``max_tokens``, ``temperature``, ``stop`` and the other sampling fields go on as
for a chat completion. Not offered, each a 400 naming the field: several prompts, ``n``/``best_of`` above 1,
``echo``, ``suffix`` and ``logprobs`` (a chat upstream continues no raw text).

Request fields the gateway reads: ``model``, ``messages``, ``tools``, ``tool_choice``, ``temperature``,
``max_tokens``/``max_completion_tokens``, ``stream``, ``stream_options``, ``response_format``, ``user``
(the scope's user; also sent on), ``n`` (only 1); ``stream_options`` is also sent on to an OpenAI-compatible
upstream (so its stream reports usage). Every other field goes to the upstream untouched
(``ChatRequest.extra``); for an Ollama upstream the sampling fields (``seed``, ``top_p``, ``top_k``,
``stop``, ``presence_penalty``, ``frequency_penalty``) are moved into Ollama's ``options``.

``response_format``: ``json_schema`` is sent as ``ChatRequest.json_schema`` (each adapter's native
structured output) and the reply is validated against it; ``json_object`` goes untouched to an OpenAI
upstream (else as the schema ``{"type": "object"}``). The result is ``remem.schema_valid``; the reply is
returned as the upstream wrote it either way (no re-ask: that is ``MemoryAgent.ask``'s job).

The completion is the upstream's reply plus ``remem`` (``answer_id``, ``conversation_id``, ``served``,
``citations``) and the ``x-remem-*`` headers. Streaming (SSE): OpenAI chunks, then, when
``stream_options.include_usage`` is set, a usage chunk, then ONE extra chunk with ``choices: []`` and the
``remem`` field (the citations are only known at the end), then ``data: [DONE]``. A failure after the first
byte is an ``data: {"error": {...}}`` event and the stream ends (no ``[DONE]``); nothing is credited.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from remem_agent.adapters.base import StreamChunk, Usage
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

CONSUMED = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "response_format",
        "n",
    }
)
OLLAMA_OPTIONS = ("seed", "top_p", "top_k", "stop", "presence_penalty", "frequency_penalty")
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def finish_reason(reason: str | None) -> str:
    return _FINISH.get(reason or "stop", "stop")


def _usage(u: Usage) -> dict[str, int]:
    p, c = u.prompt_tokens or 0, u.completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def parse_call(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ChatCall:
    """A protocol-neutral call from an OpenAI request body (raises :class:`ApiError` on bad input)."""
    if body.get("n") not in (None, 1):
        raise ApiError(400, "n > 1 is not supported by the gateway (one reply per call)", code="unsupported")
    scope = request_scope(request.headers, body.get("user"), caller)
    gw.authorize(caller, scope)
    max_tokens = count(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens")
    extra = {k: v for k, v in body.items() if k not in CONSUMED}
    call = ChatCall(
        model=str(body.get("model")),
        messages=body.get("messages"),
        scope=scope,
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        temperature=number(body.get("temperature"), "temperature", lo=0.0, hi=2.0),
        max_tokens=max_tokens,
        extra=extra,
        conversation=request.headers.get("x-remem-conversation"),
        task=request.headers.get("x-remem-task"),
        strip=flag(request.headers.get("x-remem-strip-citations")),
    )
    apply_response_format(gw, call, body.get("response_format"), "response_format")
    route_extra(gw, call)
    return call


def apply_response_format(gw: Gateway, call: ChatCall, fmt: object, where: str) -> None:
    """An OpenAI output format (chat's ``response_format``, Responses' ``text.format`` in chat's shape) on the call."""
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise ApiError(400, f"{where}.json_schema must be an object", code="invalid_value")
        call.schema = check_schema(spec.get("schema"), f"{where}.json_schema.schema")
        call.validate = call.schema
        call.schema_name = str(spec.get("name") or "answer")
    elif kind == "json_object":
        call.validate = {"type": "object"}
        if gw.router.adapter == "gateway:openai":
            call.extra["response_format"] = fmt  # untouched to an OpenAI-compatible upstream
        else:
            call.schema = {"type": "object"}
    elif kind != "text":
        raise ApiError(400, f"{where}.type must be 'text', 'json_object' or 'json_schema'", code="invalid_value")


def route_extra(gw: Gateway, call: ChatCall, *, stream_usage: bool = False) -> None:
    """The client's other fields as the upstream's protocol takes them (Ollama: sampling under ``options``).

    ``stream_usage``: the call streams and its protocol reports usage at the end (Responses, Messages, Ollama):
    an OpenAI-compatible upstream is asked to count its stream's tokens (``stream_options.include_usage``)."""
    if gw.router.adapter != "gateway:openai":
        call.extra.pop("stream_options", None)  # an OpenAI-compatible upstream gets it (usage in the stream)
    elif stream_usage and "stream_options" not in call.extra:
        call.extra["stream_options"] = {"include_usage": True}
    if gw.router.adapter == "gateway:ollama":
        options = {k: call.extra.pop(k) for k in OLLAMA_OPTIONS if k in call.extra}
        if options:
            given = call.extra.get("options")
            call.extra["options"] = {**(given if isinstance(given, dict) else {}), **options}


def flag(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() in ("1", "true", "yes", "on")


COMPLETION_PREFIX = "chatcmpl-"
TEXT_COMPLETION_PREFIX = "cmpl-"  # a legacy text completion: cmpl-<answer id>


def completion_id(answer_id: str) -> str:
    """A chat completion's ``id`` (every OpenAI client keeps it): ``chatcmpl-`` and the answer id, so that
    ``POST /v1/feedback`` takes either (:func:`answer_id_of`)."""
    return COMPLETION_PREFIX + answer_id


RESPONSE_PREFIX = "resp_"  # a response of the Responses protocol: resp_<answer id>-<suffix>
MESSAGE_PREFIX = "msg_"  # a message of the Anthropic protocol: msg_<answer id>-<suffix>


def answer_id_of(given: str) -> str:
    """The answer id a feedback names: itself, or the one inside a (text) completion's id (``chatcmpl-<answer>``,
    ``cmpl-<answer>``),
    a response's (``resp_<answer>-<suffix>``) or an Anthropic message's (``msg_<answer>-<suffix>``)."""
    for whole in (COMPLETION_PREFIX, TEXT_COMPLETION_PREFIX):
        if given.startswith(whole):
            return given[len(whole) :]
    for prefix in (RESPONSE_PREFIX, MESSAGE_PREFIX):
        if given.startswith(prefix):
            return given[len(prefix) :].rsplit("-", 1)[0]
    return given


async def chat_completions(gw: Gateway, request: Request, caller: Caller) -> Response:
    body, stream, call = await gw.read_chat(request, caller, parse_call, stream_default=False)
    model = call.model
    include_usage = isinstance(body.get("stream_options"), dict) and bool(body["stream_options"].get("include_usage"))

    async def completion(reply: ChatReply, meta: Meta) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [c.to_dict() for c in reply.tool_calls]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "id": completion_id(meta.answer_id),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason(reply.finish_reason),
                    "logprobs": None,
                }
            ],
            "usage": _usage(reply.usage),
            "remem": meta.body(),
        }

    return await gw.respond(
        request,
        call,
        stream,
        body=completion,
        events=lambda chat, first, meta, end: _sse(gw, call, chat, first, meta, model, include_usage, end, request),
    )


def _frame(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def _delta(c: StreamChunk) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if c.text:
        delta["content"] = c.text
    if c.tool_calls:
        calls = []
        for d in c.tool_calls:
            item: dict[str, Any] = {"index": d.index}
            fn: dict[str, Any] = {"arguments": d.arguments}
            if d.id:
                item.update(id=d.id, type="function")
            if d.name:
                fn["name"] = d.name
            item["function"] = fn
            calls.append(item)
        delta["tool_calls"] = calls
    return delta


async def _sse(
    gw: Gateway,
    call: ChatCall,
    chat: ChatStream,
    first: StreamChunk | None,
    meta: Meta,
    model: str,
    include_usage: bool,
    end: StreamEnd,
    request: Request,
) -> AsyncIterator[bytes]:
    cid, created = completion_id(meta.answer_id), int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _frame(
            {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
        )

    def piece(c: StreamChunk) -> bytes:
        delta = _delta(c)
        if delta or c.finish_reason is not None:
            return chunk(delta, finish_reason(c.finish_reason) if c.finish_reason is not None else None)
        return b""

    # Frames that are ready together go out as one body message (one socket write, the same bytes): the role
    # chunk with the upstream's first chunk (received before the response started), and the closing frames.
    usage: Usage | None = None
    try:
        head = chunk({"role": "assistant", "content": ""})
        if first is not None:
            usage = first.usage or usage
            head += piece(first)
        yield head
        async for c in gw.service.chunks(chat, None, call):
            usage = c.usage or usage
            frame = piece(c)
            if frame:
                yield frame
        reply = chat.reply
        tail = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": []}
        end_frames = b""
        if include_usage:
            end_frames += _frame({**tail, "usage": _usage(usage or Usage())})
        if reply is not None:
            done = gw.service.meta(call, meta.conversation_id, reply)
            end_frames += _frame({**tail, "remem": done.body()})
        yield end_frames + b"data: [DONE]\n\n"
    except (ModelError, TimeoutError) as exc:
        err = stream_error(exc)
        request.state.error = err.code
        yield _frame(err.body("openai"))
    finally:
        await end()


_LEGACY_REFUSED = {
    "echo": "echo is not supported: the upstream is a chat model",
    "suffix": "suffix (fill-in-the-middle) is not supported: the upstream is a chat model",
    "logprobs": "logprobs are not supported by the gateway",
}


def parse_text_completion(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ChatCall:
    """The chat call of a legacy ``/v1/completions`` body: its prompt as the one user message."""
    for key, why in _LEGACY_REFUSED.items():
        if body.get(key) not in (None, False, 0):
            raise ApiError(400, f"{key}: {why}", code="unsupported")
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "best_of > 1 is not supported by the gateway (one reply per call)", code="unsupported")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "prompt must be one non-empty string (several prompts are not supported)",
                       code="invalid_value")  # fmt: skip
    rest = {k: v for k, v in body.items() if k not in ("prompt", "echo", "suffix", "logprobs", "best_of")}
    return parse_call(gw, {**rest, "messages": [{"role": "user", "content": prompt}]}, request, caller)


def _text_choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


async def text_completions(gw: Gateway, request: Request, caller: Caller) -> Response:
    body, stream, call = await gw.read_chat(request, caller, parse_text_completion, stream_default=False)
    include_usage = isinstance(body.get("stream_options"), dict) and bool(body["stream_options"].get("include_usage"))

    async def completion(reply: ChatReply, meta: Meta) -> dict[str, Any]:
        return {
            "id": TEXT_COMPLETION_PREFIX + meta.answer_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": call.model,
            "choices": [_text_choice(reply.text, finish_reason(reply.finish_reason))],
            "usage": _usage(reply.usage),
            "remem": meta.body(),
        }

    return await gw.respond(
        request,
        call,
        stream,
        body=completion,
        events=lambda chat, first, meta, end: _text_sse(gw, call, chat, first, meta, include_usage, end, request),
    )


async def _text_sse(
    gw: Gateway,
    call: ChatCall,
    chat: ChatStream,
    first: StreamChunk | None,
    meta: Meta,
    include_usage: bool,
    end: StreamEnd,
    request: Request,
) -> AsyncIterator[bytes]:
    head = {"id": TEXT_COMPLETION_PREFIX + meta.answer_id, "object": "text_completion",
            "created": int(time.time()), "model": call.model}  # fmt: skip
    usage: Usage | None = None

    def piece(c: StreamChunk) -> bytes:
        finish = finish_reason(c.finish_reason) if c.finish_reason is not None else None
        if not c.text and finish is None:
            return b""
        return _frame({**head, "choices": [_text_choice(c.text, finish)]})

    try:
        if first is not None:
            usage = first.usage or usage
            frame = piece(first)
            if frame:
                yield frame
        async for c in gw.service.chunks(chat, None, call):
            usage = c.usage or usage
            frame = piece(c)
            if frame:
                yield frame
        reply = chat.reply
        tail = b""
        if include_usage:
            tail += _frame({**head, "choices": [], "usage": _usage(usage or Usage())})
        if reply is not None:
            tail += _frame({**head, "choices": [], "remem": gw.service.meta(call, meta.conversation_id, reply).body()})
        yield tail + b"data: [DONE]\n\n"
    except (ModelError, TimeoutError) as exc:
        err = stream_error(exc)
        request.state.error = err.code
        yield _frame(err.body("openai"))
    finally:
        await end()


async def embeddings(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``POST /v1/embeddings {"model", "input": text | [text, ...]}``: the upstream's embeddings, in OpenAI's
    list shape (nothing of the memory is read or written): ``encoding_format`` ``float`` or ``base64`` (little-endian
    float32, what the ``openai`` client asks for by default). Token-array input is refused."""
    body = json_object(await gw.read_body(request))
    model = await gw.service.check_model(body.get("model"))
    texts = embed_inputs(body.get("input"), "input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, "encoding_format must be 'float' or 'base64'", code="invalid_value")
    if not gw.router.embeds:
        raise no_embeddings()
    vectors, tokens = await gw.router.embed(model, texts)
    encoded: list[Any] = vectors if encoding == "float" else [_base64(v) for v in vectors]
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(encoded)]
    usage = {"prompt_tokens": tokens or 0, "total_tokens": tokens or 0}
    return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


async def list_models(gw: Gateway, request: Request, caller: Caller) -> Response:
    names = await gw.router.models()
    created = int(gw.started)
    data = [{"id": n, "object": "model", "created": created, "owned_by": "remem-gateway"} for n in names]
    return JSONResponse({"object": "list", "data": data})
