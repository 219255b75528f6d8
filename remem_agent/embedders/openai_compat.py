"""Embedder for any OpenAI-compatible ``/v1/embeddings`` endpoint, over plain httpx.

Works with OpenAI itself and with servers that mimic its API (vLLM, llama.cpp server, Ollama's
``/v1``, LM Studio, ...). No SDK is needed. Transient failures (timeouts, connection errors, 429,
5xx, an ``{"error": ...}`` object sent with HTTP 200) are retried with exponential backoff and jitter,
honouring ``Retry-After``; any other 4xx fails fast with :class:`~remem_agent.errors.ModelError`, and so
does an HTTP-200 body that is not JSON or has no ``data`` list (well-formed JSON whose vectors are
missing, ragged or not numbers is an ``EmbeddingError``). The API key is sent only in the Authorization
header and is never logged nor put in an exception message.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np
import tenacity

from remem_agent.adapters.retry import parse_retry_after
from remem_agent.embedders.base import Vectors, check_texts, check_vectors
from remem_agent.errors import EmbeddingError, ModelError, UserInputError

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_BODY_LIMIT = 2000
_TRANSIENT_STATUS = frozenset({408, 425, 429})  # plus every 5xx


class _TransientError(Exception):
    """A failure worth retrying. Internal: surfaces as ModelError once retries run out."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        body: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.body = body
        self.retry_after = retry_after


