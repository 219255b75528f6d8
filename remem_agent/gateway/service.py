"""The protocol-neutral part of a chat call: one :class:`ChatCall` in, ``MemoryAgent.chat``/``chat_stream`` out.

Recall, the memory block, citations, value use and outcomes all happen inside the agent; this module only
prepares the call (conversation identity per scope, the router's private ``extra`` keys), remembers which
scope each answer belongs to (so feedback is authorized against it), and records metrics.

Conversation identity: the ``x-remem-conversation`` header threads a conversation's turns (a new turn settles
its latest answer). Without it, a new turn settles the answer whose request and reply are exactly its history
(:func:`~remem_agent.agent.conversation.transcript_digest`), and the reply's conversation id is a label hashed
from the first system and user message. Every response has its own answer id, and conversation state is the
scope's own, so two users whose chats open with the same words never settle each other's answers.

Waiting answers are ledger rows (:class:`~remem_agent.outcomes.ledger.LedgerPendingOutcomes`): feedback
for an answer, and the next turn of its conversation, may arrive at any worker or gateway on the store.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from remem_agent.adapters.base import StreamChunk
from remem_agent.agent import MemoryAgent
from remem_agent.agent.chat_types import ChatReply
from remem_agent.agent.conversation import conversation_key, parse_messages
from remem_agent.agent.stream import ChatStream
from remem_agent.errors import UnknownSearchError, UserInputError
from remem_agent.gateway.auth import Caller
from remem_agent.gateway.config import Limits
from remem_agent.gateway.metrics import Metrics
from remem_agent.gateway.protocol import ApiError, schema_valid
from remem_agent.gateway.upstream import ModelRouter, Timing
from remem_agent.outcomes.pending import PendingStore
from remem_agent.types import FeedbackReceipt

# answer -> scope entries this process remembers (least recent dropped). An answer that waits for its outcome is
# also found through the pending store, so past this only an answer that served no memory is forgotten (its
# feedback is a 404 that says so). 10k, not more: a long-running gateway's memory stays flat after warm-up.
MAX_ANSWERS = 10_000
_CONVERSATION = re.compile(r"^[A-Za-z0-9._:@+-]{1,128}$")


@dataclass
class ChatCall:
    """One chat request, protocol-neutral."""

    model: str
    messages: Any
    scope: str
    tools: Any = None
    tool_choice: Any = None
    temperature: float | None = None
    max_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the client's unknown fields, for the upstream
    schema: dict[str, Any] | None = None  # sent as ChatRequest.json_schema and checked on the reply
    validate: dict[str, Any] | None = None  # what the reply is checked against (schema, or {"type": "object"})
    schema_name: str = "answer"
    conversation: str | None = None
    task: str | None = None
    strip: bool | None = None
    timing: Timing = field(default_factory=Timing)


@dataclass(frozen=True)
class Meta:
    """What the gateway tells the client about the memory's part in one reply."""

    answer_id: str
    conversation_id: str
    served: tuple[str, ...]
    citations: tuple[str, ...] = ()
    schema_valid: bool | None = None
    abstained: bool = False  # the abstain gate found nothing relevant, so no memory was injected

    def headers(self) -> dict[str, str]:
        out = {
            "x-remem-answer-id": self.answer_id,
            "x-remem-served": ",".join(self.served),
            "x-remem-conversation": self.conversation_id,
        }
        if self.abstained:
            out["x-remem-abstained"] = "true"
        return out

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "answer_id": self.answer_id,
            "conversation_id": self.conversation_id,
            "served": list(self.served),
            "citations": list(self.citations),
        }
        if self.abstained:
            out["abstained"] = True
        if self.schema_valid is not None:
            out["schema_valid"] = self.schema_valid
        return out


