"""``GET /openapi.json``: the gateway's routes as an OpenAPI 3.1 document.

Built from the app's own route table (every path and method it serves, nothing it does not) and
:data:`OPERATIONS`, one entry per route: its protocol, a summary, the fields its body requires and the shape of
its errors. The wire protocols themselves are OpenAI's, Anthropic's and Ollama's; the document says which a
route speaks and links nothing else, so a client generator gets the paths, the required fields, the
``x-remem-*`` headers and the error bodies, not a copy of three vendors' full schemas.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from remem_agent.gateway.protocol import Protocol


@dataclass(frozen=True)
class Operation:
    protocol: Protocol
    summary: str
    required: tuple[str, ...] = ()  # top-level fields of the JSON body the route requires
    public: bool = False  # served without an API key


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/chat/completions"): Operation(
        "openai", "Chat completion with memory (JSON or SSE)", ("model", "messages")
    ),
    ("POST", "/v1/completions"): Operation(
        "openai", "Legacy text completion: the prompt as one chat turn", ("model", "prompt")
    ),
    ("POST", "/v1/responses"): Operation(
        "openai", "OpenAI Responses with memory (previous_response_id: stored responses)", ("model", "input")
    ),
    ("POST", "/v1/messages"): Operation(
        "anthropic", "Anthropic Messages with memory (JSON or SSE)", ("model", "max_tokens", "messages")
    ),
    ("POST", "/v1/embeddings"): Operation("openai", "The upstream's embeddings (float or base64)", ("model", "input")),
    ("GET", "/v1/models"): Operation("openai", "Models served"),
    ("POST", "/api/chat"): Operation("ollama", "Ollama chat with memory (NDJSON or JSON)", ("model", "messages")),
    ("POST", "/api/generate"): Operation("ollama", "Ollama generate: system and prompt as one chat turn", ("model",)),
    ("POST", "/api/embed"): Operation("ollama", "The upstream's embeddings", ("model", "input")),
    ("GET", "/api/tags"): Operation("ollama", "Models served, as Ollama lists them"),
    ("GET", "/api/version"): Operation("ollama", "The gateway's version", public=True),
    ("GET", "/api/ps"): Operation("ollama", "Models served, as Ollama lists loaded ones"),
    ("POST", "/api/show"): Operation("ollama", "What the gateway knows of a model it serves", ("model",)),
    ("POST", "/v1/memories"): Operation("openai", "Add a memory (a keyed state fact supersedes its key)", ("text",)),
    ("GET", "/v1/memories"): Operation("openai", "List memories (state, role, limit, offset)"),
    ("GET", "/v1/memories/{memory_id}"): Operation("openai", "One memory: state, credit, history"),
    ("DELETE", "/v1/memories/{memory_id}"): Operation("openai", "Erase one memory of the caller's scope for good"),
    ("POST", "/v1/memories/erase"): Operation(
        "openai", "Erase the caller's memories by ids or a filter (entity, attribute, speaker, session, contains)"
    ),
    ("DELETE", "/v1/scopes/{scope}"): Operation("openai", "Erase a whole scope and its traffic (a key granted '*')"),
    ("POST", "/v1/feedback"): Operation(
        "openai", "A verdict for an answer (its id or its reply's)", ("answer_id", "success")
    ),
    ("GET", "/v1/stats"): Operation("openai", "Store statistics"),
    ("GET", "/v1/verify"): Operation("openai", "Check the ledger's invariants"),
    ("GET", "/healthz"): Operation("openai", "Process is up", public=True),
    ("GET", "/livez"): Operation("openai", "Process is up", public=True),
    ("GET", "/readyz"): Operation("openai", "Ledger and upstream reachable (else 503 naming which)", public=True),
    ("GET", "/metrics"): Operation("openai", "Prometheus metrics"),
    ("GET", "/openapi.json"): Operation("openai", "This document", public=True),
}

_ERRORS: dict[Protocol, dict[str, Any]] = {
    "openai": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "anthropic": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "ollama": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}
_REMEM_HEADERS = {
    name: {"description": text, "schema": {"type": "string"}}
    for name, text in (
        ("x-remem-answer-id", "The answer's id, for POST /v1/feedback"),
        ("x-remem-served", "Memory ids served, comma-separated"),
        ("x-remem-abstained", "Present (true) when the abstain gate found no relevant memory and injected none"),
        ("x-remem-conversation", "The conversation id or label"),
        ("Server-Timing", "remem (the gateway's own time) and upstream, in ms"),
    )
}
CHAT_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/api/chat", "/api/generate"}
)


def document(routes: Iterable[tuple[str, str]], version: str) -> dict[str, Any]:
    """The OpenAPI document of ``routes`` (``(method, path)`` pairs); each must be in :data:`OPERATIONS`."""
    paths: dict[str, dict[str, Any]] = {}
    for method, route_path in routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route_path)  # Starlette's "{scope:path}" is OpenAPI's "{scope}"
        op = OPERATIONS[(method, path)]
        entry: dict[str, Any] = {
            "summary": op.summary,
            "tags": [op.protocol],
            "responses": {
                "200": {"description": "OK", **({"headers": _REMEM_HEADERS} if path in CHAT_PATHS else {})},
                "4XX": {
                    "description": f"Refused ({op.protocol} error shape)",
                    "content": {"application/json": {"schema": _ERRORS[op.protocol]}},
                },
            },
        }
        if op.public:
            entry["security"] = []
        if method == "POST":
            schema: dict[str, Any] = {"type": "object", "required": list(op.required)}
            entry["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        params = re.findall(r"\{(\w+)\}", path)
        if params:
            entry["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in params
            ]
        paths.setdefault(path, {})[method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "remem gateway", "version": version},
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            }
        },
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": paths,
    }
