"""The model behind the gateway: one :class:`ModelRouter`, one adapter per model name.

The gateway runs ONE :class:`~remem_agent.agent.MemoryAgent` (one memory, one set of waiting outcomes and
conversations) whatever model a request names. Each request passes its model to ``MemoryAgent.chat``
explicitly (``model=router.for_call(name, timing)``): the adapter of the model the client asked for
(validated by the route against :meth:`ModelRouter.known`), wrapped in a :class:`TimedModel` that fills the
request's :class:`Timing` (upstream time, first chunk, errors) for the metrics. A JSON schema from
``response_format``/``format`` goes as ``json_schema=`` so each adapter uses its native structured output
(OpenAI ``json_schema`` with the llama.cpp fallback, Ollama ``format``, a llama.cpp grammar in process). The
router itself is the agent's default model (the configured default name), for calls that name none.

Upstream HTTP goes through one pooled client per gateway (bounded connections, connect and read timeouts):
chat calls to an OpenAI-compatible upstream through an aiohttp session
(:mod:`remem_agent.adapters.openai_aiohttp`, the cheapest per request), model listing and the Ollama adapter
through ``httpx``. The upstream API key is read from the environment here and handed only to those clients.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from remem_agent.adapters.base import Capabilities, ChatModel, ChatRequest, ChatResponse, StreamChunk, open_stream
from remem_agent.errors import ModelError
from remem_agent.gateway.config import GatewayConfig

log = logging.getLogger("remem_agent.gateway")

DISCOVERY_TTL_S = 30.0
# An upstream's embedding call: (model, texts) -> (one vector per text, the input tokens it counted or None)
Embed = Callable[[str, list[str]], Awaitable[tuple[list[list[float]], int | None]]]


@dataclass
class Timing:
    """Filled by the router during one gateway request (all times ``perf_counter`` seconds)."""

    started: float = field(default_factory=time.perf_counter)
    upstream_start: float | None = None
    upstream_s: float = 0.0
    first_chunk: float | None = None
    errors: list[str] = field(default_factory=list)

    def server_timing(self, now: float | None = None) -> str:
        """A ``Server-Timing`` header value: ``remem`` is the gateway's own time so far (recall, prompt, learning,
        everything but waiting for the upstream), ``upstream`` the upstream's time, in milliseconds. A stream's
        headers leave before its end: the upstream's part is then its time to the first chunk."""
        now = time.perf_counter() if now is None else now
        waited = self.upstream_s
        if not waited and self.upstream_start is not None:
            waited = (self.first_chunk or now) - self.upstream_start
        own = max(0.0, now - self.started - waited)
        return f'remem;dur={own * 1000:.2f};desc="gateway", upstream;dur={waited * 1000:.2f}'

    def error_kind(self, exc: ModelError) -> str:
        if exc.status is not None:
            return f"{exc.status // 100}xx" if exc.status != 429 else "429"
        return "timeout" if "timed out" in str(exc) else "transport"


class TimedModel:
    """A ``ChatModel`` wrapper that records one request's upstream time, first chunk and errors in its
    :class:`Timing` (the gateway's metrics and ``Server-Timing`` header); everything else is the model's."""

    def __init__(self, model: ChatModel, timing: Timing) -> None:
        self.model, self.timing = model, timing

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def adapter(self) -> str:
        return self.model.adapter

    @property
    def capabilities(self) -> Capabilities:
        return self.model.capabilities

    def _start(self) -> float:
        t0 = time.perf_counter()
        if self.timing.upstream_start is None:
            self.timing.upstream_start = t0
        return t0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        t0 = self._start()
        try:
            return await self.model.complete(request)
        except ModelError as exc:
            self.timing.errors.append(self.timing.error_kind(exc))
            raise
        finally:
            self.timing.upstream_s += time.perf_counter() - t0

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        t0 = self._start()
        gen = open_stream(self.model, request)  # the adapter's own generator when it is one (one relay fewer)
        try:
            async for chunk in gen:
                if self.timing.first_chunk is None:
                    self.timing.first_chunk = time.perf_counter()
                yield chunk
        except ModelError as exc:
            self.timing.errors.append(self.timing.error_kind(exc))
            raise
        finally:
            await gen.aclose()
            self.timing.upstream_s += time.perf_counter() - t0


