"""One gateway process (:class:`Gateway`): the memory, the model router, one MemoryAgent, limits, metrics, keys.

Every endpoint runs through :meth:`Gateway.endpoint`: bearer-key check (401), the handler, and one ``except``
that turns any exception into the protocol's error shape (:func:`~.protocol.error_of`). Kept apart from
:mod:`.app` so the route modules can depend on it without an import cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from remem_agent.adapters.base import ChatModel, StreamChunk
from remem_agent.adapters.retry import RetryPolicy
from remem_agent.agent import MemoryAgent
from remem_agent.agent.chat_types import ChatReply
from remem_agent.agent.stream import ChatStream
from remem_agent.agent.telemetry import Telemetry
from remem_agent.agent.trace import TraceWriter
from remem_agent.config import RememConfig
from remem_agent.embedders.base import Embedder
from remem_agent.embedders.registry import canonical_name, default_embedder_name, make_embedder
from remem_agent.errors import StoreError, UserInputError
from remem_agent.gateway.auth import ApiKeys, Caller
from remem_agent.gateway.config import GatewayConfig, GatewayConfigError, load_api_keys
from remem_agent.gateway.limits import Gate, read_body
from remem_agent.gateway.metrics import Metrics, gateway_metrics
from remem_agent.gateway.protocol import ApiError, Protocol, error_of, json_object
from remem_agent.gateway.service import ChatCall, ChatService, ClosingStreamingResponse, Meta, StreamEnd
from remem_agent.gateway.upstream import ModelRouter, build_router
from remem_agent.memory import ReMem
from remem_agent.outcomes.ledger import LedgerPendingOutcomes
from remem_agent.store.pruning import GrowthLimits, PruneReport

SSE_HEADERS: Mapping[str, str] = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # a proxy must not buffer
log = logging.getLogger("remem_agent.gateway")

Handler = Callable[["Gateway", Request, Caller], Awaitable[Response]]


def _embedder(name: str) -> Embedder:
    """The embedder ``name`` from the registry (:mod:`remem_agent.embedders.registry`: its names and aliases,
    built as it builds them); an unknown name is a GatewayConfigError listing the registry's names."""
    try:
        kind = canonical_name(name)
    except UserInputError as exc:
        raise GatewayConfigError(f"gateway setting embedder: {exc}") from exc
    return make_embedder(kind)


