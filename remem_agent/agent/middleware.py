"""``MemoryAgent``: async middleware that wraps any chat model with an outcome-learning memory.

Per ``ask``, one stage per module: recall (``ReMem.asearch``) -> prompt (:mod:`.prompt`) -> call and
enforce (:mod:`.call`, :mod:`.enforce`) -> score (:mod:`.scoring`) -> learn (``afeedback`` now, or later
through :mod:`.outcomes`) -> trace (:mod:`.trace`). The model sees and cites short per-ask aliases (``M1``,
``M2``, ... in rank order; see ``prompt.citation_aliases``); they are mapped back to memory ids right after
enforcement, so credit, ``Answer.citations`` and the trace's ``citations`` hold real memory ids.

Composition only: the wrapped model is any :class:`~remem_agent.adapters.base.ChatModel` and the memory
any :class:`~remem_agent.agent.ports.AgentMemory`; nothing of a vendor SDK is patched. Blocking work
(embedding, the ledger, trace writes) runs on worker threads; concurrent asks are bounded by a
semaphore, and each ask learns only through its own ``search_id`` so credit never crosses between calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Unpack, cast

from remem_agent._time import Timestamp
from remem_agent.adapters.base import ChatModel, ChatResponse, Message, check_chat_model
from remem_agent.adapters.retry import RetryPolicy
from remem_agent.agent.ask import Answer, AskRequest, AskState, fallback_trace, run_ask, write
from remem_agent.agent.call import Sampling
from remem_agent.agent.capture import AsyncFactExtractor, FactCapture
from remem_agent.agent.chat import (
    Conversations,
    PreparedChat,
    finish_chat,
    prepare_chat,
    run_chat,
)
from remem_agent.agent.chat_types import ChatArgs, ChatOptions, ChatReply, RecallArgs
from remem_agent.agent.ports import AgentMemory
from remem_agent.agent.prompt import check_answer_schema
from remem_agent.agent.scoring import Scorer, exact_match
from remem_agent.agent.stream import ChatStream, stream_chat
from remem_agent.agent.telemetry import Telemetry, memory_operation
from remem_agent.agent.trace import HasSecrets, TraceWriter
from remem_agent.errors import AnswerExpiredError, UnknownSearchError, UserInputError
from remem_agent.outcomes import rules
from remem_agent.outcomes.pending import PendingOutcomes, PendingStore
from remem_agent.outcomes.rules import WEAK_SUCCESS_WEIGHT, Verdict
from remem_agent.types import FeedbackReceipt, Role
from remem_agent.validate import check_scope, check_text

log = logging.getLogger("remem_agent.agent")

__all__ = ["WEAK_SUCCESS_WEIGHT", "Answer", "ChatReply", "ChatStream", "MemoryAgent", "default_trace_path"]


def make_tracer(
    trace: str | Path | TraceWriter | Literal[False] | None,
    memory: AgentMemory,
    run_id: str,
    *,
    secrets_of: Sequence[object] = (),
) -> TraceWriter | None:
    """The trace writer ``MemoryAgent(trace=...)`` asks for (see its docstring), redacting the credentials of
    ``secrets_of`` (the models) by value, whatever their shape."""
    if trace is False:
        return None
    if isinstance(trace, TraceWriter):
        tracer = trace
    else:
        path = Path(trace) if trace is not None else default_trace_path(memory, run_id)
        if path is None:
            return None
        tracer = TraceWriter(path)
    for m in secrets_of:
        if isinstance(m, HasSecrets):
            tracer.add_secrets(m.secrets)
    return tracer


def default_trace_path(memory: AgentMemory, run_id: str) -> Path | None:
    """Where traces go when the caller names no path: ``<store folder>/traces/<run_id>.jsonl``.

    A library should not write into the caller's working directory unasked; the store folder is where
    the caller already chose to keep this memory's data. A store with no folder (a PostgreSQL URL)
    gets no trace unless a path is given.
    """
    folder = memory.path
    return folder / "traces" / f"{run_id}.jsonl" if isinstance(folder, Path) else None


class MemoryAgent:
    """Wrap a chat model so that it recalls, answers with citations, and learns from outcomes.

    >>> agent = MemoryAgent(ReMem("mem"), OpenAIChat("gpt-4o-mini"))
    >>> ans = await agent.ask("Where is our server?", task="ops", truth={"answer": "west-2"})

    ``trace``: a path, a ``TraceWriter``, ``False`` (off) or ``None`` (:func:`default_trace_path`).

    ``judge`` (off by default): a chat model that rates a conversation's previous answer from the
    next user turn (schema-enforced); its verdict replaces the next-turn heuristic when it is sure.
    ``temperature``, ``max_tokens``, ``seed``: the sampling every call uses unless it passes its own; None
    sends none of that field, so the model's own default applies (the gateway passes exactly what its
    client sent this way).
    ``strip_citations``: remove inline ``[M1]`` labels from chat replies (``ChatReply.raw`` keeps them).
    ``telemetry``: e.g. ``OpenTelemetrySpans()`` to send each chat turn as GenAI spans (default: none).
    ``capture`` (off by default): an extractor (e.g. ``LLMFactExtractor(model)``) that turns each new
    user turn of ``chat`` into memories in the background (:mod:`.capture`; at most ``capture_queue``
    turns wait, more are dropped and counted). Close the agent (``aclose`` / ``async with``) to stop it.
    ``pending``: where answers wait for their outcome; default this process's memory. Pass
    ``remem_agent.outcomes.ledger.LedgerPendingOutcomes(mem.store)`` when several processes serve one
    store, so an answer given by one is settled by whichever sees its outcome (:mod:`.outcomes`). Either takes
    ``ttl_s``: an answer with no verdict after that long expires (no outcome; feedback raises
    ``AnswerExpiredError``).
    ``capture_corrections`` (off by default): a user turn that corrects the previous answer with a value ("No,
    it's Lisbon") also stores that value as the fact replacing the one the answer cited, in the answer's scope
    and only for a fact it relied on (:mod:`.corrections` says what it trusts).
    """

    def __init__(
        self,
        memory: AgentMemory,
        model: ChatModel,
        *,
        k: int = 5,
        token_budget: int | None = None,
        max_reasks: int = 2,
        retry: RetryPolicy | None = None,
        trace: str | Path | TraceWriter | Literal[False] | None = None,
        run_id: str | None = None,
        system: str | None = None,
        max_concurrency: int = 4,
        scorer: Scorer = exact_match,
        success_threshold: float = 1.0,
        on_invalid: Literal["raise", "return"] = "raise",
        temperature: float | None = 0.0,
        max_tokens: int | None = 512,
        seed: int | None = 0,
        system_prompt: str | None = None,
        infer_outcomes: bool = True,
        judge: ChatModel | None = None,
        strip_citations: bool = False,
        telemetry: Telemetry | None = None,
        capture: AsyncFactExtractor | None = None,
        capture_queue: int = 64,
        pending: PendingStore | None = None,
        capture_corrections: bool = False,
    ) -> None:
        check_chat_model(model)
        if max_reasks < 0 or max_concurrency < 1:
            raise UserInputError("max_reasks must be >= 0 and max_concurrency >= 1")
        self.memory, self.model, self.k, self.token_budget = memory, model, k, token_budget
        self.max_reasks, self.retry = max_reasks, retry or RetryPolicy()
        self.run_id = run_id or datetime.now(UTC).strftime("run-%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
        self.system, self.scorer, self.success_threshold, self.on_invalid = (
            system,
            scorer,
            success_threshold,
            on_invalid,
        )
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.system_prompt = system_prompt
        self.infer_outcomes = infer_outcomes
        if judge is not None:
            check_chat_model(judge, "judge")
        self.tracer: TraceWriter | None = make_tracer(trace, memory, self.run_id, secrets_of=(model, judge))
        self.strip_citations = strip_citations
        self._sem = asyncio.Semaphore(max_concurrency)
        # Threads of waiting answers: ("task", task class) for ask; for chat the conversation id, or without one
        # the history an answer leaves (``Conversations.thread_after``).
        self._pending: PendingStore = pending if pending is not None else PendingOutcomes()
        self.capture = (
            FactCapture(
                capture,
                memory,
                queue_size=capture_queue,
                on_added=self._infer_corrections,
                tracer=lambda: self.tracer,
                run_id=self.run_id,
            )
            if capture is not None
            else None
        )
        self._conversations = Conversations(
            memory=memory,
            model=model,
            pending=self._pending,
            tracer=lambda: self.tracer,
            run_id=self.run_id,
            retry=self.retry,
            k=k,
            token_budget=token_budget,
            judge=judge,
            telemetry=telemetry,
            capture=self.capture,
            capture_corrections=capture_corrections,
        )

    async def aclose(self) -> None:
        """Stop background work (fact capture); the memory and the model stay the caller's to close."""
        if self.capture is not None:
            await self.capture.aclose()

    async def __aenter__(self) -> MemoryAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- conversations ----------------------------------------------------------------------------
    async def chat(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        **kwargs: Unpack[ChatArgs],
    ) -> ChatReply:
        """Answer the caller's conversation with memory; see :mod:`remem_agent.agent.chat` for the rules.

        ``messages`` are OpenAI-style (system / user / assistant with ``tool_calls`` / tool with
        ``tool_call_id``); they are passed on unchanged apart from one added memory block. Bad input is
        a ``UserInputError`` before any model call. Every new user turn gets its own ``answer_id``. With a
        ``conversation_id``, a new turn settles that conversation's latest answer; without one, the answer
        whose request and reply are exactly the turn's history (the reply's text must come back, citation
        labels and blanks aside), and the reply's ``conversation_id`` is a label hashed from the opening
        messages. ``scope`` (default "default") is whose memory
        this is: recall reads only that scope, and only a caller of that scope can judge the answer.

        The keyword arguments are :class:`~remem_agent.agent.chat_types.ChatArgs`: the recall's (``tools``,
        ``tool_choice``, ``conversation_id``, ``scope``, ``task``, ``k``, ``now``, ``token_budget``), the call's
        (``temperature``, ``max_tokens``, ``strip_citations``, provider ``extra`` fields) and, per call, the
        ``model`` to ask instead of the agent's and a ``json_schema`` (with ``schema_name``) for the model's
        native structured output.
        """
        opts = self._chat_options(messages, kwargs)
        async with self._sem:
            return await run_chat(self._conversations, opts, self.retry)

    def chat_stream(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        **kwargs: Unpack[ChatArgs],
    ) -> ChatStream:
        """Like :meth:`chat`, streamed: ``async for chunk in agent.chat_stream(...)`` (see :class:`ChatStream`).

        Input is validated here, before anything runs; a bad conversation raises ``UserInputError`` at once.
        """
        opts = self._chat_options(messages, kwargs)
        conv, retry, sem = self._conversations, self.retry, self._sem
        return ChatStream(lambda s: stream_chat(conv, opts, retry, s, lambda: sem))

    async def prepare_chat(
        self,
        messages: object,
        **kwargs: Unpack[RecallArgs],
    ) -> PreparedChat:
        """The recall half of ``chat`` for a caller that calls its model itself (a LiteLLM callback, say):
        validated messages with the memory block added (``prepared.messages``), recalled once per user turn
        exactly as ``chat`` does. Call the model with them, then :meth:`finish_chat` with its reply."""
        opts = self._chat_options(messages, kwargs, allowed=RecallArgs)
        async with self._sem:
            return await prepare_chat(self._conversations, opts)

    async def finish_chat(self, prepared: PreparedChat, response: ChatResponse) -> ChatReply:
        """The learning half of ``chat``: the reply's citations and value use, its waiting answer (for an outcome
        from ``feedback``, the next turn or a correcting fact) and its trace line."""
        if not isinstance(prepared, PreparedChat) or not isinstance(response, ChatResponse):
            raise UserInputError("finish_chat takes the PreparedChat of prepare_chat and a ChatResponse")
        return await finish_chat(self._conversations, prepared, response)

    def _chat_options(self, messages: object, kwargs: Mapping[str, Any], *, allowed: type = ChatArgs) -> ChatOptions:
        """The validated options of one call: ``kwargs`` as :class:`ChatArgs` names them, the agent's defaults
        filled in (sampling, citation stripping, the model)."""
        known: frozenset[str] = allowed.__required_keys__ | allowed.__optional_keys__  # type: ignore[attr-defined]
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
        args = cast(ChatArgs, kwargs)
        temperature, max_tokens = args.get("temperature"), args.get("max_tokens")
        sampling = Sampling(
            temperature=self.sampling.temperature if temperature is None else temperature,
            max_tokens=self.sampling.max_tokens if max_tokens is None else max_tokens,
            seed=self.sampling.seed,
        )
        strip = args.get("strip_citations")
        return self._conversations.options(
            messages, args, sampling=sampling, strip=self.strip_citations if strip is None else strip
        )

    # -- the loop -------------------------------------------------------------------------------
    async def ask(
        self,
        question: str,
        *,
        task: str | None = None,
        schema: Mapping[str, Any] | None = None,
        truth: Any = None,
        as_of: Timestamp | None = None,
        now: Timestamp | None = None,
        k: int | None = None,
        token_budget: int | None = None,
        task_id: str | None = None,
        scope: str | None = None,
    ) -> Answer:
        """Recall, answer in ``schema`` (default ``{"answer": string}``) with citations, score against ``truth``
        (or wait for a verdict: :meth:`feedback`, the next ask, a correcting fact), learn and trace
        (:mod:`.ask`)."""
        question = check_text(question, "question")
        scope = check_scope(scope)
        base_schema = check_answer_schema(schema)
        req = AskRequest(
            question=question,
            task=task,
            schema=base_schema,
            truth=truth,
            as_of=as_of,
            now=now,
            k=k,
            token_budget=token_budget,
            task_id=task_id,
            scope=scope,
        )
        async with self._sem:
            st = AskState(t0=time.perf_counter(), answer_id=f"a_{uuid.uuid4().hex[:16]}", schema=req.schema)
            try:
                if self.infer_outcomes:
                    await self._infer_moved_on(req.thread)
                return await run_ask(self, st, req)
            except Exception as exc:  # whatever raised, the ask leaves its trace line (then the error goes on)
                if not st.traced:
                    await write(self, st, fallback_trace(self, st, req, exc))
                raise

    # -- outcomes that arrive later -------------------------------------------------------------
    async def feedback(
        self,
        answer_id: str,
        *,
        success: bool,
        used_ids: Sequence[str] | None = None,
        reason: str | None = None,
        scope: str | None = None,
    ) -> FeedbackReceipt:
        """An explicit user signal (thumbs up/down) for an earlier answer of ``ask`` or ``chat`` (source "user").

        ``reason`` is kept in the trace's outcome line. An answer gets one verdict: repeating the same call
        returns the first receipt with ``repeated=True`` and counts nothing twice; a different verdict (another
        ``success`` or ``used_ids``, or one after the verdict was inferred) raises ``FeedbackConflictError``.
        An answer id never given, or given in another scope than ``scope``, raises ``UnknownSearchError``; one
        that waited past its pending store's TTL raises ``AnswerExpiredError`` (a subclass).
        """
        if not isinstance(success, bool):
            raise UserInputError("success must be True or False")
        if reason is not None:
            reason = check_text(reason, "reason")
        scope = None if scope is None else check_scope(scope)
        if not isinstance(answer_id, str):
            raise UnknownSearchError(str(answer_id), field="answer_id")
        item = await self._pending.take(answer_id, scope=scope)
        verdict = Verdict(success=success, source="user", weight=1.0, reason=reason or "")
        if item is None:  # judged already: the same verdict again is idempotent, another one a conflict
            judged = await self._pending.judged(answer_id, scope=scope)
            if judged is None:
                if await self._pending.expired(answer_id, scope=scope):
                    raise AnswerExpiredError(answer_id)
                raise UnknownSearchError(answer_id, field="answer_id")
            return await self.memory.afeedback(
                judged.search_id,
                success=success,
                used_ids=sorted({*judged.used_ids, *(used_ids or ())}),
                cited_ids=list(judged.cited_ids),
                answer=judged.value,
                weight=verdict.weight,
                source=verdict.source,
            )
        used = sorted({*item.used_ids, *(used_ids or ())})
        return await self._conversations.verdicts.record(item, verdict, used_ids=used, answer=item.value)

    async def remember(
        self,
        text: str,
        *,
        entity: str | None = None,
        attribute: str | None = None,
        role: Role = "state",
        task: str | None = None,
        timestamp: Timestamp | None = None,
        scope: str | None = None,
    ) -> str:
        """Add a memory; if it corrects a ``state`` memory served to a pending answer, that answer failed."""
        name, attrs = memory_operation("update_memory", scope)
        span = self._conversations.telemetry.start(name, attrs)
        try:
            new_id = await self.memory.aadd(
                text, entity=entity, attribute=attribute, role=role, task=task, timestamp=timestamp, scope=scope
            )
            span.set("gen_ai.memory.id", new_id)
        except BaseException as exc:
            span.fail(exc)
            raise
        finally:
            span.end()
        if self.infer_outcomes and role == "state" and entity and attribute:
            await self._infer_correction(new_id)
        return new_id

    async def _infer_corrections(self, new_ids: list[str]) -> None:
        for new_id in new_ids:
            await self._infer_correction(new_id)

    async def _infer_correction(self, new_id: str) -> None:
        info = await self.memory.ainspect(new_id)
        if not info.supersedes:
            return
        for item, blamed in await self._pending.take_relying_on(info.supersedes):
            log.debug("inferred failure of %s: corrected %s", item.answer_id, blamed)
            await self._conversations.verdicts.record(item, rules.corrected(blamed, by=new_id), used_ids=blamed)

    async def _infer_moved_on(self, thread: tuple[str, str | None]) -> None:
        """A new ask in the same task with no correction since: the previous answer was a weak success."""
        item = await self._pending.take_latest(thread)
        if item is None:
            return
        await self._conversations.verdicts.record(item, rules.moved_on(), answer=item.value)
