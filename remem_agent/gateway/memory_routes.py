"""Memory endpoints (JSON, OpenAI error shape): add, list, inspect, erase, feedback, stats, verify.

``POST /v1/memories`` goes through ``MemoryAgent.remember``, so a fact that corrects a memory served to a
waiting answer fails that answer (an inferred outcome), exactly as in the library. Every endpoint computes
the request's scope with :func:`~remem_agent.gateway.auth.request_scope` and refuses (403) a scope the key
was not granted; ``/v1/verify`` checks the whole store and ``DELETE /v1/scopes/{scope}`` erases a whole scope:
both need a key granted ``*``. An erasure also scrubs the gateway's trace folder (``remem_agent.erasure``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from remem_agent.gateway.auth import Caller, request_scope
from remem_agent.gateway.openai_routes import answer_id_of
from remem_agent.gateway.protocol import ApiError, json_object
from remem_agent.gateway.service import receipt_body

if TYPE_CHECKING:
    from remem_agent.gateway.core import Gateway

ADD_FIELDS = frozenset({"text", "entity", "attribute", "role", "timestamp", "task", "user"})
ERASE_FILTERS = ("entity", "attribute", "speaker", "session", "role", "contains")
ERASE_FIELDS = frozenset({"ids", "reason", "user", *ERASE_FILTERS})
MAX_LIST = 1000


def _scope(gw: Gateway, request: Request, caller: Caller, body_user: object = None) -> str:
    scope = request_scope(request.headers, body_user, caller)
    gw.authorize(caller, scope)
    request.state.scope = scope
    return scope


def _strings(body: dict[str, Any], keys: tuple[str, ...]) -> None:
    """400 unless each of ``keys`` of ``body`` is absent, null or a string."""
    for key in keys:
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ApiError(400, f"'{key}' must be a string", code="invalid_value")


async def add_memory(gw: Gateway, request: Request, caller: Caller) -> Response:
    body = json_object(await gw.read_body(request))
    unknown = sorted(set(body) - ADD_FIELDS)
    if unknown:
        raise ApiError(400, f"unknown fields {unknown}; expected {sorted(ADD_FIELDS)}", code="invalid_value")
    scope = _scope(gw, request, caller, body.get("user"))
    _strings(body, ("text", "entity", "attribute", "role", "task"))
    if not isinstance(body.get("text"), str):
        raise ApiError(400, "'text' (the fact, one sentence) is required", code="invalid_value")
    ts = body.get("timestamp")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int | float | str)):
        raise ApiError(400, "'timestamp' must be epoch seconds or an ISO-8601 string", code="invalid_value")
    memory_id = await gw.agent.remember(
        body["text"],
        entity=body.get("entity"),
        attribute=body.get("attribute"),
        role=body.get("role") or "state",
        task=body.get("task"),
        timestamp=ts,
        scope=scope,
    )
    return JSONResponse({"id": memory_id, "scope": scope}, status_code=201)


def _int_param(request: Request, name: str, default: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) > hi:  # "١٠" and "²" are digits to str.isdigit
        raise ApiError(400, f"'{name}' must be an integer in [0, {hi}]", code="invalid_value")
    return int(raw)


async def list_memories(gw: Gateway, request: Request, caller: Caller) -> Response:
    scope = _scope(gw, request, caller)
    limit = _int_param(request, "limit", 100, MAX_LIST)
    offset = _int_param(request, "offset", 0, 2**31 - 1)
    state = request.query_params.get("state")
    role = request.query_params.get("role")
    rows = await asyncio.to_thread(
        gw.memory.list,
        state,
        role=role,  # type: ignore[arg-type]  # the library checks the value (400 when unknown)
        limit=limit,
        offset=offset,
        scope=scope,
    )
    return JSONResponse({"object": "list", "data": [m.to_dict("iso") for m in rows], "limit": limit, "offset": offset})


async def inspect_memory(gw: Gateway, request: Request, caller: Caller) -> Response:
    scope = _scope(gw, request, caller)
    info = await asyncio.to_thread(gw.memory.inspect, request.path_params["memory_id"], scope=scope)
    return JSONResponse(
        {
            "memory": info.memory.to_dict("iso"),
            "stats": {task: s.to_dict("iso") for task, s in info.stats.items()},
            "history": [e.to_dict("iso") for e in info.history],
            "credits": [c.to_dict("iso") for c in info.credits],
            "supersedes": list(info.supersedes),
        }
    )


async def _erase(gw: Gateway, **kw: Any) -> Response:
    """Run an erasure on a worker thread, scrubbing the gateway's trace folder (every worker's files)."""
    traces = [gw.trace_path.parent] if gw.trace_path is not None and gw.trace_path.parent.is_dir() else []
    report = await asyncio.to_thread(lambda: gw.memory.erase(traces=traces, **kw))
    return JSONResponse({"object": "erasure", **report.to_dict()})


def _reason(value: object) -> str:
    if value is None:
        return "erased on request"
    if not isinstance(value, str):
        raise ApiError(400, "'reason' must be a string", code="invalid_value")
    return value


async def erase_memory(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``DELETE /v1/memories/{id}``: erase one memory of the caller's scope (``?reason=`` is logged)."""
    scope = _scope(gw, request, caller)
    reason = _reason(request.query_params.get("reason"))
    return await _erase(gw, ids=[request.path_params["memory_id"]], scope=scope, reason=reason)


