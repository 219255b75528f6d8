"""What one request may cost: body size, and a bounded concurrency gate that sheds load with 429.

The gate admits ``max_concurrency`` requests at once and lets at most ``max_queue`` more wait (each for at
most ``queue_timeout_s``); a request beyond that, or one that waited too long, is refused at once with
:class:`Overloaded` (HTTP 429 + ``Retry-After``), so overload never turns into an unbounded queue.
A streamed response holds its slot until its last byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import Request

from remem_agent.gateway.config import Limits


class Overloaded(Exception):
    """No slot free and the queue is full (or the wait timed out)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("the gateway is at capacity; retry later")
        self.retry_after = retry_after


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")
        self.limit = limit


class Gate:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._sem = asyncio.Semaphore(limits.max_concurrency)
        self.active = 0
        self.waiting = 0

    async def acquire(self) -> Callable[[], None]:
        """Take a slot; returns its release function (idempotent). Raises :class:`Overloaded`."""
        lim = self.limits
        if not self._sem.locked():  # a free slot and nobody queued before us: taken at once (wait_for would
            await self._sem.acquire()  # wrap the acquire in a task and a timer on every request)
        elif self.waiting >= lim.max_queue:
            raise Overloaded(lim.retry_after_s)
        else:
            self.waiting += 1
            try:
                await asyncio.wait_for(self._sem.acquire(), timeout=lim.queue_timeout_s)
            except TimeoutError:
                raise Overloaded(lim.retry_after_s) from None
            finally:
                self.waiting -= 1
        self.active += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.active -= 1
                self._sem.release()

        return release


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (:class:`BodyTooLarge`) as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)
