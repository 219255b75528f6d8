"""The Starlette application: routes, authentication, the access log, ``/healthz``, ``/metrics``; :func:`serve`.

Every endpoint runs through :meth:`Gateway.endpoint <remem_agent.gateway.core.Gateway.endpoint>`. The access
log (logger ``remem_agent.gateway.access``, one JSON object per request) records method, route template,
status, duration, key id, scope, answer id, memories served and the error code: never a prompt, a reply,
a query string, an API key or the upstream's URL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from remem_agent.adapters.base import ChatModel
from remem_agent.agent.telemetry import Telemetry
from remem_agent.errors import RememError
from remem_agent.gateway import (
    anthropic_routes,
    memory_routes,
    ollama_routes,
    openai_routes,
    openapi,
    responses_routes,
)
from remem_agent.gateway.auth import Caller
from remem_agent.gateway.config import GatewayConfig, check_bind, load_api_keys
from remem_agent.gateway.core import Gateway
from remem_agent.gateway.protocol import ApiError, Protocol
from remem_agent.memory import ReMem

log = logging.getLogger("remem_agent.gateway")
access_log = logging.getLogger("remem_agent.gateway.access")


async def _healthz(gw: Gateway, request: Request, caller: Caller) -> Response:
    return JSONResponse({"status": "ok", "uptime_s": round(time.time() - gw.started, 3)})


async def _livez(gw: Gateway, request: Request, caller: Caller) -> Response:
    """The process serves requests (liveness: restart it when this fails)."""
    return JSONResponse({"status": "alive"})


async def _readyz(gw: Gateway, request: Request, caller: Caller) -> Response:
    """The ledger answers a read and the upstream its model list: 200, else 503 naming what is not ready."""
    checks: dict[str, str] = {}
    try:
        await asyncio.to_thread(gw.memory.store.max_seq)
        checks["ledger"] = "ok"
    except RememError as exc:
        checks["ledger"] = type(exc).__name__
    problem = await gw.router.reachable()
    checks["upstream"] = "ok" if problem is None else problem
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", **checks}, status_code=200 if ready else 503)


async def _openapi(gw: Gateway, request: Request, caller: Caller) -> Response:
    """``GET /openapi.json``: the routes this app serves, as an OpenAPI 3.1 document (:mod:`.openapi`)."""
    from remem_agent import __version__

    served = [
        (method, route.path)
        for route in request.app.routes
        if isinstance(route, Route)
        for method in sorted((route.methods or set()) - {"HEAD"})
    ]
    return JSONResponse(openapi.document(served, __version__))


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
            if route not in ("/healthz", "/livez", "/readyz", "/metrics") and access_log.isEnabledFor(logging.INFO):
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
        Route("/v1/completions", e("/v1/completions", "openai", openai_routes.text_completions), methods=["POST"]),
        Route("/v1/responses", e("/v1/responses", "openai", responses_routes.responses), methods=["POST"]),
        Route("/v1/messages", e("/v1/messages", "anthropic", anthropic_routes.messages), methods=["POST"]),
        Route("/v1/embeddings", e("/v1/embeddings", "openai", openai_routes.embeddings), methods=["POST"]),
        Route("/v1/models", e("/v1/models", "openai", openai_routes.list_models), methods=["GET"]),
        Route("/api/chat", e("/api/chat", "ollama", ollama_routes.chat), methods=["POST"]),
        Route("/api/generate", e("/api/generate", "ollama", ollama_routes.generate), methods=["POST"]),
        Route("/api/embed", e("/api/embed", "ollama", ollama_routes.embed), methods=["POST"]),
        Route("/api/tags", e("/api/tags", "ollama", ollama_routes.tags), methods=["GET"]),
        Route("/v1/memories", e("/v1/memories", "openai", memory_routes.add_memory), methods=["POST"]),
        Route("/v1/memories", e("/v1/memories", "openai", memory_routes.list_memories), methods=["GET"]),
        Route(
            "/v1/memories/{memory_id}", e("/v1/memories/{id}", "openai", memory_routes.inspect_memory), methods=["GET"]
        ),
        Route(
            "/v1/memories/{memory_id}",
            e("/v1/memories/{id}", "openai", memory_routes.erase_memory),
            methods=["DELETE"],
        ),
        Route("/v1/memories/erase", e("/v1/memories/erase", "openai", memory_routes.erase_memories), methods=["POST"]),
        Route(
            "/v1/scopes/{scope:path}", e("/v1/scopes/{scope}", "openai", memory_routes.erase_scope), methods=["DELETE"]
        ),
        Route("/v1/feedback", e("/v1/feedback", "openai", memory_routes.feedback), methods=["POST"]),
        Route("/v1/stats", e("/v1/stats", "openai", memory_routes.stats), methods=["GET"]),
        Route("/v1/verify", e("/v1/verify", "openai", memory_routes.verify), methods=["GET"]),
        Route("/healthz", e("/healthz", "openai", _healthz, public=True), methods=["GET"]),
        Route("/livez", e("/livez", "openai", _livez, public=True), methods=["GET"]),
        Route("/readyz", e("/readyz", "openai", _readyz, public=True), methods=["GET"]),
        Route("/api/version", e("/api/version", "ollama", ollama_routes.version, public=True), methods=["GET"]),
        Route("/api/ps", e("/api/ps", "ollama", ollama_routes.ps), methods=["GET"]),
        Route("/api/show", e("/api/show", "ollama", ollama_routes.show), methods=["POST"]),
        Route("/metrics", e("/metrics", "openai", _metrics), methods=["GET"]),
        Route("/openapi.json", e("/openapi.json", "openai", _openapi, public=True), methods=["GET"]),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gw.start_sweeps()
        yield
        await gw.aclose()

    async def http_error(request: Request, exc: Exception) -> Response:
        """Unknown paths (404) and wrong methods (405) in the protocol's error shape."""
        status = getattr(exc, "status_code", 500)
        protocol: Protocol = "ollama" if request.url.path.startswith("/api/") else "openai"
        if request.url.path.startswith("/v1/messages"):
            protocol = "anthropic"
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


BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_blas() -> None:
    """One BLAS thread per process unless the environment says otherwise.

    A server runs many requests at once; a multi-threaded matrix-vector product per search only adds threads
    that wait for each other (on a loaded 2-core machine it tripled search times). Workers inherit the
    variables; this process is limited through threadpoolctl when it is installed (numpy is already loaded).
    """
    if any(v in os.environ for v in BLAS_ENV):
        return
    for v in BLAS_ENV:
        os.environ[v] = "1"
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


def serve(config: GatewayConfig) -> None:
    """Run the gateway on uvicorn (blocking). Refuses a non-loopback bind without API keys."""
    import uvicorn

    from remem_agent.gateway.config import ENV_CONFIG

    check_bind(config, load_api_keys(config.api_keys))
    _configure_logging()
    _single_threaded_blas()
    log.info("remem gateway on http://%s:%d (store %s)", config.host, config.port, config.store)
    common: dict[str, Any] = {"host": config.host, "port": config.port, "access_log": False, "log_level": "info"}
    if config.workers > 1:
        log.info(
            "%d workers share the port and the store; waiting answers live in the ledger, so feedback and "
            "next-turn outcomes count whichever worker they reach",
            config.workers,
        )
        os.environ[ENV_CONFIG] = config.to_env()
        uvicorn.run("remem_agent.gateway.app:app_from_env", factory=True, workers=config.workers, **common)
    else:
        uvicorn.run(create_app(config), **common)
