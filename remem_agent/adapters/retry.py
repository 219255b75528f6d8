"""The one retry layer for model calls.

Transient failures (``ModelError(retryable=True)``: timeouts, connection errors, 429, 5xx) are retried
with exponential backoff with full jitter, honouring the server's Retry-After, a bounded number of
attempts; anything else fails fast. The loop is written out (it was tenacity's ``AsyncRetrying`` with the
same stop, wait, retry and ``before_sleep`` rules): building and driving tenacity's state machine cost more
CPU than the gateway's whole upstream call bookkeeping, on every call, retried or not.
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
    """Run ``fn``; retry retryable ModelErrors up to ``policy.max_attempts`` attempts in total.

    After failed attempt ``n`` (1-based) that may be retried, ``on_retry(n, error, wait)`` is called, then
    ``sleep(wait)`` with ``wait = policy.wait(n, error, rng)``. Any other exception, a ModelError that is not
    retryable, or the last attempt's ModelError propagates unchanged (the exception object itself).
    """
    attempt = 1
    while True:
        try:
            return await fn()
        except ModelError as exc:
            if not exc.retryable or attempt >= policy.max_attempts:
                raise
            if rng is None:
                rng = random.Random()  # seeded from the OS once a call is retried at all
            delay = policy.wait(attempt, exc, rng)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
        await sleep(delay)
        attempt += 1


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
