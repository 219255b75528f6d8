"""Memory for a conversation the caller owns: ``MemoryAgent.chat``, orchestrated stage by stage.

The caller keeps its system prompt, history, tools and sampling; per call the middleware

1. validates the messages and tools (:mod:`.conversation`; the call's options: :meth:`Conversations.options`),
   before any model call;
2. recalls once per *user turn* (:mod:`.recall`): a call that ends with a user message is a new answer (its own
   ``answer_id``, even when an identical request came before) and runs a search; a call that adds assistant
   tool calls and tool results after that user message (an agent loop) continues its turn and reuses the
   turn's recall and answer id, so every call of the turn shows the same labels and credit goes to the turn
   that served;
3. adds one memory block (placement in :func:`~remem_agent.agent.conversation.inject_memories`);
4. calls the model (streamed or not: :mod:`.stream`), then reads the reply (:mod:`.learn`): inline citations
   ``[M1]`` and the values of served memories that the reply or tool-call arguments repeat;
5. leaves the turn's answer waiting for its outcome (:mod:`remem_agent.outcomes`), which arrives as an explicit
   ``feedback(answer_id, ...)``, as a correction (a new ``state`` fact superseding a served one), or
   from the next user turn that follows it: a correction ("No, ...") is a failure blamed on the
   memories the answer used; moving on is a weak success; an optional judge model rates the answer
   (:mod:`.verdicts`). Which answer a turn follows: with a ``conversation_id``, that conversation's latest
   answer; without one, the answer whose request and reply are exactly the turn's history
   (:func:`~remem_agent.agent.conversation.transcript_digest`), so two conversations that open alike
   never settle each other's answers;
6. writes one trace line per call (:mod:`.chat_trace`) and one per outcome (:mod:`.trace`, version 2).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from remem_agent.adapters.base import (
    ChatModel,
    ChatRequest,
    ChatResponse,
    Message,
    Usage,
    check_chat_model,
)
from remem_agent.adapters.retry import RetryPolicy, call_with_retries
from remem_agent.agent._spans import model_attributes, ms, record_response, root_span, stage
from remem_agent.agent.call import Sampling
from remem_agent.agent.capture import FactCapture
from remem_agent.agent.chat_trace import CallOutcome, ChatTraceLine, chat_line
from remem_agent.agent.chat_types import ChatArgs, ChatOptions, ChatReply, TurnState
from remem_agent.agent.conversation import (
    conversation_key,
    inject_memories,
    parse_messages,
    parse_tool_choice,
    parse_tools,
)
from remem_agent.agent.learn import read_reply
from remem_agent.agent.ports import AgentMemory
from remem_agent.agent.prompt import is_temporal_question, render_memories
from remem_agent.agent.recall import Turns
from remem_agent.agent.telemetry import NoTelemetry, Telemetry
from remem_agent.agent.trace import TraceWriter
from remem_agent.agent.verdicts import AnswerContext, Verdicts
from remem_agent.errors import ModelError, UserInputError
from remem_agent.outcomes.pending import (
    BlockingAdd,
    PendingStore,
    Thread,
    Waiting,
)
from remem_agent.types import Hit
from remem_agent.validate import check_scope

log = logging.getLogger("remem_agent.agent")


class Conversations:
    """The chat calls of one ``MemoryAgent``: their options, prompt and waiting answer with its trace line; the
    conversations' turns (``turns``, :mod:`.recall`) and their verdicts (``verdicts``, :mod:`.verdicts`)."""

    def __init__(
        self,
        *,
        memory: AgentMemory,
        model: ChatModel,
        pending: PendingStore,
        tracer: Callable[[], TraceWriter | None],
        run_id: str,
        retry: RetryPolicy,
        k: int,
        token_budget: int | None,
        judge: ChatModel | None = None,
        telemetry: Telemetry | None = None,
        capture: FactCapture | None = None,
        capture_corrections: bool = False,
    ) -> None:
        self.model, self.pending = model, pending
        self.telemetry: Telemetry = telemetry or NoTelemetry()
        self.verdicts = Verdicts(
            memory=memory,
            pending=pending,
            tracer=tracer,
            run_id=run_id,
            retry=retry,
            telemetry=self.telemetry,
            answer_of=self._answer_context,
            judge=judge,
            capture=capture is not None,
            capture_corrections=capture_corrections,
        )
        # the ledger's pending store adds in the caller's worker thread (see ``persist``); decided once
        self._add_blocking = pending.add_blocking if isinstance(pending, BlockingAdd) else None
        # (its reads and claims too: a new turn may settle and recall in one hop, ``Verdicts.settle_and_search``)
        self._tracer, self.run_id = tracer, run_id
        self.turns = Turns(
            memory=memory, verdicts=self.verdicts, capture=capture, k=k, token_budget=token_budget,
            telemetry=self.telemetry, tracer=tracer, run_id=run_id,
        )  # fmt: skip

    # -- validation -----------------------------------------------------------------------------
    def options(self, messages: object, args: ChatArgs, *, sampling: Sampling, strip: bool) -> ChatOptions:
        """One call's options, validated before anything runs (a ``UserInputError`` names what is wrong)."""
        msgs = parse_messages(messages)
        specs = parse_tools(args.get("tools"))
        choice = parse_tool_choice(args.get("tool_choice"), specs)
        given = args.get("model")
        # the agent's own model was checked when the agent was made: only a call's own is checked here (a
        # runtime protocol check scans the model's members each time)
        model = self.model if given is None else check_chat_model(given)
        if specs and not model.capabilities.tools:
            raise UserInputError(
                f"model {model.name!r} ({model.adapter}) does not support tools; "
                "pass no tools, or use an adapter whose capabilities.tools is True"
            )
        conversation_id, extra = args.get("conversation_id"), args.get("extra")
        if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id.strip()):
            raise UserInputError("conversation_id must be a non-empty string")
        if extra is not None and not isinstance(extra, Mapping):
            raise UserInputError("extra must be a mapping of provider fields")
        schema, schema_name = args.get("json_schema"), args.get("schema_name")
        if schema is not None and not isinstance(schema, Mapping):
            raise UserInputError("json_schema must be a JSON schema object (a mapping)")
        if schema_name is not None and (not isinstance(schema_name, str) or not schema_name.strip()):
            raise UserInputError("schema_name must be a non-empty string")
        return ChatOptions(
            messages=msgs,
            tools=specs,
            tool_choice=choice,
            conversation_id=conversation_id or conversation_key(msgs),
            threaded=conversation_id is not None,
            scope=check_scope(args.get("scope")),
            task=args.get("task"),
            k=args.get("k"),
            now=args.get("now"),
            token_budget=args.get("token_budget"),
            strip=strip,
            sampling=sampling,
            extra=dict(extra or {}),
            model=model,
            json_schema=schema,
            schema_name=schema_name or "answer",
        )

    def _answer_context(self, answer_id: str) -> AnswerContext | None:
        """What a judge reads of an answer this process gave (None for another process's answer)."""
        turn = self.turns.by_answer(answer_id)
        if turn is None:
            return None
        return AnswerContext(
            question=turn.question, reply=turn.replies[-1] if turn.replies else "", started=turn.started
        )

    def request(self, opts: ChatOptions, turn: TurnState) -> tuple[ChatRequest, str | None]:
        labels = list(turn.aliases)
        temporal = is_temporal_question(turn.query)
        block = render_memories(turn.result.items, labels, temporal=temporal) if turn.result.items else None
        prompt = inject_memories(opts.messages, turn.result.items, labels, rendered=block)
        req = ChatRequest(
            messages=prompt,
            temperature=opts.sampling.temperature,
            max_tokens=opts.sampling.max_tokens,
            seed=opts.sampling.seed,
            tools=opts.tools,
            tool_choice=opts.tool_choice,
            json_schema=opts.json_schema,
            schema_name=opts.schema_name,
            extra=opts.extra,
        )
        return req, block

    # -- after the reply --------------------------------------------------------------------------
    async def persist(
        self,
        waiting: tuple[Waiting, Thread] | None,
        line: ChatTraceLine | None,
        latency: Callable[[], Mapping[str, float]],
    ) -> None:
        """The waiting answer joins the pending outcomes, then the call's trace line is written with
        ``latency()`` taken once the answer is waiting.

        Both are blocking work; when the pending store can add without its own hop (the ledger's,
        :class:`~remem_agent.outcomes.pending.BlockingAdd`) they run in ONE worker-thread call instead of two.
        """
        tracer = self._tracer() if line is not None else None
        add = self._add_blocking
        if waiting is not None and add is not None:

            def work() -> None:
                add(*waiting)
                if tracer is not None and line is not None:
                    tracer.write_sync(line.with_latency(latency()).to_dict())

            await asyncio.to_thread(work)
            return
        if waiting is not None:
            await self.pending.add(*waiting)
        if tracer is not None and line is not None:
            await tracer.write(line.with_latency(latency()).to_dict())

    # -- traces -----------------------------------------------------------------------------------
    def call_record(self, opts: ChatOptions, turn: TurnState, **call: Unpack[CallOutcome]) -> ChatTraceLine | None:
        """The trace line of one call (None when there is no trace); ``persist`` fills in its latency."""
        return chat_line(self.run_id, opts, turn, **call) if self._tracer() is not None else None