class ChatService:
    def __init__(
        self, agent: MemoryAgent, router: ModelRouter, metrics: Metrics, limits: Limits, pending: PendingStore
    ) -> None:
        self.agent, self.router, self.metrics, self.limits = agent, router, metrics, limits
        self.pending = pending  # the agent's waiting answers: feedback is authorized against their scope
        self._answers: OrderedDict[str, str] = OrderedDict()  # answers given here (also those serving nothing)

    # -- preparation --------------------------------------------------------------------------------------
    async def check_model(self, name: object) -> str:
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' must be a non-empty string", code="invalid_value")
        if not await self.router.known(name):
            raise ApiError(404, f"the model {name!r} does not exist here; see GET /v1/models", code="model_not_found")
        return name

    def _prepare(self, call: ChatCall) -> tuple[Any, str, dict[str, Any]]:
        """The messages as parsed here (the agent takes parsed messages as they are, not validating them
        again), the conversation id and the agent's keyword arguments."""
        if isinstance(call.messages, list) and len(call.messages) > self.limits.max_messages:
            raise ApiError(
                400,
                f"too many messages: {len(call.messages)} (at most {self.limits.max_messages})",
                code="too_many_messages",
            )
        msgs: object
        if call.conversation is not None:
            if not _CONVERSATION.match(call.conversation):
                raise ApiError(
                    400, "x-remem-conversation must be 1-128 letters, digits or . _ : @ + -", code="invalid_value"
                )
            cid = call.conversation
            try:
                msgs = parse_messages(call.messages)
            except UserInputError:
                msgs = call.messages  # refused by the agent itself, as before (inside the call's stage timing)
        else:
            msgs = parse_messages(call.messages)  # a bad conversation is a UserInputError (400) here
            cid = conversation_key(msgs)
        kwargs: dict[str, Any] = {
            "model": self.router.for_call(call.model, call.timing),
            "json_schema": call.schema,
            "schema_name": call.schema_name,
            "tools": call.tools,
            "tool_choice": call.tool_choice,
            # the caller's id threads its turns; without one the agent follows the history (and labels it ``cid``)
            "conversation_id": call.conversation,
            "task": call.task,
            "temperature": call.temperature,
            "max_tokens": call.max_tokens,
            "strip_citations": call.strip,
            "extra": call.extra,
            "scope": call.scope,
        }
        return msgs, cid, kwargs

    def _remember(self, answer_id: str, scope: str) -> None:
        self._answers[answer_id] = scope
        self._answers.move_to_end(answer_id)
        while len(self._answers) > MAX_ANSWERS:
            self._answers.popitem(last=False)

    def meta(self, call: ChatCall, cid: str, reply: ChatReply) -> Meta:
        return Meta(
            answer_id=reply.answer_id,
            conversation_id=cid,
            served=tuple(h.id for h in reply.served),
            citations=reply.citations,
            abstained=reply.abstained,
            schema_valid=schema_valid(reply.raw, call.validate) if not reply.tool_calls else None,
        )

    # -- calls ----------------------------------------------------------------------------------------------
    async def complete(self, call: ChatCall) -> tuple[ChatReply, Meta]:
        msgs, cid, kwargs = self._prepare(call)
        try:
            reply = await self.agent.chat(msgs, **kwargs)
        finally:
            self.observe(call)
        self._remember(reply.answer_id, call.scope)
        self.metrics.inc("remem_gateway_memories_served_total", len(reply.served))
        return reply, self.meta(call, cid, reply)

    async def open_stream(self, call: ChatCall) -> tuple[ChatStream, StreamChunk | None, Meta]:
        """The agent's stream with recall done and the upstream's first chunk received.

        Everything that can fail before the first byte to the client (bad input, recall, the upstream
        refusing or being down, with the retry layer's retries) fails here, as a clean HTTP status.
        """
        msgs, cid, kwargs = self._prepare(call)
        stream = self.agent.chat_stream(msgs, **kwargs)
        try:
            await stream.start()
            assert stream.answer_id is not None
            self._remember(stream.answer_id, call.scope)
            try:
                first: StreamChunk | None = await stream.__anext__()
            except StopAsyncIteration:
                first = None
        except BaseException:
            await stream.aclose()
            self.observe(call)
            raise
        meta = Meta(
            answer_id=stream.answer_id,
            conversation_id=cid,
            served=tuple(h.id for h in stream.served),
            abstained=stream.abstained,
        )
        self.metrics.inc("remem_gateway_memories_served_total", len(meta.served))
        return stream, first, meta

    async def chunks(self, stream: ChatStream, first: StreamChunk | None, call: ChatCall) -> AsyncIterator[StreamChunk]:
        """The rest of the stream, bounded by ``max_stream_seconds`` (an ``asyncio.TimeoutError`` past it).

        Each wait for the next chunk is ``asyncio.timeout(left)``'s, with one timer for the whole stream
        (:class:`StreamDeadline`) instead of a timer armed and cancelled around every chunk.
        """
        deadline = call.timing.started + self.limits.max_stream_seconds
        if first is not None:
            yield first
        guard: StreamDeadline | None = None
        try:
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError
                if guard is None:
                    guard = StreamDeadline(left)
                try:
                    if guard.task is asyncio.current_task():
                        chunk = await guard.wait(stream)
                    else:  # another task iterates (never, in this gateway): the timer cannot be its
                        async with asyncio.timeout(left):
                            chunk = await stream.__anext__()
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            if guard is not None:
                guard.close()

    def observe(self, call: ChatCall) -> None:
        t = call.timing
        now = time.perf_counter()
        if t.upstream_start is not None:
            self.metrics.observe("remem_gateway_stage_seconds", t.upstream_start - t.started, stage="recall")
            self.metrics.observe("remem_gateway_stage_seconds", t.upstream_s, stage="upstream")
        if t.first_chunk is not None:
            self.metrics.observe("remem_gateway_stage_seconds", t.first_chunk - t.started, stage="first_token")
        self.metrics.observe("remem_gateway_stage_seconds", now - t.started, stage="total")
        for kind in t.errors:
            self.metrics.inc("remem_gateway_upstream_errors_total", kind=kind)
        t.errors.clear()

    # -- feedback -------------------------------------------------------------------------------------------
    async def latest_answer(self, caller: Caller, scope: str, conversation: object) -> str:
        """The newest answer still waiting in ``conversation`` (an ``x-remem-conversation``) of ``scope``."""
        if not isinstance(conversation, str) or not _CONVERSATION.match(conversation):
            raise ApiError(400, "'conversation' must be 1-128 letters, digits or . _ : @ + -", code="invalid_value")
        if not caller.may(scope):
            raise ApiError(403, f"this key is not granted the scope {scope!r}", type="permission_error",
                           code="scope_forbidden")  # fmt: skip
        waiting = await self.pending.latest(("conv", f"{scope}|{conversation}"))
        if waiting is None:
            raise UnknownSearchError(
                conversation, field="conversation", detail="no answer of it is waiting for a verdict in this scope"
            )
        return waiting.answer_id

    async def feedback(
        self, caller: Caller, answer_id: object, success: object, reason: object, used_ids: object
    ) -> FeedbackReceipt:
        if not isinstance(answer_id, str) or not answer_id:
            raise ApiError(400, "'answer_id' must be the x-remem-answer-id of a reply", code="invalid_value")
        if not isinstance(success, bool):
            raise ApiError(400, "'success' must be true or false", code="invalid_value")
        if reason is not None and not isinstance(reason, str):
            raise ApiError(400, "'reason' must be a string", code="invalid_value")
        if used_ids is not None and not (isinstance(used_ids, list) and all(isinstance(u, str) for u in used_ids)):
            raise ApiError(400, "'used_ids' must be a list of memory ids", code="invalid_value")
        scope = self._answers.get(answer_id) or await self.pending.scope_of(answer_id)  # given here, or elsewhere
        if scope is None:
            raise UnknownSearchError(
                answer_id,
                field="answer_id",
                detail="not given by a gateway on this store, or it served no memory",
            )
        if not caller.may(scope):
            raise ApiError(
                403,
                "this key may not give feedback in the answer's scope",
                type="permission_error",
                code="scope_forbidden",
            )
        return await self.agent.feedback(answer_id, success=success, reason=reason, used_ids=used_ids, scope=scope)


