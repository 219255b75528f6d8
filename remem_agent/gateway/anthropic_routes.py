"""Anthropic Messages protocol: ``POST /v1/messages`` (JSON or SSE events).

The request is translated into the protocol-neutral :class:`~remem_agent.gateway.service.ChatCall` of the chat
path, so recall, the memory block, citations and outcomes are the same as for a chat completion, and the
upstream may speak either protocol the gateway supports (an Anthropic client in front of an
OpenAI-compatible or Ollama model).

Request fields: ``model``, ``max_tokens`` (required, as Anthropic's API has it), ``messages`` (text,
``tool_use`` and ``tool_result`` blocks; ``thinking`` blocks are skipped), ``system`` (text or text blocks),
``tools`` (client tools with ``input_schema``), ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``),
``temperature``, ``top_p``, ``top_k``, ``stop_sequences``, ``stream``, ``metadata.user_id`` (the scope's user,
as OpenAI's ``user``), ``output_config.format`` (``json_schema``: sent as the model's structured output and
the reply checked). Accepted without effect: ``cache_control``, ``service_tier``, ``inference_geo``,
``speed``, ``diagnostics``, ``output_config.effort`` and ``thinking`` of type ``disabled``. Images,
documents, server tools, enabled thinking and unknown fields are refused with a 400 naming them, before
anything is written or sent upstream. Errors come in Anthropic's shape (``{"type": "error", "error": {"type",
"message"}}``); the gateway's API key may be sent as ``x-api-key``, as Anthropic clients do.

A message's ``id`` is ``msg_``, its answer id and a suffix of its own: ``POST /v1/feedback`` takes it for the
answer. The reply carries the ``x-remem-*`` headers and a ``remem`` field (streamed: in the
``message_delta`` event, the one that also carries the stop reason and usage).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from remem_agent.adapters.base import StreamChunk, ToolCall, Usage
from remem_agent.agent.chat_types import ChatReply
from remem_agent.agent.stream import ChatStream
from remem_agent.errors import ModelError
from remem_agent.gateway.auth import Caller, request_scope
from remem_agent.gateway.openai_routes import MESSAGE_PREFIX, apply_response_format, flag, route_extra
from remem_agent.gateway.protocol import ApiError, count, number, stream_error
from remem_agent.gateway.service import ChatCall, Meta, StreamEnd

if TYPE_CHECKING:
    from remem_agent.gateway.core import Gateway

SUPPORTED = frozenset(
    {
        "model", "max_tokens", "messages", "system", "tools", "tool_choice", "temperature", "top_p", "top_k",
        "stop_sequences", "stream", "metadata", "output_config", "thinking",
    }
)  # fmt: skip
IGNORED = frozenset({"cache_control", "service_tier", "inference_geo", "speed", "diagnostics"})
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def new_message_id(answer_id: str) -> str:
    """A message's own id: ``msg_``, its answer id and a suffix (an agent loop's calls share their answer)."""
    return f"{MESSAGE_PREFIX}{answer_id}-{uuid.uuid4().hex[:12]}"


def stop_reason(finish: str | None) -> str:
    return _STOP.get(finish or "stop", "end_turn")


# ------------------------------------------------------------------------------------------- request
def parse_call(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ChatCall:
    """A protocol-neutral call from a Messages body (raises :class:`ApiError` on bad input)."""
    for key in body:
        if key not in SUPPORTED and key not in IGNORED:
            raise ApiError(400, f"unknown parameter: {key!r}", code="unknown_parameter")
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise ApiError(400, "thinking: extended thinking is not supported by the gateway", code="unsupported")
    if "max_tokens" not in body:
        raise ApiError(400, "max_tokens: field required", code="invalid_value")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ApiError(400, "metadata must be an object", code="invalid_value")
    user = (metadata or {}).get("user_id")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "metadata.user_id must be a string", code="invalid_value")
    scope = request_scope(request.headers, user, caller)
    gw.authorize(caller, scope)
    messages = [*_system(body.get("system")), *chat_messages(body.get("messages"))]
    extra: dict[str, Any] = {}
    if body.get("top_p") is not None:
        extra["top_p"] = number(body["top_p"], "top_p", lo=0.0, hi=1.0)
    if body.get("top_k") is not None:
        extra["top_k"] = count(body["top_k"], "top_k")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
            raise ApiError(400, "stop_sequences must be a list of at most 16 non-empty strings", code="invalid_value")
        if stops:
            extra["stop"] = stops
    call = ChatCall(
        model=str(body.get("model")),
        messages=messages,
        scope=scope,
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        temperature=number(body.get("temperature"), "temperature", lo=0.0, hi=1.0),
        max_tokens=count(body.get("max_tokens"), "max_tokens"),
        extra=extra,
        conversation=request.headers.get("x-remem-conversation"),
        task=request.headers.get("x-remem-task"),
        strip=flag(request.headers.get("x-remem-strip-citations")),
    )
    output = body.get("output_config")
    if output is not None:
        if not isinstance(output, dict) or set(output) - {"format", "effort"}:
            raise ApiError(400, "output_config takes 'format' (and 'effort')", code="invalid_value")
        fmt = output.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
                raise ApiError(400, "output_config.format.type must be 'json_schema'", code="invalid_value")
            chat_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": fmt.get("schema")}}
            apply_response_format(gw, call, chat_format, "output_config.format")
    route_extra(gw, call, stream_usage=body.get("stream") is True)
    return call


def _system(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    return [{"role": "system", "content": _text_blocks(value, "system")}]


def _text_blocks(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be text or a list of text blocks", code="invalid_value")
    parts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ApiError(400, f"{where}[{j}]: only text blocks are supported here, got {kind!r}", code="unsupported")
        parts.append(block["text"])
    return "\n".join(parts)


def chat_messages(value: object) -> list[dict[str, Any]]:
    """Messages API turns as chat messages: a user turn's ``tool_result`` blocks become tool messages (first,
    in order), its text a user message; an assistant turn's ``tool_use`` blocks become its tool calls."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list", code="invalid_value")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"{where} must be an object with role 'user' or 'assistant'", code="invalid_value")
        role, content = msg["role"], msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError(400, f"{where}.content must be text or a list of blocks", code="invalid_value")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            w = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(block, dict):
                raise ApiError(400, f"{w} must be a content block object", code="invalid_value")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                tool_input = block.get("input", {})
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise ApiError(400, f"{w}: a tool_use block needs 'id' and 'name'", code="invalid_value")
                if not isinstance(tool_input, dict):
                    raise ApiError(400, f"{w}.input must be an object", code="invalid_value")
                arguments = json.dumps(tool_input, ensure_ascii=False)
                calls.append(
                    {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
                )
            elif kind == "tool_result" and role == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise ApiError(400, f"{w}: a tool_result block needs 'tool_use_id'", code="invalid_value")
                result = _text_blocks(block.get("content", ""), f"{w}.content")
                if block.get("is_error") is True:
                    result = f"Error: {result}"
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue
            else:
                raise ApiError(
                    400, f"{w}: {kind!r} blocks are not supported in {role} turns by the gateway", code="unsupported"
                )
        out += results
        if role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
        elif texts or not results:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tools(value: object) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError(400, "tools must be a list", code="invalid_value")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise ApiError(
                400,
                f"tools[{i}]: only client tools with an input_schema are supported, got {kind!r}",
                code="unsupported",
            )
        fn = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: object) -> object:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value, dict) and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    what = "tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}"
    raise ApiError(400, what, code="invalid_value")


