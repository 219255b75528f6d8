"""The Starlette application: routes, authentication, the access log, ``/healthz``, ``/metrics``; :func:`serve`.

Every endpoint runs through :meth:`Gateway.endpoint`: bearer-key check (401), the handler, and one
``except`` that turns any exception into the protocol's error shape (:func:`~.protocol.error_of`). The access
log (logger ``remem_agent.gateway.access``, one JSON object per request) records method, route template,
status, duration, key id, scope, answer id, memories served and the error code: never a prompt, a reply,
a query string, an API key or the upstream's URL.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from remem_agent.adapters.base import ChatModel
from remem_agent.adapters.retry import RetryPolicy
from remem_agent.agent import MemoryAgent
from remem_agent.agent.telemetry import Telemetry
from remem_agent.agent.trace import TraceWriter
from remem_agent.gateway import memory_routes, ollama_routes, openai_routes
from remem_agent.gateway.auth import ApiKeys, Caller
from remem_agent.gateway.config import GatewayConfig, check_bind, load_api_keys
from remem_agent.gateway.limits import Gate, read_body
from remem_agent.gateway.metrics import Metrics, gateway_metrics
from remem_agent.gateway.protocol import ApiError, Protocol, error_of
from remem_agent.gateway.service import ChatService
from remem_agent.gateway.upstream import ModelRouter, build_router
from remem_agent.memory import ReMem

log = logging.getLogger("remem_agent.gateway")
access_log = logging.getLogger("remem_agent.gateway.access")

Handler = Callable[["Gateway", Request, Caller], Awaitable[Response]]


def _embedder(name: str) -> Any:
    name = name.strip().lower()
    if name in ("", "hash"):
        return None  # ReMem's default (ConceptHashEmbedder)
    if name in ("sentence-transformers", "st"):
        from remem_agent.embedders.sentence_transformers import PACKAGED_MODEL, SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(PACKAGED_MODEL)
    raise ApiError(500, f"unknown embedder {name!r}")


def _telemetry(config: GatewayConfig) -> Telemetry | None:
    if not config.otel:
        return None
    from remem_agent.agent.telemetry import OpenTelemetrySpans

    return OpenTelemetrySpans()


class Gateway:
    """One gateway process: the memory, the model router, one MemoryAgent, limits, metrics, keys."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        memory: ReMem | None = None,
        model: ChatModel | None = None,
        keys: dict[str, tuple[str, ...]] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.config = config
        self.keys = ApiKeys(load_api_keys(config.api_keys) if keys is None else keys)
        self.started = time.time()
        self._owns_memory = memory is None
        self.memory = memory if memory is not None else ReMem(config.store, embedder=_embedder(config.embedder))
        self.router: ModelRouter = build_router(config, local=model)
        upstream_key = os.environ.get(config.upstream_api_key_env) if config.upstream else None
        self.secrets = tuple(s for s in (upstream_key, *self.keys.secrets()) if s)
        self.agent = MemoryAgent(
            self.memory,
            self.router,
            k=config.k,
            token_budget=config.token_budget,
            retry=RetryPolicy(
                max_attempts=config.retry_attempts,
                initial_backoff=0.25,
                max_backoff=2.0,
                max_retry_after=config.retry_max_wait_s,
            ),
            trace=self._trace(),
            run_id=f"gateway-{os.getpid()}",
            max_concurrency=config.limits.max_concurrency,
            max_tokens=512 if config.upstream is None else None,
            seed=None,
            strip_citations=config.strip_citations,
            telemetry=telemetry if telemetry is not None else _telemetry(config),
        )
        self.metrics: Metrics = gateway_metrics()
        self.gate = Gate(config.limits)
        self.metrics.gauge("remem_gateway_in_flight", "Requests holding a concurrency slot.", lambda: self.gate.active)
        self.metrics.gauge("remem_gateway_queued", "Requests waiting for a slot.", lambda: self.gate.waiting)
        self.service = ChatService(self.agent, self.router, self.metrics, config.limits)

    def _trace(self) -> TraceWriter | Literal[False]:
        cfg = self.config.trace
        if cfg == "off":
            return False
        if cfg is None:
            folder = self.memory.path
            if not isinstance(folder, Path):
                log.warning("no trace: the store is not a folder; pass --trace FILE to keep one")
                return False
            path = folder / "traces" / f"gateway-{os.getpid()}.jsonl"
        else:
            path = Path(cfg)
        return TraceWriter(path, secrets=self.secrets)

    @property
    def trace_path(self) -> Path | None:
        return self.agent.tracer.path if self.agent.tracer is not None else None

    # -- request plumbing -----------------------------------------------------------------------------------
    async def read_body(self, request: Request) -> bytes:
        return await read_body(request, self.config.limits.max_body_bytes)

    def authorize(self, caller: Caller, scope: str) -> None:
        if not caller.may(scope):
            raise ApiError(
                403, f"this key is not granted the scope {scope!r}", type="permission_error", code="scope_forbidden"
            )

    def endpoint(self, route: str, protocol: Protocol, handler: Handler, *, public: bool = False) -> Any:
        async def run(request: Request) -> Response:
            request.state.route = route
            caller = self.keys.authenticate(request.headers.get("authorization"))
            if caller is None and not public:
                request.state.error = "unauthorized"
                self.metrics.inc("remem_gateway_rejected_total", reason="unauthorized")
                err = ApiError(
                    401,
                    "missing or unknown API key (Authorization: Bearer KEY)",
                    type="authentication_error",
                    code="invalid_api_key",
                )
                return err.response(protocol, {"WWW-Authenticate": "Bearer"})
            request.state.key = caller.key_id if caller else None
            try:
                return await handler(self, request, caller or Caller(None, ()))
            except Exception as exc:  # noqa: BLE001 - every failure becomes the protocol's error shape
                err = error_of(exc)
                request.state.error = err.code
                if err.status == 429:
                    self.metrics.inc("remem_gateway_rejected_total", reason=err.code or "429")
                if err.status >= 500 and not isinstance(exc, ApiError):
                    log.warning("%s %s failed: %s", request.method, route, type(exc).__name__)
                return err.response(protocol)

        return run

    async def aclose(self) -> None:
        await self.router.aclose()
        if self._owns_memory:
            self.memory.close()


