"""The one retry layer for model calls.

Transient failures (``ModelError(retryable=True)``: timeouts, connection errors, 429, 5xx) are retried
with tenacity: exponential backoff with full jitter, honouring the server's Retry-After, a bounded number
of attempts; anything else fails fast.
Adapters never retry on their own, so the policy is the same for every provider and every attempt is
visible to the caller (``on_retry``) and therefore to the trace.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from remem_agent.errors import ModelError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    initial_backoff: float = 0.5
    max_backoff: float = 20.0
    max_retry_after: float = 60.0

    def wait(self, attempt: int, error: ModelError, rng: random.Random) -> float:
        """Seconds to wait after failed ``attempt`` (1-based)."""
        if error.retry_after is not None:
            return min(max(0.0, error.retry_after), self.max_retry_after)
        cap = min(self.max_backoff, self.initial_backoff * (2 ** (attempt - 1)))
        return rng.uniform(0.0, cap)


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_retry: Callable[[int, ModelError, float], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Run ``fn``; retry retryable ModelErrors up to ``policy.max_attempts`` attempts in total (tenacity)."""
    rng = rng or random.Random()

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        assert isinstance(exc, ModelError)
        return policy.wait(state.attempt_number, exc, rng)

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if on_retry is not None and isinstance(exc, ModelError):
            on_retry(state.attempt_number, exc, state.upcoming_sleep)

    retrying = AsyncRetrying(
        sleep=sleep,
        stop=stop_after_attempt(policy.max_attempts),
        wait=wait,
        retry=retry_if_exception(lambda e: isinstance(e, ModelError) and e.retryable),
        before_sleep=before_sleep,
        reraise=True,  # the caller sees the last ModelError itself, not a tenacity RetryError
    )

    async def attempt() -> T:  # a real coroutine function: tenacity would not await a plain lambda's result
        return await fn()

    return await retrying(attempt)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (delta-seconds or HTTP-date); None if absent."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return max(0.0, value)
    raw = headers.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