async def run_chat(conv: Conversations, opts: ChatOptions, retry: RetryPolicy) -> ChatReply:
    """One non-streaming call: recall (once per turn) -> prompt -> call (with retries) -> citations -> trace."""
    root = root_span(conv.telemetry, opts.conversation_id, stream=False)
    try:
        t0 = time.perf_counter()
        turn, recalled = await conv.turns.stage(opts, t0, root)
        t_recall = time.perf_counter()
        req, block = conv.request(opts, turn)
        t_call = time.perf_counter()
        try:
            attrs = model_attributes(opts.model, opts.sampling)
            with stage(conv.telemetry, f"chat {opts.model.name}", root, **attrs) as span:
                resp = await call_with_retries(lambda: opts.model.complete(req), retry)
                record_response(span, resp)
        except ModelError as exc:
            failed = {"recall": ms(t0, t_recall), "model": ms(t_call), "total": ms(t0)}
            record = conv.call_record(
                opts, turn, recalled=recalled, block=block, stream=False, text="", tool_calls=(),
                finish_reason="error", usage=Usage(), reply=None, error=f"model error: {exc}",
            )  # fmt: skip
            await conv.persist(None, record, lambda: failed)  # no answer waits: the trace line alone
            raise
        model_ms = ms(t_call)

        def latency() -> dict[str, float]:
            total = ms(t0)
            return {
                "recall": ms(t0, t_recall), "model": model_ms, "total": total, "overhead": round(total - model_ms, 3)
            }  # fmt: skip

        with stage(conv.telemetry, "remem.learn", root) as span:
            reply, waiting = read_reply(opts, turn, resp, recalled=recalled)
            record = conv.call_record(
                opts, turn, recalled=recalled, block=block, stream=False, text=resp.text, tool_calls=resp.tool_calls,
                finish_reason=resp.finish_reason, usage=resp.usage, reply=reply, error=None,
            )  # fmt: skip
            await conv.persist(waiting, record, latency)  # the pending answer, then the trace line
            span.set("remem.citations", len(reply.citations))
            span.set("remem.used", len(reply.used))
        return reply
    except BaseException as exc:
        root.fail(exc)
        raise
    finally:
        root.end()