class ModelRouter:
    """The gateway's models: one adapter per model name (:meth:`for_call`), the upstream's model list and
    embeddings. Itself a ``ChatModel`` (streaming) that asks the default model."""

    def __init__(
        self,
        *,
        kind: str,
        factory: Callable[[str], ChatModel],
        default: str,
        names: tuple[str, ...] = (),
        discover: Callable[[], Awaitable[list[str]]] | None = None,
        capabilities: Capabilities,
        close: Callable[[], Awaitable[None]] | None = None,
        secrets: tuple[str, ...] = (),
        embed: Embed | None = None,
    ) -> None:
        self._kind, self._factory, self._default = kind, factory, default
        self._names = tuple(names)
        self._discover = discover
        self._discovered: tuple[str, ...] = ()
        self._discovered_at = -1e9
        self._adapters: dict[str, ChatModel] = {}
        self._caps = capabilities
        self._close = close
        self._secrets = tuple(x for x in secrets if x)
        self._embed = embed
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self._default

    @property
    def adapter(self) -> str:
        return f"gateway:{self._kind}"

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def secrets(self) -> tuple[str, ...]:
        """The upstream's credentials, for the agent's trace redaction (never printed)."""
        return self._secrets

    @property
    def embeds(self) -> bool:
        """True when the upstream can embed (an in-process chat model cannot)."""
        return self._embed is not None

    async def embed(self, model: str, texts: list[str]) -> tuple[list[list[float]], int | None]:
        """The upstream's embeddings of ``texts`` with ``model`` (and the tokens it counted, when it says); a
        :class:`ModelError` when the upstream fails. Only when :attr:`embeds`."""
        assert self._embed is not None
        return await self._embed(model, texts)

    async def models(self) -> tuple[str, ...]:
        """The names served: configured ones, else the upstream's list (cached), else the default."""
        if self._names:
            return self._names
        if self._discover is not None and time.monotonic() - self._discovered_at > DISCOVERY_TTL_S:
            async with self._lock:
                if time.monotonic() - self._discovered_at > DISCOVERY_TTL_S:
                    self._discovered_at = time.monotonic()
                    try:
                        self._discovered = tuple(await self._discover())
                    except (httpx.HTTPError, ModelError, ValueError, KeyError, TypeError) as exc:
                        log.warning("could not list the upstream's models: %s", type(exc).__name__)
        return self._discovered or (self._default,)

    async def reachable(self, timeout_s: float = 2.0) -> str | None:
        """None when the upstream answers its model list within ``timeout_s`` (a local model: always), else what
        went wrong (the error's type, never its text: it may hold the upstream's address)."""
        if self._discover is None:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                await self._discover()
        except TimeoutError:
            return f"no answer within {timeout_s:g} s"
        except (httpx.HTTPError, ModelError, ValueError, KeyError, TypeError) as exc:
            cause = exc.__cause__ if isinstance(exc, ModelError) and exc.__cause__ is not None else exc
            return type(cause).__name__
        return None

    async def known(self, name: str) -> bool:
        if self._names:
            return name in self._names
        names = await self.models()
        # An upstream we could not list: let it decide (its 404 comes back in the protocol's shape).
        return name in names or not self._discovered

    def _adapter(self, name: str) -> ChatModel:
        model = self._adapters.get(name)
        if model is None:
            model = self._adapters[name] = self._factory(name)
        return model

    def for_call(self, name: str | None, timing: Timing | None = None) -> ChatModel:
        """The model one request asks for (``name``, else the default), timed into ``timing`` when given."""
        inner = self._adapter(name or self._default)
        return inner if timing is None else TimedModel(inner, timing)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return await self._adapter(self._default).complete(request)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        gen = open_stream(self._adapter(self._default), request)
        try:
            async for chunk in gen:
                yield chunk
        finally:
            await gen.aclose()

    async def aclose(self) -> None:
        for model in self._adapters.values():
            closer = getattr(model, "aclose", None) or getattr(model, "close", None)
            if closer is not None:
                out = closer()
                if asyncio.iscoroutine(out):
                    await out
        if self._close is not None:
            await self._close()


def http_client(config: GatewayConfig) -> httpx.AsyncClient:
    """The pooled client for upstream calls: bounded connections, a short connect timeout, the read timeout."""
    limits = httpx.Limits(max_connections=config.limits.max_concurrency * 2, max_keepalive_connections=32)
    timeout = httpx.Timeout(config.upstream_timeout_s, connect=min(5.0, config.upstream_timeout_s))
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=True)


def build_router(config: GatewayConfig, local: ChatModel | None = None) -> ModelRouter:
    """The router for ``config``: the upstream (OpenAI-compatible or Ollama) or the in-process local model."""
    if config.upstream is None:
        model = local if local is not None else local_model(config.model)
        alias = config.model if local is None and config.model in ("qwen", "smollm2") else model.name
        names = config.models or tuple(dict.fromkeys((alias, model.name)))  # "qwen" or its full name
        return ModelRouter(
            kind="local", factory=lambda _name: model, default=names[0], names=names, capabilities=model.capabilities
        )
    base = config.upstream.rstrip("/")
    client = http_client(config)
    if config.upstream_kind == "openai":
        return _openai_router(config, base, client)
    return _ollama_router(config, base, client)