async def erase_memories(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``POST /v1/memories/erase``: erase memories of the caller's scope by ``ids`` or by a filter."""
    body = json_object(await gw.read_body(request))
    unknown = sorted(set(body) - ERASE_FIELDS)
    if unknown:
        raise ApiError(400, f"unknown fields {unknown}; expected {sorted(ERASE_FIELDS)}", code="invalid_value")
    scope = _scope(gw, request, caller, body.get("user"))
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise ApiError(400, "'ids' must be a list of memory ids", code="invalid_value")
    _strings(body, ERASE_FILTERS)
    filters = {k: body.get(k) for k in ERASE_FILTERS}
    return await _erase(gw, ids=ids, scope=scope, reason=_reason(body.get("reason")), **filters)


async def erase_scope(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``DELETE /v1/scopes/{scope}``: erase a whole scope, its memories and its traffic; a key granted '*'."""
    _require_all_scopes(gw, caller, "erasing a whole scope needs a key granted '*'")
    scope = request.path_params["scope"]
    request.state.scope = scope
    reason = _reason(request.query_params.get("reason"))
    return await _erase(gw, scope=scope, whole_scope=True, reason=reason)


async def feedback(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``POST /v1/feedback``: a verdict for one answer, named by ``answer_id`` (the answer id, or a reply's own
    id: a chat completion's, a response's, a message's) or, for a client that keeps neither (Ollama's drop the
    ``remem`` field and the headers), by ``conversation``: the newest answer still waiting in that
    ``x-remem-conversation`` of the caller's scope."""
    body = json_object(await gw.read_body(request))
    given = body.get("answer_id")
    conversation = body.get("conversation")
    if conversation is not None:
        if given is not None:
            raise ApiError(400, "name the answer by 'answer_id' or by 'conversation', not both", code="invalid_value")
        given = await gw.service.latest_answer(caller, request_scope(request.headers, None, caller), conversation)
    answer_id = answer_id_of(given) if isinstance(given, str) else given  # a chat completion's id names it too
    receipt = await gw.service.feedback(
        caller, answer_id, body.get("success"), body.get("reason"), body.get("used_ids")
    )
    request.state.answer_id = answer_id
    return JSONResponse(dict(receipt_body(receipt)))


async def stats(gw: Gateway, request: Request, caller: Caller) -> Response:
    scope = _scope(gw, request, caller)
    result = await asyncio.to_thread(gw.memory.stats, scope=scope)
    return JSONResponse(dataclasses.asdict(result))


def _require_all_scopes(gw: Gateway, caller: Caller, message: str) -> None:
    """Refuse (403) a caller whose key is not granted '*' (when keys are configured)."""
    if gw.keys.enabled and "*" not in caller.patterns:
        raise ApiError(403, message, type="permission_error", code="scope_forbidden")


async def verify(gw: Gateway, request: Request, caller: Caller) -> Response:
    _require_all_scopes(gw, caller, "verify checks the whole store: it needs a key granted '*'")
    report = await asyncio.to_thread(gw.memory.verify)
    out: dict[str, Any] = {"ok": report.ok, "problems": list(report.problems), "counts": dict(report.counts)}
    return JSONResponse(out)