class StreamDeadline:
    """``async with asyncio.timeout(left): await stream.__anext__()`` for every chunk of one stream, with ONE
    timer: armed once at the stream's deadline, it cancels the task that created it only while that task waits
    in :meth:`wait` (past the deadline between waits, the caller's own check raises before the next wait, as
    there was no timer then either). A cancellation it caused is turned into ``TimeoutError`` exactly as
    ``asyncio.Timeout.__aexit__`` does (``uncancel``, and only when no other cancellation is pending)."""

    def __init__(self, left: float) -> None:
        self.task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = loop.call_at(loop.time() + left, self._expire)
        self._waiting = False
        self._expiring = False
        self._cancelling = 0

    def _expire(self) -> None:
        self._handle = None
        if self._waiting and self.task is not None:
            self._expiring = True
            self.task.cancel()

    async def wait(self, stream: ChatStream) -> StreamChunk:
        task = self.task
        assert task is not None
        self._cancelling = task.cancelling()
        self._waiting = True
        try:
            chunk = await stream.__anext__()
        except BaseException as exc:
            self._waiting = False
            if self._expiring:
                self._expiring = False
                if task.uncancel() <= self._cancelling and isinstance(exc, asyncio.CancelledError):
                    raise TimeoutError from exc
            raise
        self._waiting = False
        if self._expiring:  # the chunk came anyway (its generator swallowed the cancellation)
            self._expiring = False
            task.uncancel()
        return chunk

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class StreamEnd:
    """Ends a gateway stream exactly once: the agent's stream (upstream closed, trace written, the agent's
    slot freed), the metrics, the gateway's slot. Called by the body's ``finally`` and, in case the body never
    started (the client left before the first byte), by :class:`ClosingStreamingResponse`."""

    def __init__(self, service: ChatService, chat: ChatStream, call: ChatCall, release: Callable[[], None]) -> None:
        self.service, self.chat, self.call, self.release = service, chat, call, release
        self._done = False

    async def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        with anyio.CancelScope(shield=True):  # a client that went away still gets the stream closed and traced
            try:
                await self.chat.aclose()
            finally:
                self.service.observe(self.call)
                self.release()


class ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that always runs ``end`` when it is done, sent or not."""

    def __init__(self, content: AsyncIterator[bytes], end: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._end = end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._end()


def receipt_body(receipt: FeedbackReceipt) -> Mapping[str, Any]:
    return {
        "search_id": receipt.search_id,
        "success": receipt.success,
        "credit": dict(receipt.credit),
        "blame": dict(receipt.blame),
        "repeated": receipt.repeated,
        "source": receipt.source,
        "transitions": [e.to_dict("iso") for e in receipt.transitions],
    }