def _open_memory(config: GatewayConfig) -> ReMem:
    """The gateway's store: with its own embedder when it exists, else with the configured (or default) one."""
    memory_config = RememConfig(abstain="null") if config.abstain else None
    if config.embedder is not None:
        return ReMem(config.store, embedder=_embedder(config.embedder), config=memory_config)
    return ReMem(config.store, new_store_embedder=default_embedder_name(), config=memory_config)


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
        self.memory = memory if memory is not None else _open_memory(config)
        self.router: ModelRouter = build_router(config, local=model)
        upstream_key = os.environ.get(config.upstream_api_key_env) if config.upstream else None
        self.secrets = tuple(s for s in (upstream_key, *self.keys.secrets()) if s)
        # Waiting answers live in the ledger: the next turn of a conversation, or its feedback, may reach
        # another worker or another gateway on the same store, which must be able to settle it (once).
        self.pending = LedgerPendingOutcomes(
            self.memory.store, claimant=f"gateway-{os.getpid()}", ttl_s=config.answer_ttl_s
        )
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
            # exactly the client's sampling fields reach the model: none of the library's defaults are added
            temperature=None,
            max_tokens=512 if config.upstream is None else None,
            seed=None,
            strip_citations=config.strip_citations,
            capture_corrections=config.capture_corrections,
            telemetry=telemetry if telemetry is not None else _telemetry(config),
            pending=self.pending,
        )
        self.metrics: Metrics = gateway_metrics()
        self.gate = Gate(config.limits)
        self.metrics.gauge("remem_gateway_in_flight", "Requests holding a concurrency slot.", lambda: self.gate.active)
        self.metrics.gauge("remem_gateway_queued", "Requests waiting for a slot.", lambda: self.gate.waiting)
        self.service = ChatService(self.agent, self.router, self.metrics, config.limits, self.pending)
        self._sweeper: asyncio.Task[None] | None = None

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
        return TraceWriter(path, secrets=self.secrets, rotation=self.config.trace_rotation())

    @property
    def trace_path(self) -> Path | None:
        return self.agent.tracer.path if self.agent.tracer is not None else None

    # -- request plumbing -----------------------------------------------------------------------------------
    async def read_body(self, request: Request) -> bytes:
        return await read_body(request, self.config.limits.max_body_bytes)

    async def read_chat(
        self,
        request: Request,
        caller: Caller,
        parse: Callable[[Gateway, dict[str, Any], Request, Caller], ChatCall],
        *,
        stream_default: bool,
    ) -> tuple[dict[str, Any], bool, ChatCall]:
        """The part of a chat route both protocols share: the body, its stream flag, the call (scope
        authorized by ``parse``) with a known model, and the scope noted for the access log."""
        body = json_object(await self.read_body(request))
        stream = body.get("stream", stream_default)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be true or false", code="invalid_value")
        call = parse(self, body, request, caller)
        call.model = await self.service.check_model(body.get("model"))
        request.state.scope = call.scope
        request.state.timing = call.timing  # for the Server-Timing header (``endpoint``)
        return body, stream, call

    async def respond(
        self,
        request: Request,
        call: ChatCall,
        stream: bool,
        *,
        body: Callable[[ChatReply, Meta], Awaitable[Mapping[str, Any]]],
        events: Callable[[ChatStream, StreamChunk | None, Meta, StreamEnd], AsyncIterator[bytes]],
        media_type: str = "text/event-stream",
        stream_headers: Mapping[str, str] = SSE_HEADERS,
    ) -> Response:
        """What every chat route answers, whatever its protocol: ``body(reply, meta)`` as JSON, or the stream of
        ``events(chat, first chunk, meta, end)``. The gateway's slot is held until the JSON is built or, for a
        stream, until its last byte (``StreamEnd`` releases it); the answer is noted for the access log."""
        release = await self.gate.acquire()
        handed = False
        try:
            if not stream:
                reply, meta = await self.service.complete(call)
                request.state.answer_id, request.state.served = meta.answer_id, len(meta.served)
                return JSONResponse(dict(await body(reply, meta)), headers=meta.headers())
            chat, first, meta = await self.service.open_stream(call)
            handed = True
        finally:
            if not handed:
                release()
        request.state.answer_id, request.state.served = meta.answer_id, len(meta.served)
        end = StreamEnd(self.service, chat, call, release)
        headers = {**meta.headers(), **stream_headers}
        return ClosingStreamingResponse(events(chat, first, meta, end), end, media_type=media_type, headers=headers)

    def authorize(self, caller: Caller, scope: str) -> None:
        if not caller.may(scope):
            raise ApiError(
                403, f"this key is not granted the scope {scope!r}", type="permission_error", code="scope_forbidden"
            )

    def endpoint(self, route: str, protocol: Protocol, handler: Handler, *, public: bool = False) -> Any:
        async def run(request: Request) -> Response:
            request.state.route = route
            caller = self.keys.authenticate(_credentials(request))
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
                response = await handler(self, request, caller or Caller(None, ()))
                timing = getattr(request.state, "timing", None)
                if timing is not None:
                    response.headers["Server-Timing"] = timing.server_timing()
                return response
            except Exception as exc:  # noqa: BLE001 - every failure becomes the protocol's error shape
                err = error_of(exc)
                request.state.error = err.code
                if err.status == 429:
                    self.metrics.inc("remem_gateway_rejected_total", reason=err.code or "429")
                if err.status >= 500 and not isinstance(exc, ApiError):
                    log.warning("%s %s failed: %s", request.method, route, type(exc).__name__)
                return err.response(protocol)

        return run

    def start_sweeps(self) -> None:
        """Sweep the store now and then (expire answers, prune old unjudged traffic; store/pruning.py)."""
        limits = self.config.growth_limits()
        if self._sweeper is None and (limits.answer_ttl_s is not None or limits.retention_s is not None):
            self._sweeper = asyncio.create_task(self._sweep_forever(limits), name="remem-sweep")

    async def _sweep_forever(self, limits: GrowthLimits) -> None:
        interval = self.config.sweep_interval_s
        await asyncio.sleep(min(60.0, interval) * random.random())  # workers started together sweep apart
        while True:
            await self.sweep(limits)
            await asyncio.sleep(interval * (0.9 + 0.2 * random.random()))

    async def sweep(self, limits: GrowthLimits | None = None) -> PruneReport | None:
        """One sweep in a worker thread; a store error is logged and counted (the next sweep tries again)."""
        try:
            report = await asyncio.to_thread(
                self.memory.store.prune, limits or self.config.growth_limits(), now=time.time()
            )
        except StoreError as exc:
            log.warning("sweep failed, retried at the next one: %s", exc)
            self.metrics.inc("remem_gateway_sweeps_total", outcome="failed")
            return None
        self.metrics.inc("remem_gateway_sweeps_total", outcome="ok")
        if report.expired_answers or report.pruned_searches or report.pruned_answers or report.pruned_responses:
            log.info("sweep: %s", report)
        return report

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.router.aclose()
        if self._owns_memory:
            self.memory.close()


def _credentials(request: Request) -> str | None:
    """The API key as ``Authorization: Bearer KEY``, or as Anthropic clients send it (``x-api-key: KEY``)."""
    given = request.headers.get("authorization")
    if given is None and (key := request.headers.get("x-api-key")) is not None:
        return f"Bearer {key}"
    return given