async def _healthz(gw: Gateway, request: Request, caller: Caller) -> Response:
    return JSONResponse({"status": "ok", "uptime_s": round(time.time() - gw.started, 3)})


async def _metrics(gw: Gateway, request: Request, caller: Caller) -> Response:
    return PlainTextResponse(gw.metrics.render(), media_type="text/plain; version=0.0.4")


class AccessLog:
    """ASGI middleware: one structured log line and the request counter per request, at its real end."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app, self.gw = app, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        state: dict[str, Any] = scope.setdefault("state", {})

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = state.get("route", "other")
            ms = round((time.perf_counter() - t0) * 1000, 3)
            self.gw.metrics.inc("remem_gateway_requests_total", route=route, method=scope["method"], status=str(status))
            if route not in ("/healthz", "/metrics"):
                record = {
                    "event": "request",
                    "method": scope["method"],
                    "route": route,
                    "status": status,
                    "ms": ms,
                    "key": state.get("key"),
                    "scope": state.get("scope"),
                    "answer_id": state.get("answer_id"),
                    "served": state.get("served"),
                    "error": state.get("error"),
                }
                access_log.info(json.dumps(record))


def create_app(
    config: GatewayConfig,
    *,
    memory: ReMem | None = None,
    model: ChatModel | None = None,
    keys: dict[str, tuple[str, ...]] | None = None,
    telemetry: Telemetry | None = None,
) -> Starlette:
    """The ASGI app (tests pass a ``memory``, a local ``model``, ``keys`` or ``telemetry`` directly)."""
    gw = Gateway(config, memory=memory, model=model, keys=keys, telemetry=telemetry)
    e = gw.endpoint
    routes = [
        Route(
            "/v1/chat/completions",
            e("/v1/chat/completions", "openai", openai_routes.chat_completions),
            methods=["POST"],
        ),
        Route("/v1/models", e("/v1/models", "openai", openai_routes.list_models), methods=["GET"]),
        Route("/api/chat", e("/api/chat", "ollama", ollama_routes.chat), methods=["POST"]),
        Route("/api/tags", e("/api/tags", "ollama", ollama_routes.tags), methods=["GET"]),
        Route("/v1/memories", e("/v1/memories", "openai", memory_routes.add_memory), methods=["POST"]),
        Route("/v1/memories", e("/v1/memories", "openai", memory_routes.list_memories), methods=["GET"]),
        Route(
            "/v1/memories/{memory_id}", e("/v1/memories/{id}", "openai", memory_routes.inspect_memory), methods=["GET"]
        ),
        Route("/v1/feedback", e("/v1/feedback", "openai", memory_routes.feedback), methods=["POST"]),
        Route("/v1/stats", e("/v1/stats", "openai", memory_routes.stats), methods=["GET"]),
        Route("/v1/verify", e("/v1/verify", "openai", memory_routes.verify), methods=["GET"]),
        Route("/healthz", e("/healthz", "openai", _healthz, public=True), methods=["GET"]),
        Route("/metrics", e("/metrics", "openai", _metrics), methods=["GET"]),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await gw.aclose()

    async def http_error(request: Request, exc: Exception) -> Response:
        """Unknown paths (404) and wrong methods (405) in the protocol's error shape."""
        status = getattr(exc, "status_code", 500)
        protocol: Protocol = "ollama" if request.url.path.startswith("/api/") else "openai"
        message = "no such endpoint" if status == 404 else f"{request.method} is not allowed here"
        return ApiError(status, message, code="not_found" if status == 404 else "method_not_allowed").response(
            protocol, getattr(exc, "headers", None)
        )

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.gateway = gw
    app.add_middleware(AccessLog, gateway=gw)
    return app


def app_from_env() -> Starlette:
    """The factory each uvicorn worker calls (``remem serve --workers N``): the config comes from the env."""
    _configure_logging()
    return create_app(GatewayConfig.from_env())


def _configure_logging() -> None:
    logger = logging.getLogger("remem_agent.gateway")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def serve(config: GatewayConfig) -> None:
    """Run the gateway on uvicorn (blocking). Refuses a non-loopback bind without API keys."""
    import uvicorn

    from remem_agent.gateway.config import ENV_CONFIG

    check_bind(config, load_api_keys(config.api_keys))
    _configure_logging()
    log.info("remem gateway on http://%s:%d (store %s)", config.host, config.port, config.store)
    common: dict[str, Any] = {"host": config.host, "port": config.port, "access_log": False, "log_level": "info"}
    if config.workers > 1:
        os.environ[ENV_CONFIG] = config.to_env()
        uvicorn.run("remem_agent.gateway.app:app_from_env", factory=True, workers=config.workers, **common)
    else:
        uvicorn.run(create_app(config), **common)
