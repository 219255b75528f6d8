"""What the wire protocols share: errors in each protocol's own shape, JSON bodies, schema checks.

* OpenAI: ``{"error": {"message", "type", "code"}}`` (also for the memory endpoints under ``/v1``);
* Anthropic: ``{"type": "error", "error": {"type", "message"}}``, the type named by the status as Anthropic's
  API names it (``invalid_request_error``, ``authentication_error``, ``not_found_error``, ...);
* Ollama: ``{"error": "message"}``.

:func:`error_of` maps every exception the gateway can meet to one :class:`ApiError` (status, type, code,
headers), so each route has a single ``except`` and every refusal is decided in one table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from starlette.responses import JSONResponse

from remem_agent.errors import (
    AnswerExpiredError,
    FeedbackConflictError,
    ModelError,
    RememError,
    StoreBusyError,
    StoreError,
    UnknownMemoryError,
    UnknownSearchError,
    UserInputError,
)
from remem_agent.gateway.limits import BodyTooLarge, Overloaded

Protocol = Literal["openai", "anthropic", "ollama"]
# Anthropic's error type for an HTTP status (its API documents one per status); 5xx not listed: api_error
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self, protocol: Protocol) -> dict[str, Any]:
        if protocol == "ollama":
            return {"error": self.message}
        if protocol == "anthropic":
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}

    def response(self, protocol: Protocol, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(protocol), status_code=self.status, headers={**self.headers, **(headers or {})})


def error_of(exc: BaseException) -> ApiError:
    """The one table from an exception to the HTTP answer."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BodyTooLarge):
        return ApiError(413, f"request body too large (at most {exc.limit} bytes)", code="body_too_large")
    if isinstance(exc, Overloaded):
        return ApiError(
            429, str(exc), type="rate_limit_error", code="overloaded", headers={"Retry-After": str(exc.retry_after)}
        )
    if isinstance(exc, ModelError):
        return upstream_error(exc)
    if isinstance(exc, AnswerExpiredError):
        return ApiError(410, _first_line(exc), code="answer_expired")
    if isinstance(exc, UnknownMemoryError | UnknownSearchError):
        return ApiError(404, _first_line(exc), code="not_found")
    if isinstance(exc, FeedbackConflictError):
        return ApiError(409, _first_line(exc), code="conflict")
    if isinstance(exc, UserInputError):
        return ApiError(400, _first_line(exc), code="invalid_value")
    if isinstance(exc, StoreBusyError):
        return ApiError(
            503, "the memory store is busy; retry", type="server_error", code="store_busy", headers={"Retry-After": "1"}
        )
    if isinstance(exc, StoreError | RememError):
        return ApiError(500, f"memory store error: {type(exc).__name__}", type="server_error", code="store_error")
    return ApiError(500, "internal error", type="server_error", code="internal_error")


def stream_error(exc: ModelError | TimeoutError) -> ApiError:
    """A failure after a stream's first byte, sent as the stream's last event: the upstream's error, or the
    gateway's own stream deadline (``Limits.max_stream_seconds``)."""
    if isinstance(exc, ModelError):
        return error_of(exc)
    return ApiError(
        504, "the stream exceeded the gateway's max stream duration", type="upstream_error", code="stream_timeout"
    )


def upstream_error(exc: ModelError) -> ApiError:
    """Upstream failures after the retries: 429 stays 429, other 4xx keep their status, the rest is 502/504."""
    status = exc.status
    if status == 429:
        wait = max(1, round(exc.retry_after)) if exc.retry_after is not None else 1
        return ApiError(
            429,
            "the upstream model is rate limited; retry later",
            type="rate_limit_error",
            code="upstream_rate_limited",
            headers={"Retry-After": str(wait)},
        )
    if status is not None and 400 <= status < 500:
        detail = (exc.body or "")[:300]
        code = "model_not_found" if status == 404 else "upstream_rejected"
        return ApiError(status, f"the upstream model refused the request (HTTP {status}): {detail}", code=code)
    if status is None and "timed out" in str(exc):
        return ApiError(504, "the upstream model timed out", type="upstream_error", code="upstream_timeout")
    what = (
        f"HTTP {status}"
        if status is not None and status != 200
        else ("a malformed reply" if status == 200 else "connection failed")
    )
    return ApiError(502, f"the upstream model failed ({what})", type="upstream_error", code="upstream_error")


MAX_EMBED_INPUTS = 2048


def embed_inputs(value: object, where: str) -> list[str]:
    """An embedding request's input: one string or a list of strings (non-empty, at most
    :data:`MAX_EMBED_INPUTS`), or a 400."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, f"{where} must be a string or a non-empty list of strings", code="invalid_value")
    if len(texts) > MAX_EMBED_INPUTS:
        raise ApiError(400, f"{where}: at most {MAX_EMBED_INPUTS} inputs per request", code="invalid_value")
    return texts


def no_embeddings() -> ApiError:
    return ApiError(
        501,
        "this gateway serves an in-process chat model, which makes no embeddings: serve an upstream to embed",
        type="invalid_request_error",
        code="not_implemented",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    return text.splitlines()[0][:1000] if text else type(exc).__name__


MAX_JSON_DEPTH = 64
"""The deepest nesting of objects and arrays a request body may have. Real requests (messages, tools, JSON
schemas) stay far below it; a body nested hundreds of levels deep would otherwise exhaust Python's recursion
in the parser, the schema validator or the trace writer, mid-request."""


def json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400: malformed JSON, not an object, nested deeper than
    :data:`MAX_JSON_DEPTH`, or holding a string that is not valid Unicode (a lone surrogate such as ``\\ud800``,
    which JSON's escapes can spell but UTF-8 cannot store). Checked before anything is written or sent."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    except RecursionError:
        raise ApiError(
            400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep"
        ) from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}", code="invalid_json")
    check_json_tree(data)
    return data


def check_json_tree(data: object) -> None:
    """Refuse (400) a parsed body nested deeper than :data:`MAX_JSON_DEPTH` or holding a lone surrogate in any
    key or string; one iterative pass, no recursion."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_text(node)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep")
        if isinstance(node, dict):
            for key in node:
                _check_text(key)
        stack.extend((value, depth + 1) for value in (node.values() if isinstance(node, dict) else node))


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, "the request body holds a string that is not valid Unicode (a lone surrogate)", code="invalid_unicode"
        ) from None


def check_schema(schema: object, where: str) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise ApiError(400, f"{where} must be a JSON schema object", code="invalid_schema")
    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as exc:
        raise ApiError(400, f"{where} is not a valid JSON schema: {exc.message}", code="invalid_schema") from None
    return dict(schema)


def schema_valid(text: str, schema: Mapping[str, Any] | None) -> bool | None:
    """Whether a reply is JSON valid against the requested schema (None when none was requested)."""
    if schema is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return Draft202012Validator(dict(schema)).is_valid(value)


def number(value: object, where: str, *, lo: float, hi: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ApiError(400, f"{where} must be a number in [{lo}, {hi}]", code="invalid_value")
    return float(value)


def count(value: object, where: str, *, hi: int = 2**31 - 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise ApiError(400, f"{where} must be an integer in [1, {hi}]", code="invalid_value")
    return value
