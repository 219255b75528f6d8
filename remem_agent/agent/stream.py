"""A chat call streamed: ``MemoryAgent.chat_stream`` returns a :class:`ChatStream`.

Memory work (validation, recall, the memory block) runs before the first chunk, as in a call
(:mod:`.chat`); the model's chunks are relayed as they come, inline citations stripped when asked; citations,
value use, the waiting answer and the trace line follow the last chunk. A consumer that stops reading closes
the model's stream and frees the agent's slot, and nothing is credited.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Any

from remem_agent.adapters.base import ChatModel, ChatRequest, StreamAssembler, StreamChunk, open_stream
from remem_agent.adapters.retry import RetryPolicy, call_with_retries
from remem_agent.agent._spans import model_attributes, ms, record_response, root_span
from remem_agent.agent.chat import Conversations
from remem_agent.agent.chat_types import ChatOptions, ChatReply
from remem_agent.agent.conversation import CitationStripper
from remem_agent.agent.learn import read_reply
from remem_agent.agent.telemetry import Span
from remem_agent.errors import ModelError
from remem_agent.types import Hit


@dataclass
class StreamState:
    """What a stream's body reports to its :class:`ChatStream` (kept apart so the two form no reference
    cycle: a stream dropped without ``aclose`` is then freed at once and its generator finalised)."""

    answer_id: str | None = None
    conversation_id: str | None = None
    served: tuple[Hit, ...] = ()
    abstained: bool = False
    reply: ChatReply | None = None


class ChatStream:
    """``async for chunk in agent.chat_stream(...)``: text and tool-call pieces as the model produces them.

    Memory work (validation, recall, the memory block) happens before the first chunk: ``await
    stream.start()`` runs it early and makes ``answer_id``/``served`` available before any token (the
    gateway sends them as headers). Citations, learning and the trace happen after the last chunk;
    ``reply`` then holds the assembled :class:`ChatReply`. Leaving the loop early (``break``) or calling
    :meth:`aclose` closes the model's stream and releases the agent's concurrency slot; nothing is credited.
    """

    def __init__(self, run: Callable[[StreamState], AsyncGenerator[StreamChunk | None]]) -> None:
        self._state = StreamState()
        self._gen = run(self._state)
        self._started = False

    @property
    def answer_id(self) -> str | None:
        return self._state.answer_id

    @property
    def conversation_id(self) -> str | None:
        return self._state.conversation_id

    @property
    def served(self) -> tuple[Hit, ...]:
        return self._state.served

    @property
    def abstained(self) -> bool:
        """True when the abstain gate found nothing relevant (no memory block was injected)."""
        return self._state.abstained

    @property
    def reply(self) -> ChatReply | None:
        return self._state.reply

    async def start(self) -> None:
        if not self._started:
            self._started = True
            first = await self._gen.__anext__()  # the generator yields None once its memory work is done
            assert first is None

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> StreamChunk:
        await self.start()
        chunk = await self._gen.__anext__()
        assert chunk is not None
        return chunk

    async def aclose(self) -> None:
        await self._gen.aclose()

    async def __aenter__(self) -> ChatStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def stream_chat(
    conv: Conversations,
    opts: ChatOptions,
    retry: RetryPolicy,
    stream: StreamState,
    slot: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
) -> AsyncGenerator[StreamChunk | None]:
    """The body of a :class:`ChatStream`: yields None when ready, then the (citation-stripped) chunks."""
    async with slot():
        root = root_span(conv.telemetry, opts.conversation_id, stream=True)
        try:
            async with contextlib.aclosing(_stream_body(conv, opts, retry, stream, root)) as body:
                async for item in body:  # closing this generator closes the body, and so the model's stream
                    yield item
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                root.fail(exc)
            raise
        finally:
            root.end()


async def _stream_body(
    conv: Conversations, opts: ChatOptions, retry: RetryPolicy, stream: StreamState, root: Span
) -> AsyncGenerator[StreamChunk | None]:
    t0 = time.perf_counter()
    turn, recalled = await conv.turns.stage(opts, t0, root)
    t_recall = time.perf_counter()
    req, block = conv.request(opts, turn)
    stream.answer_id, stream.served, stream.abstained = turn.answer_id, turn.result.items, turn.result.abstained
    stream.conversation_id = opts.conversation_id
    yield None
    asm = StreamAssembler(opts.model.name)
    stripper = CitationStripper() if opts.strip else None
    t_call = time.perf_counter()
    t_first: float | None = None
    state: dict[str, str | None] = {"outcome": "stopped", "error": None}  # read in finally, set in the body
    model_span = conv.telemetry.start(f"chat {opts.model.name}", model_attributes(opts.model, opts.sampling), root)
    try:
        upstream = await _open_stream(opts.model, req, retry)
        async with contextlib.aclosing(upstream):
            async for chunk in upstream:
                if t_first is None:
                    t_first = time.perf_counter()
                asm.add(chunk)
                if stripper is not None and chunk.text:
                    chunk = replace(chunk, text=stripper.feed(chunk.text))
                if stripper is not None and chunk.finish_reason is not None:
                    chunk = replace(chunk, text=chunk.text + stripper.flush())
                if chunk.text or chunk.tool_calls or chunk.finish_reason is not None or chunk.usage is not None:
                    yield chunk
        state["outcome"] = "done"
    except ModelError as exc:
        state.update(outcome="error", error=f"model error mid-stream: {exc}")
        model_span.fail(exc)
        raise
    finally:
        outcome, error = state["outcome"], state["error"]
        resp = asm.response(latency_ms=ms(t_call))
        record_response(model_span, resp)
        if t_first is not None:
            model_span.set("gen_ai.response.time_to_first_chunk", round(t_first - t_call, 6))
        model_span.end()
        reply, waiting = read_reply(opts, turn, resp, recalled=recalled) if outcome == "done" else (None, None)

        def latency() -> dict[str, float]:  # taken once the answer is waiting, as before
            times = {
                "recall": ms(t0, t_recall),
                "first_token": ms(t0, t_first) if t_first is not None else None,
                "model": ms(t_call),
                "total": ms(t0),
            }
            return {k: v for k, v in times.items() if v is not None}

        record = conv.call_record(
            opts, turn, recalled=recalled, block=block, stream=True, text=resp.text, tool_calls=resp.tool_calls,
            finish_reason=resp.finish_reason if outcome == "done" else outcome, usage=resp.usage, reply=reply,
            error=error if outcome != "stopped" else "the consumer stopped reading before the end",
        )  # fmt: skip
        await conv.persist(waiting, record, latency)  # the pending answer, then the trace line
        stream.reply = reply


async def _open_stream(model: ChatModel, req: ChatRequest, retry: RetryPolicy) -> AsyncGenerator[StreamChunk]:
    """The model's stream with its first chunk already received: failures before any byte are retried."""

    async def first() -> tuple[StreamChunk | None, AsyncGenerator[StreamChunk]]:
        gen = open_stream(model, req)  # the model's own generator when it is one (one relay fewer)
        try:
            return await gen.__anext__(), gen
        except StopAsyncIteration:
            return None, gen
        except BaseException:
            await gen.aclose()
            raise

    head, gen = await call_with_retries(first, retry)
    return _prepend(head, gen)


async def _prepend(head: StreamChunk | None, gen: AsyncGenerator[StreamChunk]) -> AsyncGenerator[StreamChunk]:
    try:
        if head is not None:
            yield head
        async for chunk in gen:
            yield chunk
    finally:
        await gen.aclose()