# ------------------------------------------------------------------------------------------ response
def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}  # a model's malformed arguments, kept rather than dropped
    return value if isinstance(value, dict) else {"value": value}


def content_blocks(text: str, calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)} for c in calls]
    return blocks


def _usage(u: Usage | None) -> dict[str, int]:
    u = u or Usage()
    return {"input_tokens": u.prompt_tokens or 0, "output_tokens": u.completion_tokens or 0}


# ----------------------------------------------------------------------------------------- the route
async def messages(gw: Gateway, request: Request, caller: Caller) -> Response:
    _, stream, call = await gw.read_chat(request, caller, parse_call, stream_default=False)

    async def message(reply: ChatReply, meta: Meta) -> dict[str, Any]:
        return {
            "id": new_message_id(meta.answer_id),
            "type": "message",
            "role": "assistant",
            "model": call.model,
            "content": content_blocks(reply.text, reply.tool_calls),
            "stop_reason": stop_reason(reply.finish_reason),
            "stop_sequence": None,
            "usage": _usage(reply.usage),
            "remem": meta.body(),
        }

    return await gw.respond(
        request,
        call,
        stream,
        body=message,
        events=lambda chat, first, meta, end: _events(gw, call, chat, first, meta, end, request),
    )


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n".encode()


async def _events(
    gw: Gateway, call: ChatCall, chat: ChatStream, first: StreamChunk | None, meta: Meta, end: StreamEnd,
    request: Request,
) -> AsyncIterator[bytes]:  # fmt: skip
    open_block: tuple[str, int] | None = None  # ("text", index) or ("tool", upstream tool index)
    blocks = 0
    tool_blocks: dict[int, int] = {}  # upstream tool-call index -> content block index
    usage: Usage | None = None
    finish: str | None = None

    def start(kind: str, key: int, block: dict[str, Any]) -> bytes:
        nonlocal open_block, blocks
        out = stop()
        index = blocks
        blocks += 1
        if kind == "tool":
            tool_blocks[key] = index
        open_block = (kind, key)
        return out + _event("content_block_start", index=index, content_block=block)

    def stop() -> bytes:
        nonlocal open_block
        if open_block is None:
            return b""
        open_block = None
        return _event("content_block_stop", index=blocks - 1)

    def piece(c: StreamChunk) -> bytes:
        out = b""
        if c.text:
            if open_block is None or open_block[0] != "text":
                out += start("text", 0, {"type": "text", "text": ""})
            out += _event("content_block_delta", index=blocks - 1, delta={"type": "text_delta", "text": c.text})
        for d in c.tool_calls:
            if d.index not in tool_blocks:
                block = {"type": "tool_use", "id": d.id or f"toolu_{d.index}", "name": d.name or "", "input": {}}
                out += start("tool", d.index, block)
            if d.arguments:
                delta = {"type": "input_json_delta", "partial_json": d.arguments}
                out += _event("content_block_delta", index=tool_blocks[d.index], delta=delta)
        return out

    try:
        message: dict[str, Any] = {
            "id": new_message_id(meta.answer_id), "type": "message", "role": "assistant", "model": call.model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(None),
        }  # fmt: skip
        head = _event("message_start", message=message)
        if first is not None:
            usage, finish = first.usage or usage, first.finish_reason or finish
            head += piece(first)
        yield head
        async for c in gw.service.chunks(chat, None, call):
            usage, finish = c.usage or usage, c.finish_reason or finish
            frame = piece(c)
            if frame:
                yield frame
        reply = chat.reply
        tail = b"" if blocks else start("text", 0, {"type": "text", "text": ""})  # an empty reply: one empty block
        tail += stop()
        done = gw.service.meta(call, meta.conversation_id, reply) if reply is not None else meta
        delta = {"stop_reason": stop_reason(finish), "stop_sequence": None}
        tail += _event("message_delta", delta=delta, usage=_usage(usage), remem=done.body())
        yield tail + _event("message_stop")
    except (ModelError, TimeoutError) as exc:
        err = stream_error(exc)
        request.state.error = err.code
        yield b"event: error\ndata: " + json.dumps(err.body("anthropic")).encode() + b"\n\n"
    finally:
        await end()