def _openai_router(config: GatewayConfig, base: str, client: httpx.AsyncClient) -> ModelRouter:
    """An OpenAI-compatible upstream: the SDK for chat, models and embeddings, a raw session for streaming."""
    from remem_agent._extras import require

    openai = require("openai", "openai", feature="remem serve --upstream-kind openai")
    from remem_agent.adapters.openai_aiohttp import OpenAIUpstream, UpstreamSession

    key = os.environ.get(config.upstream_api_key_env) or "sk-no-key"
    sdk = openai.AsyncOpenAI(
        api_key=key, base_url=base, timeout=config.upstream_timeout_s, max_retries=0, http_client=client
    )
    session = UpstreamSession(
        base, key, timeout_s=config.upstream_timeout_s, max_connections=config.limits.max_concurrency * 2
    )

    async def discover_openai() -> list[str]:
        try:
            page = await sdk.models.list()
        except openai.APIError as exc:  # the SDK's errors as the library's, at the boundary
            raise ModelError(f"listing the upstream's models failed: {type(exc).__name__}") from exc
        return [m.id for m in page.data]

    async def embed_openai(model: str, texts: list[str]) -> tuple[list[list[float]], int | None]:
        try:
            resp = await sdk.embeddings.create(model=model, input=texts)
        except openai.APIStatusError as exc:  # the SDK's errors as the library's, at the boundary
            raise ModelError(f"the upstream refused the embedding: HTTP {exc.status_code}",
                             status=exc.status_code, body=str(exc.body)[:300]) from exc  # fmt: skip
        except openai.APIError as exc:
            raise ModelError(f"embedding upstream failed: {type(exc).__name__}") from exc
        vectors = [list(d.embedding) for d in sorted(resp.data, key=lambda d: d.index)]
        return vectors, resp.usage.prompt_tokens if resp.usage is not None else None

    async def close_openai() -> None:
        await session.aclose()
        await sdk.close()
        await client.aclose()

    return ModelRouter(
        kind="openai",
        factory=lambda name: OpenAIUpstream(name, client=sdk, session=session),
        default=config.models[0] if config.models else "default",
        names=config.models,
        discover=discover_openai,
        capabilities=Capabilities(native_json_schema=True, json_mode=True, tools=True, streaming=True),
        close=close_openai,
        secrets=(key,) if key != "sk-no-key" else (),
        embed=embed_openai,
    )


def _ollama_router(config: GatewayConfig, base: str, client: httpx.AsyncClient) -> ModelRouter:
    """An Ollama upstream: the ``ollama`` SDK for chat and embeddings, ``/api/tags`` for the model list."""
    from remem_agent._extras import require

    ollama = require("ollama", "ollama", feature="remem serve --upstream-kind ollama")
    from remem_agent.adapters.ollama_chat import OllamaChat

    limits = httpx.Limits(max_connections=config.limits.max_concurrency * 2, max_keepalive_connections=32)
    timeout = httpx.Timeout(config.upstream_timeout_s, connect=min(5.0, config.upstream_timeout_s))
    sdk_ollama = ollama.AsyncClient(host=base, timeout=timeout, limits=limits)

    async def discover_ollama() -> list[str]:
        resp = await client.get(f"{base}/api/tags")
        resp.raise_for_status()
        data: Mapping[str, Any] = resp.json()
        return [str(m.get("name") or m.get("model")) for m in data.get("models", [])]

    async def embed_ollama(model: str, texts: list[str]) -> tuple[list[list[float]], int | None]:
        try:
            resp = await sdk_ollama.embed(model=model, input=texts)
        except ollama.ResponseError as exc:  # the SDK's errors as the library's, at the boundary
            raise ModelError(f"the upstream refused the embedding: HTTP {exc.status_code}", status=exc.status_code,
                             body=str(exc.error)[:300]) from exc  # fmt: skip
        except (httpx.HTTPError, ConnectionError) as exc:
            raise ModelError(f"embedding upstream failed: {type(exc).__name__}") from exc
        count = getattr(resp, "prompt_eval_count", None)
        return [list(v) for v in resp.embeddings], count if isinstance(count, int) else None

    async def close_ollama() -> None:
        closer = getattr(sdk_ollama, "close", None)  # untyped in the SDK
        if closer is not None:
            await closer()
        await client.aclose()

    return ModelRouter(
        kind="ollama",
        factory=lambda name: OllamaChat(name, client=sdk_ollama),
        default=config.models[0] if config.models else "default",
        names=config.models,
        discover=discover_ollama,
        capabilities=Capabilities(native_json_schema=True, json_mode=True, tools=True, streaming=True),
        close=close_ollama,
        embed=embed_ollama,
    )


def local_model(choice: str) -> ChatModel:
    """``qwen`` | ``smollm2`` | a path to a ``.gguf`` file, run in process (extra ``local``)."""
    from remem_agent.adapters.llamacpp_chat import LlamaCppChat

    if choice == "qwen":
        return LlamaCppChat.qwen(n_ctx=4096)
    if choice == "smollm2":
        return LlamaCppChat.smollm2(n_ctx=2048)
    from pathlib import Path

    path = Path(choice)
    return LlamaCppChat(path, name=path.stem)
