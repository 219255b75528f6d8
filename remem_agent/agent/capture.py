"""Fact capture (off by default): facts stated in user turns become memories, in the background.

After each new user turn the turn's text is offered to a bounded queue; one worker task takes it, asks
an extractor (:class:`~remem_agent.extract.LLMFactExtractor` with the wrapped or another model) for
``state`` / ``preference`` / ``note`` facts with entity+attribute, and adds them (supersession applies:
a stated new value retires the old one). The reply never waits for any of this: when the queue is full
the turn is dropped and counted (``FactCapture.dropped``), never queued without limit. Each capture is
one ``capture`` trace line; a captured fact that supersedes a memory served to a waiting answer makes
that answer a failure (``on_added``), as a correction by hand would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from remem_agent.agent.trace import TraceWriter
from remem_agent.errors import RememError
from remem_agent.validate import MemoryInput

log = logging.getLogger("remem_agent.agent")


class AsyncFactExtractor(Protocol):
    async def aextract(self, transcript: str) -> Sequence[MemoryInput]: ...


class CaptureMemory(Protocol):
    async def aadd_many(self, items: Sequence[MemoryInput], *, scope: str | None = None) -> list[str]: ...


@dataclass(frozen=True, kw_only=True)
class _Job:
    text: str
    conversation_id: str
    answer_id: str
    scope: str | None = None
    after: Callable[[], Awaitable[None]] | None = None  # run once this turn is read (a deferred verdict)


class FactCapture:
    """A bounded queue of user turns and the one worker that turns them into memories."""

    def __init__(
        self,
        extractor: AsyncFactExtractor,
        memory: CaptureMemory,
        *,
        queue_size: int = 64,
        on_added: Callable[[list[str]], Awaitable[None]] | None = None,
        tracer: Callable[[], TraceWriter | None] = lambda: None,
        run_id: str = "",
    ) -> None:
        self.extractor, self.memory = extractor, memory
        self._queue: asyncio.Queue[_Job] | None = None
        self._size = queue_size
        self._worker: asyncio.Task[None] | None = None
        self._on_added, self._tracer, self._run_id = on_added, tracer, run_id
        self.submitted = self.dropped = self.captured = self.failed = 0

    def submit(
        self,
        text: str,
        *,
        conversation_id: str,
        answer_id: str,
        scope: str | None = None,
        after: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Offer one user turn; False (and counted in ``dropped``) when the queue is full. Never blocks.

        ``after`` runs once the turn's facts are stored (or their capture failed).
        """
        if self._queue is None:
            self._queue = asyncio.Queue(self._size)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run(self._queue), name="remem-fact-capture")
        try:
            self._queue.put_nowait(
                _Job(text=text, conversation_id=conversation_id, answer_id=answer_id, scope=scope, after=after)
            )
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        self.submitted += 1
        return True

    async def drain(self) -> None:
        """Wait until every offered turn has been processed (tests, shutdown)."""
        if self._queue is not None:
            await self._queue.join()

    async def aclose(self) -> None:
        """Stop the worker; turns still queued are dropped."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    async def _run(self, queue: asyncio.Queue[_Job]) -> None:
        while True:
            job = await queue.get()
            try:
                await self._capture(job)
                if job.after is not None:
                    await job.after()
            except RememError as exc:  # the deferred verdict could not be recorded: logged, the worker goes on
                log.warning("deferred outcome after fact capture failed: %s", exc)
            finally:
                queue.task_done()

    async def _capture(self, job: _Job) -> None:
        ids: list[str] = []
        error: str | None = None
        try:
            facts = list(await self.extractor.aextract(job.text))
            ids = await self.memory.aadd_many(facts, scope=job.scope) if facts else []  # the speaker's scope
            self.captured += len(ids)
            if ids and self._on_added is not None:
                await self._on_added(ids)
        except RememError as exc:  # a model or validation failure loses this turn's facts, nothing else
            self.failed += 1
            error = f"{type(exc).__name__}: {exc}"
            log.info("fact capture failed for %s: %s", job.answer_id, error)
        tracer = self._tracer()
        if tracer is not None:
            await tracer.write(
                {
                    "v": 2,
                    "kind": "capture",
                    "ts": datetime.now(UTC).isoformat(),
                    "run": self._run_id,
                    "answer_id": job.answer_id,
                    "conversation_id": job.conversation_id,
                    "memories": ids,
                    "error": error,
                }
            )
