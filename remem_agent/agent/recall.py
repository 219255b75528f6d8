"""Recall once per user turn: which turn a chat call belongs to, the answer that turn follows, and its search.

A call that ends with a user message opens a new turn (its own ``answer_id``): the answer the turn follows is
settled first (:mod:`.verdicts`; the thread it follows is :func:`thread_before`), then the memory is searched
with the recall query (:func:`~remem_agent.agent.conversation.recall_query`). A call that adds assistant tool
calls and tool results after that user message (an agent loop) continues its turn and reuses its recall, so
every call of the turn shows the same labels and credit goes to the turn that served. :class:`Turns` keeps the
turns of every conversation (least recently used dropped past :data:`MAX_CONVERSATIONS`), one lock per turn so
two calls of one turn never recall or settle it twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from remem_agent.agent._spans import ms, record_search, stage
from remem_agent.agent.capture import FactCapture
from remem_agent.agent.chat_trace import failed_recall_line
from remem_agent.agent.chat_types import ChatOptions, TurnState
from remem_agent.agent.conversation import latest_user_index, recall_query, transcript_digest
from remem_agent.agent.learn import turn_key
from remem_agent.agent.ports import AgentMemory
from remem_agent.agent.prompt import citation_aliases
from remem_agent.agent.telemetry import Span, Telemetry
from remem_agent.agent.trace import TraceWriter
from remem_agent.agent.verdicts import Verdicts
from remem_agent.outcomes.pending import Thread

MAX_CONVERSATIONS = 10_000  # turn state kept for this many conversations (least recently used dropped)


def thread_before(opts: ChatOptions, ui: int) -> Thread | None:
    """The thread whose newest waiting answer the user turn at ``ui`` follows: the caller's conversation,
    or, without an id, the history before the turn (None at a conversation's opening: nothing came before)."""
    if opts.threaded:
        return ("conv", f"{opts.scope}|{opts.conversation_id}")
    before = opts.messages[:ui]
    if not any(m.role == "assistant" for m in before):
        return None
    return ("after", f"{opts.scope}|{transcript_digest(before)}")


class Turns:
    """The user turns of the conversations one agent serves, each recalled once."""

    def __init__(
        self,
        *,
        memory: AgentMemory,
        verdicts: Verdicts,
        capture: FactCapture | None,
        k: int,
        token_budget: int | None,
        telemetry: Telemetry,
        tracer: Callable[[], TraceWriter | None],
        run_id: str,
    ) -> None:
        self.memory, self.verdicts, self.capture = memory, verdicts, capture
        self.k, self.token_budget, self.telemetry = k, token_budget, telemetry
        self._tracer, self.run_id = tracer, run_id
        self._turns: OrderedDict[str, TurnState] = OrderedDict()  # by slot (scope, conversation, history): LRU
        self._answers: dict[str, TurnState] = {}  # the same turns by answer id (what a judge reads)
        self._locks: dict[str, asyncio.Lock] = {}

    def by_answer(self, answer_id: str) -> TurnState | None:
        """The turn that gave ``answer_id`` in this process (None for another process's answer)."""
        return self._answers.get(answer_id)

    async def stage(self, opts: ChatOptions, t0: float, root: Span) -> tuple[TurnState, bool]:
        """One call's recall as the ``remem.recall`` child span of ``root`` (which then names the answer id)."""
        with stage(self.telemetry, "remem.recall", root) as span:
            turn, recalled = await self.traced(opts, t0, span)
            span.set("remem.recalled", recalled)
            span.set("remem.served", len(turn.result.items))
        root.set("remem.answer_id", turn.answer_id)
        return turn, recalled

    async def traced(self, opts: ChatOptions, t0: float, parent: Span | None = None) -> tuple[TurnState, bool]:
        """:meth:`begin`, but a failure of recall (a store error, say) still leaves the call's trace line."""
        try:
            return await self.begin(opts, parent)
        except Exception as exc:
            tracer = self._tracer()
            if tracer is not None:
                await tracer.write(failed_recall_line(self.run_id, opts, exc, ms(t0)).to_dict())
            raise

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
            turn, deferred = await self._recall(opts, ui, user, key, parent)
            self._turns[slot] = turn
            self._turns.move_to_end(slot)
            self._answers[turn.answer_id] = turn
            if self.capture is not None:  # in the background: the reply never waits for it
                accepted = self.capture.submit(
                    user, conversation_id=opts.conversation_id, answer_id=turn.answer_id, scope=opts.scope,
                    after=deferred,
                )  # fmt: skip
                if not accepted and deferred is not None:
                    await deferred()
            while len(self._turns) > MAX_CONVERSATIONS:
                old, dropped = self._turns.popitem(last=False)
                self._locks.pop(old, None)
                self._answers.pop(dropped.answer_id, None)
            return turn, True

    async def _recall(
        self, opts: ChatOptions, ui: int, user: str, key: tuple[int, str], parent: Span | None
    ) -> tuple[TurnState, Callable[[], Awaitable[None]] | None]:
        """A new turn: settle the answer it follows, then search. Also returns the "moved on" verdict deferred
        until fact capture has read the user's message (None when nothing was deferred)."""
        deferred = None
        follows = thread_before(opts, ui)  # the thread whose latest answer this turn follows
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
                    self.verdicts.settle_and_search, blocking, follows, label, user, turn_key(key), query, search
                )
                span.set("remem.settled", settled)
                record_search(span, res)
        else:
            if follows is not None:
                deferred = await self.verdicts.settle_next_turn(
                    follows, label, user, defer_moved_on=self.capture is not None, turn=turn_key(key), parent=parent
                )
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
        return turn, deferred
