"""Memory for a conversation the caller owns: ``MemoryAgent.chat``, and the turn state ``chat_stream`` shares.

The caller keeps its system prompt, history, tools and sampling; per call the middleware

1. validates the messages and tools (:mod:`.conversation`), before any model call;
2. recalls once per *user turn*: a call that ends with a user message is a new answer (its own
   ``answer_id``, even when an identical request came before) and runs a search; a call that adds assistant
   tool calls and tool results after that user message (an agent loop) continues its turn and reuses the
   turn's recall and answer id, so every call of the turn shows the same labels and credit goes to the turn
   that served;
3. adds one memory block (placement in :func:`~remem_agent.agent.conversation.inject_memories`);
4. calls the model (streamed or not), extracts inline citations ``[M1]`` and the values of served
   memories that the reply or tool-call arguments repeat;
5. leaves the turn's answer waiting for its outcome, which arrives as an explicit
   ``feedback(answer_id, ...)``, as a correction (a new ``state`` fact superseding a served one), or
   from the next user turn that follows it: a correction ("No, ...") is a failure blamed on the
   memories the answer used; moving on is a weak success; an optional judge model rates the answer.
   Which answer a turn follows: with a ``conversation_id``, that conversation's latest answer; without
   one, the answer whose request and reply are exactly the turn's history
   (:func:`~remem_agent.agent.conversation.transcript_digest`), so two conversations that open alike
   never settle each other's answers;
6. writes one trace line per call and one per outcome (:mod:`.trace`, version 2).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from remem_agent.adapters.base import (
    ChatModel,
    ChatRequest,
    ChatResponse,
    Message,
    ToolCall,
    Usage,
)
from remem_agent.adapters.retry import RetryPolicy, call_with_retries
from remem_agent.agent._spans import model_attributes, ms, record_response, record_search, root_span, stage
from remem_agent.agent.call import Sampling
from remem_agent.agent.capture import FactCapture
from remem_agent.agent.chat_types import ChatArgs, ChatOptions, ChatReply, TurnState
from remem_agent.agent.conversation import (
    conversation_key,
    extract_citations,
    inject_memories,
    latest_user_index,
    parse_messages,
    parse_tool_choice,
    parse_tools,
    recall_query,
    strip_citations,
    tool_arguments,
    transcript_digest,
)
from remem_agent.agent.ports import AgentMemory
from remem_agent.agent.prompt import citation_aliases, is_temporal_question, render_memories
from remem_agent.agent.telemetry import NoTelemetry, Span, Telemetry
from remem_agent.agent.trace import TraceWriter
from remem_agent.agent.verdicts import AnswerContext, Verdicts
from remem_agent.errors import ModelError, UserInputError
from remem_agent.learning.credit import carried_values_used
from remem_agent.outcomes.pending import (
    BlockingAdd,
    PendingStore,
    Thread,
    Waiting,
)
from remem_agent.types import Hit
from remem_agent.validate import check_scope

log = logging.getLogger("remem_agent.agent")

MAX_CONVERSATIONS = 10_000  # turn state kept for this many conversations (least recently used dropped)


class Conversations:
    """Turn state, recall and dialogue outcomes for every conversation one ``MemoryAgent`` serves."""

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
        self.memory, self.model, self.pending = memory, model, pending
        self.verdicts = Verdicts(
            memory=memory,
            pending=pending,
            tracer=tracer,
            run_id=run_id,
            retry=retry,
            telemetry=telemetry or NoTelemetry(),
            answer_of=self._answer_context,
            judge=judge,
            capture=capture is not None,
            capture_corrections=capture_corrections,
        )
        # the ledger's pending store adds in the caller's worker thread (see ``persist``); decided once
        self._add_blocking = pending.add_blocking if isinstance(pending, BlockingAdd) else None
        # (its reads and claims too: a new turn may settle and recall in one hop, ``Verdicts.settle_and_search``)
        self.capture = capture
        self.telemetry: Telemetry = telemetry or NoTelemetry()
        self._tracer, self.run_id, self.retry = tracer, run_id, retry
        self.k, self.token_budget, self.judge = k, token_budget, judge
        self._turns: OrderedDict[str, TurnState] = OrderedDict()  # by slot (scope, conversation, history): LRU
        self._answers: dict[str, TurnState] = {}  # the same turns by answer id (what a judge reads)
        self._locks: dict[str, asyncio.Lock] = {}

    # -- validation -----------------------------------------------------------------------------
    def options(self, messages: object, args: ChatArgs, *, sampling: Sampling, strip: bool) -> ChatOptions:
        """One call's options, validated before anything runs (a ``UserInputError`` names what is wrong)."""
        msgs = parse_messages(messages)
        specs = parse_tools(args.get("tools"))
        choice = parse_tool_choice(args.get("tool_choice"), specs)
        model = args.get("model") or self.model
        if not isinstance(model, ChatModel):
            raise UserInputError("model must implement the ChatModel protocol (name, adapter, capabilities, complete)")
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
        turn = self._answers.get(answer_id)
        if turn is None:
            return None
        return AnswerContext(
            question=turn.question, reply=turn.replies[-1] if turn.replies else "", started=turn.started
        )

    # -- recall once per user turn ----------------------------------------------------------------
    async def begin(self, opts: ChatOptions, parent: Span | None = None) -> tuple[TurnState, bool]:
        """The turn this call belongs to; a new user turn first settles the answer it follows, then recalls."""
        ui = latest_user_index(opts.messages)
        user = opts.messages[ui].content
        key = (ui, hashlib.sha256(user.encode()).hexdigest()[:16])
        # the turn's slot: where it stands (its history up to its user message), in its scope and conversation
        where = transcript_digest(opts.messages[: ui + 1])
        slot = f"{opts.scope}|{opts.conversation_id if opts.threaded else ''}|{where}"
        lock = self._locks.get(slot) or self._locks.setdefault(slot, asyncio.Lock())
        async with lock:  # two calls of one turn never recall or settle it twice
            prev = self._turns.get(slot)
            continuing = ui < len(opts.messages) - 1  # tool calls and results after the user message
            if continuing and prev is not None and prev.key == key:
                self._turns.move_to_end(slot)
                return prev, False
            deferred = None
            follows = self.thread_before(opts, ui)  # the thread whose latest answer this turn follows
            query = recall_query(opts.messages)
            search: dict[str, Any] = {
                "k": opts.k or self.k,
                "task": opts.task,
                "now": opts.now,
                "token_budget": self.token_budget if opts.token_budget is None else opts.token_budget,
                "scope": opts.scope,
            }
            blocking = self.verdicts.blocking() if follows is not None else None
            label = f"{opts.scope}|{opts.conversation_id}"
            if blocking is not None and follows is not None:
                with self.verdicts.memory_span("search_memory", opts.scope, parent) as span:
                    res, settled = await asyncio.to_thread(
                        self.verdicts.settle_and_search, blocking, follows, label, user, _turn_key(key), query, search
                    )
                    span.set("remem.settled", settled)
                    record_search(span, res)
            else:
                if follows is not None:
                    deferred = await self.verdicts.settle_next_turn(
                        follows, label, user, defer_moved_on=self.capture is not None, turn=_turn_key(key),
                        parent=parent,
                    )  # fmt: skip
                with self.verdicts.memory_span("search_memory", opts.scope, parent) as span:
                    res = await self.memory.asearch(query, **search)
                    record_search(span, res)
            turn = TurnState(
                key=key,
                answer_id=f"a_{uuid.uuid4().hex[:16]}",
                result=res,
                aliases=citation_aliases(res.ids),
                query=query,
                user_text="\n".join(m.content for m in opts.messages if m.role == "user"),
                question=user,
            )
            self._turns[slot] = turn
            self._turns.move_to_end(slot)
            self._answers[turn.answer_id] = turn
            if self.capture is not None:  # in the background: the reply never waits for it
                accepted = self.capture.submit(
                    user,
                    conversation_id=opts.conversation_id,
                    answer_id=turn.answer_id,
                    scope=opts.scope,
                    after=deferred,
                )
                if not accepted and deferred is not None:
                    await deferred()
            while len(self._turns) > MAX_CONVERSATIONS:
                old, dropped = self._turns.popitem(last=False)
                self._locks.pop(old, None)
                self._answers.pop(dropped.answer_id, None)
            return turn, True

    @staticmethod
    def thread_before(opts: ChatOptions, ui: int) -> Thread | None:
        """The thread whose newest waiting answer the user turn at ``ui`` follows: the caller's conversation,
        or, without an id, the history before the turn (None at a conversation's opening: nothing came before)."""
        if opts.threaded:
            return ("conv", f"{opts.scope}|{opts.conversation_id}")
        before = opts.messages[:ui]
        if not any(m.role == "assistant" for m in before):
            return None
        return ("after", f"{opts.scope}|{transcript_digest(before)}")

    @staticmethod
    def thread_after(opts: ChatOptions, resp: ChatResponse) -> Thread:
        """The thread a reply's waiting answer is filed under: what the next user turn will look up."""
        if opts.threaded:
            return ("conv", f"{opts.scope}|{opts.conversation_id}")
        reply = Message("assistant", resp.text, resp.tool_calls)
        return ("after", f"{opts.scope}|{transcript_digest((*opts.messages, reply))}")

    async def begin_traced(self, opts: ChatOptions, t0: float, parent: Span | None = None) -> tuple[TurnState, bool]:
        """``begin``, but a failure of recall (a store error, say) still leaves the call's trace line."""
        try:
            return await self.begin(opts, parent)
        except Exception as exc:
            tracer = self._tracer()
            if tracer is not None:
                await tracer.write(
                    {
                        "v": 2, "kind": "chat", "ts": datetime.now(UTC).isoformat(), "run": self.run_id,
                        "answer_id": "", "conversation_id": opts.conversation_id, "scope": opts.scope,
                        "turn": latest_user_index(opts.messages), "task": opts.task,
                        "model": {"adapter": opts.model.adapter, "name": opts.model.name},
                        "search_id": None, "recall_query": None, "recalled": False, "served": [], "aliases": {},
                        "messages": [m.to_dict() for m in opts.messages], "memory_block": None, "tools": [],
                        "stream": False, "reply": {"text": "", "tool_calls": [], "finish_reason": "error"},
                        "citations": [], "error": f"recall failed: {type(exc).__name__}: {exc}",
                        "latency_ms": {"total": ms(t0)},
                    }
                )  # fmt: skip
            raise

    async def recall_stage(self, opts: ChatOptions, t0: float, root: Span) -> tuple[TurnState, bool]:
        """One call's recall as the ``remem.recall`` child span of ``root`` (which then names the answer id)."""
        with stage(self.telemetry, "remem.recall", root) as span:
            turn, recalled = await self.begin_traced(opts, t0, span)
            span.set("remem.recalled", recalled)
            span.set("remem.served", len(turn.result.items))
        root.set("remem.answer_id", turn.answer_id)
        return turn, recalled

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
    def reply_of(
        self, opts: ChatOptions, turn: TurnState, resp: ChatResponse, *, recalled: bool
    ) -> tuple[ChatReply, tuple[Waiting, Thread] | None]:
        """Citations and value use of one reply (the turn's state updated), and the waiting answer it leaves
        (None when nothing was served), for the caller to add to the pending outcomes (:meth:`persist`)."""
        cited, unknown = extract_citations(resp.text, turn.aliases)
        texts = {h.id: h.text for h in turn.result.items}
        said = "\n".join([resp.text, *(json.dumps(a, ensure_ascii=False) for a in tool_arguments(resp.tool_calls))])
        used = sorted(carried_values_used(texts, said, exclude=turn.user_text))
        turn.cited += [c for c in cited if c not in turn.cited]
        turn.used += [u for u in used if u not in turn.used]
        turn.replies.append(resp.text)
        turn.answered = True
        waiting: tuple[Waiting, Thread] | None = None
        if turn.result.items:
            waiting = (
                Waiting(
                    answer_id=turn.answer_id,
                    search_id=turn.result.search_id,
                    served_ids=tuple(turn.result.ids),
                    cited_ids=tuple(turn.cited),
                    value=None,
                    used_ids=tuple(turn.used),
                    scope=opts.scope,
                    turn=_turn_key(turn.key),
                ),
                self.thread_after(opts, resp),
            )
        if unknown:
            log.debug("reply cited labels that were not served: %s", unknown)
        reply = ChatReply(
            text=strip_citations(resp.text) if opts.strip else resp.text,
            raw=resp.text,
            tool_calls=resp.tool_calls,
            finish_reason=resp.finish_reason,
            usage=resp.usage,
            answer_id=turn.answer_id,
            conversation_id=opts.conversation_id,
            scope=opts.scope,
            search_id=turn.result.search_id,
            served=turn.result.items,
            aliases=dict(turn.aliases),
            citations=cited,
            used=tuple(used),
            recalled=recalled,
            abstained=turn.result.abstained,
        )
        return reply, waiting

    async def persist(
        self,
        waiting: tuple[Waiting, Thread] | None,
        record: dict[str, Any] | None,
        latency: Callable[[], Mapping[str, float]],
    ) -> None:
        """The waiting answer joins the pending outcomes, then the call's trace line is written with
        ``latency()`` taken once the answer is waiting.

        Both are blocking work; when the pending store can add without its own hop (the ledger's,
        :class:`~remem_agent.outcomes.pending.BlockingAdd`) they run in ONE worker-thread call instead of two.
        """
        tracer = self._tracer() if record is not None else None
        add = self._add_blocking
        if waiting is not None and add is not None:

            def work() -> None:
                add(*waiting)
                if tracer is not None and record is not None:
                    record["latency_ms"] = dict(latency())
                    tracer.write_sync(record)

            await asyncio.to_thread(work)
            return
        if waiting is not None:
            await self.pending.add(*waiting)
        if tracer is not None and record is not None:
            record["latency_ms"] = dict(latency())
            await tracer.write(record)

    # -- traces -----------------------------------------------------------------------------------
    def call_record(
        self,
        opts: ChatOptions,
        turn: TurnState,
        *,
        recalled: bool,
        block: str | None,
        stream: bool,
        text: str,
        tool_calls: Sequence[ToolCall],
        finish_reason: str | None,
        usage: Usage,
        reply: ChatReply | None,
        error: str | None,
    ) -> dict[str, Any] | None:
        """The trace line of one call (None when there is no trace); ``persist`` fills in its latency."""
        if self._tracer() is None:
            return None
        return {
            "v": 2,
            "kind": "chat",
            "ts": datetime.now(UTC).isoformat(),
            "run": self.run_id,
            "answer_id": turn.answer_id,
            "conversation_id": opts.conversation_id,
            "scope": opts.scope,
            "turn": turn.key[0],
            "task": opts.task,
            "model": {"adapter": opts.model.adapter, "name": opts.model.name, "params": opts.sampling.to_dict()},
            "search_id": turn.result.search_id,
            "recall_query": turn.query if recalled else None,
            "recalled": recalled,
            "abstained": turn.result.abstained,
            "served": [
                {"id": h.id, "rank": h.rank, "score": round(h.score, 6), "state": h.state.value, "text": h.text}
                for h in turn.result.items
            ],
            "aliases": dict(turn.aliases),
            "messages": [m.to_dict() for m in opts.messages],
            "memory_block": block,
            "tools": [t.name for t in opts.tools],
            "stream": stream,
            "reply": {
                "text": text,
                "tool_calls": [c.to_dict() for c in tool_calls],
                "finish_reason": finish_reason,
                "usage": usage.to_dict(),
            },
            "citations": list(reply.citations) if reply else [],
            "unknown_citations": list(extract_citations(text, turn.aliases)[1]),
            "used": list(reply.used) if reply else [],
            "error": error,
            "latency_ms": {},
        }


