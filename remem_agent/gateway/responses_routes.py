"""OpenAI Responses protocol: ``POST /v1/responses`` (JSON or SSE events), with stored responses.

The request is translated into the same protocol-neutral :class:`~remem_agent.gateway.service.ChatCall` as a
chat completion, so recall, the memory block, citations and outcomes are the chat path's, and the upstream
may speak either protocol the gateway supports.

Request fields: ``input`` (a string, or items: messages with text content, ``function_call`` and
``function_call_output``; ``reasoning`` items are skipped), ``instructions`` (a system message, not carried
over by ``previous_response_id``, as OpenAI's protocol says), ``tools`` (function tools), ``tool_choice``,
``temperature``, ``top_p``, ``max_output_tokens``, ``text.format`` (``text``, ``json_object``,
``json_schema``: sent as the model's structured output and the reply checked, as ``response_format``),
``stream``, ``store``, ``previous_response_id``, ``user``, ``metadata``, ``parallel_tool_calls``.
Accepted and echoed but without effect here: ``truncation``, ``include``, ``reasoning``, ``service_tier``,
``prompt_cache_key``, ``safety_identifier``, ``top_logprobs``, ``stream_options``. Anything else, other tool
types, image or file content, ``background`` and ``conversation`` objects are refused with a 400 naming
the field, before anything is written or sent upstream.

Stored responses (``store``, default true) are ledger rows (:mod:`remem_agent.store.responses`) in the
caller's scope, kept ``response_retention_s`` (``remem serve --response-retention-days``); an unknown,
expired or other scope's ``previous_response_id`` is a 404. A response's ``id`` is ``resp_``, its answer
id and a suffix of its own (an agent loop's calls share one answer): ``POST /v1/feedback`` takes it for the
answer. The response carries the ``x-remem-*`` headers and a ``remem`` field (in the ``response.completed``
event when streamed).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from remem_agent.adapters.base import StreamChunk, ToolCall, Usage
from remem_agent.agent.chat_types import ChatReply
from remem_agent.agent.stream import ChatStream
from remem_agent.errors import ModelError
from remem_agent.gateway.auth import Caller, request_scope
from remem_agent.gateway.openai_routes import RESPONSE_PREFIX, apply_response_format, flag, route_extra
from remem_agent.gateway.protocol import ApiError, count, number, stream_error
from remem_agent.gateway.service import ChatCall, Meta, StreamEnd
from remem_agent.store import responses as stored

if TYPE_CHECKING:
    from remem_agent.gateway.core import Gateway

SUPPORTED = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
        "text", "stream", "store", "previous_response_id", "user", "metadata", "parallel_tool_calls",
    }
)  # fmt: skip
IGNORED = frozenset(
    {
        "truncation", "include", "reasoning", "service_tier", "prompt_cache_key", "safety_identifier",
        "top_logprobs", "stream_options",
    }
)  # fmt: skip
REFUSED = {
    "background": "background responses are not supported by the gateway",
    "conversation": "conversation objects are not supported: use previous_response_id or x-remem-conversation",
    "prompt": "prompt templates are not supported by the gateway",
}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def new_response_id(answer_id: str) -> str:
    """A response's own id: ``resp_``, its answer id and a suffix (an agent loop's calls share their answer, and
    each of their responses can be continued on its own); :func:`~.openai_routes.answer_id_of` reads it back."""
    return f"{RESPONSE_PREFIX}{answer_id}-{uuid.uuid4().hex[:12]}"


@dataclass
class ResponsesCall:
    """A Responses request, parsed: the chat call (its messages without the stored conversation yet), what
    this request adds to that conversation, and what the response echoes."""

    call: ChatCall
    added: list[dict[str, Any]]  # this request's input as chat messages (instructions not included)
    instructions: str | None
    previous: str | None
    store: bool
    echo: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- request
def parse_call(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ChatCall:
    """The chat call of a Responses body (``read_chat``'s parser); the rest is kept on ``request.state``."""
    parsed = _parse(gw, body, request, caller)
    request.state.responses = parsed
    return parsed.call


def _parse(gw: Gateway, body: dict[str, Any], request: Request, caller: Caller) -> ResponsesCall:
    for key in body:
        if key in REFUSED and body[key] not in (None, False):
            raise ApiError(400, f"{key}: {REFUSED[key]}", code="unsupported")
        if key not in SUPPORTED and key not in IGNORED and key not in REFUSED:
            raise ApiError(400, f"unknown parameter: {key!r}", code="unknown_parameter")
    scope = request_scope(request.headers, body.get("user"), caller)
    gw.authorize(caller, scope)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", code="invalid_value")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous.startswith(RESPONSE_PREFIX)):
        raise ApiError(400, "previous_response_id must be a response id (resp_...)", code="invalid_value")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise ApiError(400, "store must be true or false", code="invalid_value")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()) and len(metadata) <= 16
    ):
        raise ApiError(400, "metadata must be an object of at most 16 string values", code="invalid_value")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", code="invalid_value")
    added = input_messages(body.get("input"))
    tools = _tools(body.get("tools"))
    extra: dict[str, Any] = {}
    for key in ("top_p", "user", "parallel_tool_calls"):
        if body.get(key) is not None:
            extra[key] = body[key]
    if "top_p" in extra:
        number(extra["top_p"], "top_p", lo=0.0, hi=1.0)
    system = [{"role": "system", "content": instructions}] if instructions else []
    call = ChatCall(
        model=str(body.get("model")),
        messages=[*system, *added],
        scope=scope,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice")),
        temperature=number(body.get("temperature"), "temperature", lo=0.0, hi=2.0),
        max_tokens=count(body.get("max_output_tokens"), "max_output_tokens"),
        extra=extra,
        conversation=request.headers.get("x-remem-conversation"),
        task=request.headers.get("x-remem-task"),
        strip=flag(request.headers.get("x-remem-strip-citations")),
    )
    text = body.get("text")
    fmt: Any = None
    if text is not None:
        if not isinstance(text, dict):
            raise ApiError(400, "text must be an object ({'format': {...}})", code="invalid_value")
        fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":  # Responses puts the schema's fields inline
        fmt = {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    apply_response_format(gw, call, fmt, "text.format")
    route_extra(gw, call, stream_usage=body.get("stream") is True)
    echo = {
        "instructions": instructions,
        "metadata": metadata or {},
        "parallel_tool_calls": True if parallel is None else parallel,
        "temperature": call.temperature,
        "top_p": extra.get("top_p"),
        "max_output_tokens": call.max_tokens,
        "previous_response_id": previous,
        "store": store,
        "text": {"format": (text or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
    }
    return ResponsesCall(call, added, instructions, previous, store, echo)


def input_messages(value: object) -> list[dict[str, Any]]:
    """Responses input (a string or items) as chat messages; function calls join the assistant turn before."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of items", code="invalid_value")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object", code="invalid_value")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(400, f"{where}.role must be user, assistant, system or developer", code="invalid_value")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": _string(item.get("call_id"), f"{where}.call_id"),
                "type": "function",
                "function": {
                    "name": _string(item.get("name"), f"{where}.name"),
                    "arguments": _string(item.get("arguments"), f"{where}.arguments", empty=True),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not last["content"]):
                last.setdefault("tool_calls", []).append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]  # the reply's text and its calls are one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item.get("call_id"), f"{where}.call_id"),
                    "content": output if isinstance(output, str) else _text(output, f"{where}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # a reasoning model's own notes: nothing to send a chat upstream
        else:
            raise ApiError(
                400,
                f"{where}: items of type {kind!r} are not supported (message, function_call, function_call_output)",
                code="unsupported",
            )
    return out


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(400, f"{where}[{j}]: only text parts are supported, got {kind!r}", code="unsupported")
            parts.append(_string(part.get("text"), f"{where}[{j}].text", empty=True))
        return "\n".join(parts)
    raise ApiError(400, f"{where} must be text or a list of text parts", code="invalid_value")


def _string(value: object, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise ApiError(400, f"{where} must be a {'' if empty else 'non-empty '}string", code="invalid_value")
    return value


def _tools(value: object) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError(400, "tools must be a list", code="invalid_value")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise ApiError(400, f"tools[{i}]: only function tools are supported, got {kind!r}", code="unsupported")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: object) -> object:
    if isinstance(value, dict):
        if value.get("type") != "function" or not isinstance(value.get("name"), str):
            raise ApiError(
                400, "tool_choice must be auto, none, required or {'type': 'function', 'name'}", code="invalid_value"
            )
        return {"type": "function", "function": {"name": value["name"]}}
    return value


# ------------------------------------------------------------------------------------------ response
def output_items(answer_id: str, text: str, calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if text or not calls:
        items.append(_message_item(answer_id, text, "completed"))
    items += [_call_item(answer_id, i, c.id, c.name, c.arguments, "completed") for i, c in enumerate(calls)]
    return items


def _message_item(answer_id: str, text: str, status: str) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    )
    return {"type": "message", "id": f"msg_{answer_id}", "status": status, "role": "assistant", "content": content}


def _call_item(answer_id: str, i: int, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{answer_id}_{i}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _usage(u: Usage) -> dict[str, Any]:
    i, o = u.prompt_tokens or 0, u.completion_tokens or 0
    return {
        "input_tokens": i,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": i + o,
    }


def response_object(
    parsed: ResponsesCall,
    meta: Meta,
    *,
    rid: str,
    created: float,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    finish: str | None,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
    body: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete and status == "completed" else status,
        "model": parsed.call.model,
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
        **parsed.echo,
        "usage": _usage(usage) if usage is not None else None,
        "remem": meta.body(),
    }
    return body


def _stored_items(parsed: ResponsesCall, text: str, calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = [c.to_dict() for c in calls]
    return [*parsed.added, reply]


# ----------------------------------------------------------------------------------------- the route
async def responses(gw: Gateway, request: Request, caller: Caller) -> Response:
    _, stream, call = await gw.read_chat(request, caller, parse_call, stream_default=False)
    parsed: ResponsesCall = request.state.responses
    if parsed.previous is not None:
        history = await _conversation(gw, parsed.previous, call.scope)
        system = [{"role": "system", "content": parsed.instructions}] if parsed.instructions else []
        call.messages = [*system, *history, *parsed.added]
        if len(call.messages) > gw.config.limits.max_messages:
            raise ApiError(
                400,
                f"the conversation of previous_response_id has {len(call.messages)} messages "
                f"(at most {gw.config.limits.max_messages})",
                code="too_many_messages",
            )
    created = time.time()

    async def response(reply: ChatReply, meta: Meta) -> dict[str, Any]:
        rid = new_response_id(meta.answer_id)
        await _store(gw, parsed, rid, reply.text, reply.tool_calls, created)
        return response_object(
            parsed,
            meta,
            rid=rid,
            created=created,
            status="completed",
            output=output_items(meta.answer_id, reply.text, reply.tool_calls),
            usage=reply.usage,
            finish=reply.finish_reason,
        )

    return await gw.respond(
        request,
        call,
        stream,
        body=response,
        events=lambda chat, first, meta, end: _events(gw, parsed, chat, first, meta, created, end, request),
    )


async def _conversation(gw: Gateway, previous: str, scope: str) -> list[dict[str, Any]]:
    since = time.time() - gw.config.response_retention_s

    def read() -> list[dict[str, Any]] | None:
        with gw.memory.store.read() as tx:
            return stored.conversation(tx, previous, scope=scope, since=since)

    history = await asyncio.to_thread(read)
    if history is None:
        raise ApiError(404, f"previous response {previous!r} not found", code="not_found")
    return history


async def _store(
    gw: Gateway, parsed: ResponsesCall, rid: str, text: str, calls: tuple[ToolCall, ...], created: float
) -> None:
    retention = gw.config.response_retention_s
    if not parsed.store or retention <= 0:
        return
    items = _stored_items(parsed, text, calls)

    def write(tx: Any) -> None:
        stored.put(
            tx,
            response_id=rid,
            scope=parsed.call.scope,
            parent_id=parsed.previous,
            items=items,
            created_at=created,
        )
        stored.expire(tx, before=created - retention)

    await asyncio.to_thread(gw.memory.store.transact, write)


@dataclass
class _Calls:
    """Function calls of a streamed reply, assembled from their deltas (by the upstream's index)."""

    ids: dict[int, str] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    arguments: dict[int, str] = field(default_factory=dict)
    output_index: dict[int, int] = field(default_factory=dict)


class _ResponseEvents:
    """The server-sent events of one streamed response: numbered events, items added as they start, closed at
    the end (the message first seen first, then each function call, in output order)."""

    def __init__(self, answer: str) -> None:
        self.seq = 0
        self.answer = answer
        self.rid = new_response_id(answer)
        self.msg_id = f"msg_{answer}"
        self.text_parts: list[str] = []
        self.message_index: int | None = None
        self.calls = _Calls()
        self.next_index = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def piece(self, c: StreamChunk) -> bytes:
        """The events of one chunk: its text delta (opening the message item first) and tool-call deltas."""
        answer, msg_id, calls, event = self.answer, self.msg_id, self.calls, self.event
        out = b""
        if c.text:
            if self.message_index is None:
                self.message_index, self.next_index = self.next_index, self.next_index + 1
                out += event("response.output_item.added", output_index=self.message_index,
                             item=_message_item(answer, "", "in_progress"))  # fmt: skip
                out += event("response.content_part.added", item_id=msg_id, output_index=self.message_index,
                             content_index=0, part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
            self.text_parts.append(c.text)
            out += event("response.output_text.delta", item_id=msg_id, output_index=self.message_index,
                         content_index=0, delta=c.text, logprobs=[])  # fmt: skip
        for d in c.tool_calls:
            if d.index not in calls.output_index:
                calls.output_index[d.index], self.next_index = self.next_index, self.next_index + 1
                calls.ids[d.index], calls.names[d.index], calls.arguments[d.index] = d.id or "", d.name or "", ""
                item = _call_item(answer, d.index, calls.ids[d.index], calls.names[d.index], "", "in_progress")
                out += event("response.output_item.added", output_index=calls.output_index[d.index], item=item)
            else:
                calls.ids[d.index] = calls.ids[d.index] or d.id or ""
                calls.names[d.index] = calls.names[d.index] or d.name or ""
            if d.arguments:
                calls.arguments[d.index] += d.arguments
                out += event("response.function_call_arguments.delta", item_id=f"fc_{answer}_{d.index}",
                             output_index=calls.output_index[d.index], delta=d.arguments)  # fmt: skip
        return out

    def closing(self) -> tuple[bytes, list[dict[str, Any]]]:
        """The events that close every open item, and the response's output items in output order."""
        answer, msg_id, calls, event = self.answer, self.msg_id, self.calls, self.event
        out = b""
        items: list[tuple[int, dict[str, Any]]] = []
        text = "".join(self.text_parts)
        if self.message_index is not None:
            at = self.message_index
            done = _message_item(answer, text, "completed")
            out += event("response.output_text.done", item_id=msg_id, output_index=at, content_index=0,
                         text=text, logprobs=[])  # fmt: skip
            out += event("response.content_part.done", item_id=msg_id, output_index=at, content_index=0,
                         part=done["content"][0])  # fmt: skip
            out += event("response.output_item.done", output_index=at, item=done)
            items.append((at, done))
        for i, at in calls.output_index.items():
            item = _call_item(answer, i, calls.ids[i], calls.names[i], calls.arguments[i], "completed")
            out += event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                         name=item["name"], arguments=item["arguments"])  # fmt: skip
            out += event("response.output_item.done", output_index=at, item=item)
            items.append((at, item))
        if not items:  # an empty reply is one empty message, as the JSON response has
            items.append((0, _message_item(answer, "", "completed")))
        return out, [item for _, item in sorted(items, key=lambda x: x[0])]


async def _events(
    gw: Gateway,
    parsed: ResponsesCall,
    chat: ChatStream,
    first: StreamChunk | None,
    meta: Meta,
    created: float,
    end: StreamEnd,
    request: Request,
) -> AsyncIterator[bytes]:
    ev = _ResponseEvents(meta.answer_id)
    rid = ev.rid
    usage: Usage | None = None
    finish: str | None = None
    try:
        start = response_object(
            parsed, meta, rid=rid, created=created, status="in_progress", output=[], usage=None, finish=None
        )
        head = ev.event("response.created", response=start) + ev.event("response.in_progress", response=start)
        if first is not None:
            usage, finish = first.usage or usage, first.finish_reason or finish
            head += ev.piece(first)
        yield head
        call = parsed.call
        async for c in gw.service.chunks(chat, None, call):
            usage, finish = c.usage or usage, c.finish_reason or finish
            frame = ev.piece(c)
            if frame:
                yield frame
        reply = chat.reply
        tail, output = ev.closing()
        done_meta = gw.service.meta(call, meta.conversation_id, reply) if reply is not None else meta
        if reply is not None:
            await _store(gw, parsed, rid, reply.text, reply.tool_calls, created)
        final = response_object(
            parsed,
            done_meta,
            rid=rid,
            created=created,
            status="completed",
            output=output,
            usage=usage or Usage(),
            finish=finish,
        )
        yield tail + ev.event("response.completed", response=final)
    except (ModelError, TimeoutError) as exc:
        err = stream_error(exc)
        request.state.error = err.code
        yield ev.event("error", code=err.code, message=err.message, param=None)
    finally:
        await end()