class OpenAIEmbedder:
    """Embed texts through an OpenAI-compatible embeddings endpoint.

    Args:
        model: the model name the server knows (``"text-embedding-3-small"``, ``"nomic-embed-text"``...).
        base_url: API root including ``/v1``; defaults to ``$OPENAI_BASE_URL``, else OpenAI's.
        api_key: bearer token; defaults to ``$OPENAI_API_KEY``. None/empty sends no Authorization.
        dim: the expected width. If None it is discovered from the first response and then fixed;
            any later response of another width raises EmbeddingError.
        timeout: per-request timeout in seconds.
        transport: an httpx transport (tests pass ``httpx.MockTransport``).
        batch_size: texts per request.
        max_attempts: total tries per request for transient failures (>= 1).
        backoff_initial, backoff_max: exponential backoff with full jitter, in seconds.
        max_retry_after: cap on how long a ``Retry-After`` header may make us wait.
        request_dimensions: also send ``"dimensions": dim`` (text-embedding-3 truncation).
        sleep: the sleep function used between retries (tests inject a recorder).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        dim: int | None = None,
        timeout: float = 30,
        transport: httpx.BaseTransport | None = None,
        batch_size: int = 128,
        *,
        max_attempts: int = 5,
        backoff_initial: float = 0.5,
        backoff_max: float = 20.0,
        max_retry_after: float = 60.0,
        request_dimensions: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise UserInputError("model must be a non-empty string")
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0):
            raise UserInputError(f"dim must be a positive integer or None, got {dim!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise UserInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise UserInputError(f"max_attempts must be >= 1, got {max_attempts!r}")
        if timeout <= 0 or backoff_initial < 0 or backoff_max < 0 or max_retry_after < 0:
            raise UserInputError("timeout must be > 0 and backoff/retry-after limits >= 0")
        if request_dimensions and dim is None:
            raise UserInputError("request_dimensions=True needs dim")
        self._model = model
        root = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self._url = root.rstrip("/") + "/embeddings"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._api_key = key or None
        self._dim = dim
        self._batch_size = batch_size
        self._max_attempts = max_attempts
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._max_retry_after = max_retry_after
        self._request_dimensions = request_dimensions
        self._sleep = sleep
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), transport=transport, headers=headers)
        self._dim_lock = threading.Lock()

    # ------------------------------------------------------------------ protocol
    @property
    def name(self) -> str:
        return f"openai:{self._model}"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self.embed(["dimension probe"])  # discovers and fixes the width
        assert self._dim is not None
        return self._dim

    @property
    def base_url(self) -> str:
        return self._url[: -len("/embeddings")]

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIEmbedder(model={self._model!r}, base_url={self.base_url!r}, dim={self._dim!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows: list[list[float]] = []
        for start in range(0, len(items), self._batch_size):
            rows.extend(self._embed_batch(items[start : start + self._batch_size]))
        assert self._dim is not None
        return check_vectors(rows, len(items), self._dim, source=self.name)

    # ------------------------------------------------------------------ internals
    def _redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "[REDACTED]")
        return text

    def _body_of(self, response: httpx.Response) -> str:
        try:
            text = response.text
        except Exception:  # noqa: BLE001 - undecodable body: keep the failure, not the body
            text = "<undecodable body>"
        return self._redact(text[:_BODY_LIMIT])

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _TransientError) and exc.retry_after is not None:
            return min(exc.retry_after, self._max_retry_after)
        ceiling = min(self._backoff_max, self._backoff_initial * 2 ** (state.attempt_number - 1))
        return random.uniform(0, ceiling)  # full jitter

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = exc.reason if isinstance(exc, _TransientError) else type(exc).__name__
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "embedding request to %s failed (%s), attempt %d/%d; retrying in %.2fs",
            self._url,
            reason,
            state.attempt_number,
            self._max_attempts,
            wait,
        )

    def _post(self, payload: dict[str, Any]) -> Any:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._max_attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(_TransientError),
            before_sleep=self._before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        try:
            return retrying(self._post_once, payload)
        except _TransientError as exc:
            raise ModelError(
                f"embedding request to {self._url} failed after {self._max_attempts} attempt(s): {exc.reason}",
                status=exc.status,
                body=exc.body,
            ) from exc

    def _post_once(self, payload: dict[str, Any]) -> Any:
        try:
            response = self._client.post(self._url, json=payload)
        except httpx.TimeoutException as exc:
            raise _TransientError(f"timeout ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _TransientError(f"connection error ({type(exc).__name__})") from exc
        status = response.status_code
        if status in _TRANSIENT_STATUS or status >= 500:
            raise _TransientError(
                f"HTTP {status}",
                status=status,
                body=self._body_of(response),
                retry_after=parse_retry_after(response.headers),
            )
        if status >= 400 or status < 200:
            raise ModelError(
                f"embedding request to {self._url} was rejected with HTTP {status}",
                status=status,
                body=self._body_of(response),
            )
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(
                f"embedding endpoint {self._url} returned invalid JSON",
                status=status,
                body=self._body_of(response),
            ) from exc
        if isinstance(data, dict) and data.get("error") is not None and data.get("data") is None:
            # An error object sent with 200: routers report upstream failures so; worth a retry.
            raise _TransientError("an error object with HTTP 200", status=status, body=self._body_of(response))
        return data

    def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        payload: dict[str, Any] = {"model": self._model, "input": batch, "encoding_format": "float"}
        if self._request_dimensions:
            payload["dimensions"] = self._dim
        data = self._post(payload)
        rows = self._parse(data, len(batch))
        with self._dim_lock:
            if self._dim is None:
                self._dim = len(rows[0])
            dim = self._dim
        for i, row in enumerate(rows):
            if len(row) != dim:
                raise EmbeddingError(f"{self.name} returned a vector of width {len(row)} at {i}, expected {dim}")
        return rows

    def _parse(self, data: Any, n: int) -> list[list[float]]:
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ModelError(f"embedding endpoint {self._url} returned no 'data' list")
        if len(items) != n:
            raise EmbeddingError(f"{self.name} returned {len(items)} embeddings for {n} texts")
        by_index: dict[int, list[float]] = {}
        for pos, item in enumerate(items):
            if not isinstance(item, dict):
                raise ModelError(f"embedding endpoint {self._url} returned a malformed item at {pos}")
            index = item.get("index", pos)
            vector = item.get("embedding")
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n or index in by_index:
                raise ModelError(f"embedding endpoint {self._url} returned a bad or repeated index {index!r}")
            if not isinstance(vector, list) or not vector:
                raise EmbeddingError(f"{self.name} returned a missing or empty embedding at index {index}")
            if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector):
                raise EmbeddingError(f"{self.name} returned non-numeric values at index {index}")
            by_index[index] = vector
        return [by_index[i] for i in range(n)]


__all__ = ["DEFAULT_BASE_URL", "OpenAIEmbedder"]