def _turn_key(key: tuple[int, str]) -> str:
    """A turn's key (index of its user message, hash of its text) as the pending store keeps it."""
    return f"{key[0]}:{key[1]}"


async def run_chat(conv: Conversations, opts: ChatOptions, retry: RetryPolicy) -> ChatReply:
    """One non-streaming call: recall (once per turn) -> prompt -> call (with retries) -> citations -> trace."""
    root = root_span(conv.telemetry, opts.conversation_id, stream=False)
    try:
        t0 = time.perf_counter()
        turn, recalled = await conv.recall_stage(opts, t0, root)
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
            reply, waiting = conv.reply_of(opts, turn, resp, recalled=recalled)
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
    turn, recalled = await conv.begin_traced(opts, t0)
    req, block = conv.request(opts, turn)
    return PreparedChat(
        messages=req.messages, answer_id=turn.answer_id, conversation_id=opts.conversation_id, scope=opts.scope,
        served=turn.result.items, aliases=dict(turn.aliases), recalled=recalled, options=opts, turn=turn,
        block=block, started=t0,
    )  # fmt: skip


async def finish_chat(conv: Conversations, prepared: PreparedChat, resp: ChatResponse) -> ChatReply:
    """Citations, value use, the waiting answer and the trace line of a reply the caller got itself."""
    opts, turn = prepared.options, prepared.turn
    reply, waiting = conv.reply_of(opts, turn, resp, recalled=prepared.recalled)
    record = conv.call_record(
        opts, turn, recalled=prepared.recalled, block=prepared.block, stream=False, text=resp.text,
        tool_calls=resp.tool_calls, finish_reason=resp.finish_reason, usage=resp.usage, reply=reply, error=None,
    )  # fmt: skip
    await conv.persist(waiting, record, lambda: {"total": ms(prepared.started)})
    return reply