@dataclass(frozen=True, kw_only=True)
class PreparedChat:
    """The recall half of a chat call whose model the caller calls itself (``MemoryAgent.prepare_chat``): send
    ``messages`` (the caller's, with the memory block) to the model, then hand its reply to
    ``MemoryAgent.finish_chat``."""

    messages: tuple[Message, ...]
    answer_id: str
    conversation_id: str
    scope: str
    served: tuple[Hit, ...]
    aliases: Mapping[str, str]
    recalled: bool
    options: ChatOptions = field(repr=False)
    turn: TurnState = field(repr=False)
    block: str | None = field(repr=False)
    started: float = field(repr=False)

    def to_dicts(self) -> list[dict[str, Any]]:
        """``messages`` in the OpenAI shape, for a client that takes plain dicts."""
        return [m.to_dict() for m in self.messages]


async def prepare_chat(conv: Conversations, opts: ChatOptions) -> PreparedChat:
    """Recall (once per turn) and the memory block, without calling the model."""
    t0 = time.perf_counter()
    turn, recalled = await conv.turns.traced(opts, t0)
    req, block = conv.request(opts, turn)
    return PreparedChat(
        messages=req.messages, answer_id=turn.answer_id, conversation_id=opts.conversation_id, scope=opts.scope,
        served=turn.result.items, aliases=dict(turn.aliases), recalled=recalled, options=opts, turn=turn,
        block=block, started=t0,
    )  # fmt: skip


async def finish_chat(conv: Conversations, prepared: PreparedChat, resp: ChatResponse) -> ChatReply:
    """Citations, value use, the waiting answer and the trace line of a reply the caller got itself."""
    opts, turn = prepared.options, prepared.turn
    reply, waiting = read_reply(opts, turn, resp, recalled=prepared.recalled)
    record = conv.call_record(
        opts, turn, recalled=prepared.recalled, block=prepared.block, stream=False, text=resp.text,
        tool_calls=resp.tool_calls, finish_reason=resp.finish_reason, usage=resp.usage, reply=reply, error=None,
    )  # fmt: skip
    await conv.persist(waiting, record, lambda: {"total": ms(prepared.started)})
    return reply
