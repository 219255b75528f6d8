"""The one retry layer for model calls.

Transient failures (``ModelError(retryable=True)``: timeouts, connection errors, 429, 5xx) are retried
with exponential backoff and full jitter, honouring the server's Retry-After; anything else fails fast.
Adapters never retry on their own, so the policy is the same for every provider and every attempt is
visible to the caller (``on_retry``) and therefore to the trace.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
    """Run ``fn``; retry retryable ModelErrors up to ``policy.max_attempts`` attempts in total."""
    rng = rng or random.Random()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except ModelError as exc:
            if not exc.retryable or attempt >= policy.max_attempts:
                raise
            delay = policy.wait(attempt, exc, rng)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            await sleep(delay)
