"""Verdicts on the answers a conversation leaves waiting, learned once each and traced.

A chat answer waits (:mod:`.outcomes`) until a verdict reaches it: the next user turn of its conversation (a
correction reads as a failure, moving on as a weak success, or an optional judge model decides), an explicit
``feedback`` call, or a new fact that supersedes what the answer used. Every verdict takes one path
(:meth:`Verdicts.record`): the waiting answer is claimed, the memory learns, the outcome's trace line is written;
if the ledger refuses the feedback the claim is released and nothing is traced.

When nothing asynchronous sits between the steps (a shared ledger-backed pending store, no judge, no fact
capture, and a memory whose async calls are its own blocking ones in a worker thread), a new turn settles the
previous answer and recalls in one worker-thread hop (:meth:`Verdicts.settle_and_search`), in the same order as
the long way.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from remem_agent.adapters.base import ChatModel, ChatRequest, Message
from remem_agent.adapters.retry import RetryPolicy, call_with_retries
from remem_agent.agent import corrections
from remem_agent.agent._spans import stage
from remem_agent.agent.conversation import looks_like_correction
from remem_agent.agent.ports import AgentMemory, BlockingMemory
from remem_agent.agent.telemetry import Span, Telemetry, memory_operation
from remem_agent.agent.trace import TraceWriter
from remem_agent.errors import ModelError, RememError, UnknownMemoryError
from remem_agent.outcomes import rules
from remem_agent.outcomes.pending import BlockingClaims, PendingStore, Thread, Waiting
from remem_agent.outcomes.rules import Verdict
from remem_agent.types import FeedbackReceipt, SearchResult

log = logging.getLogger("remem_agent.agent")


@dataclass(frozen=True, kw_only=True)
class AnswerContext:
    """What this process remembers of an answer it gave: what a judge reads, and when it was given."""

    question: str
    reply: str
    started: float


JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["helpful", "wrong", "unclear"]},
        "reason": {"type": "string", "maxLength": 200},
    },
    "required": ["verdict", "reason"],
    "additionalProperties": False,
}

JUDGE_PROMPT = """You rate an assistant's answer from the user's next message.
Reply with ONE JSON object: {"verdict": "helpful" | "wrong" | "unclear", "reason": short text}.
"wrong": the next message corrects the answer or says it was wrong or outdated. "helpful": the user
accepts it or moves on. "unclear": you cannot tell."""


_OVERRIDABLE = frozenset({"search", "feedback", "asearch", "afeedback"})


@functools.cache
def _blocking_class(cls: type) -> bool:
    """True when ``cls`` has blocking ``search``/``feedback`` and its ``asearch``/``afeedback`` come from the
    class that defines those (``ReMem``'s: its blocking twin in a worker thread), not from an override."""

    def owner(name: str) -> type | None:
        return next((k for k in cls.__mro__ if name in vars(k)), None)

    if not issubclass(cls, BlockingMemory):
        return False
    pairs = (("asearch", "search"), ("afeedback", "feedback"))
    return all(owner(a) is not None and owner(a) is owner(s) for a, s in pairs)


class Verdicts:
    """The verdicts of one ``MemoryAgent``'s conversations: judged, learned once, traced."""

    def __init__(
        self,
        *,
        memory: AgentMemory,
        pending: PendingStore,
        tracer: Callable[[], TraceWriter | None],
        run_id: str,
        retry: RetryPolicy,
        telemetry: Telemetry,
        answer_of: Callable[[str], AnswerContext | None],
        judge: ChatModel | None,
        capture: bool,
        capture_corrections: bool = False,
    ) -> None:
        self.memory, self.pending, self._tracer, self.run_id = memory, pending, tracer, run_id
        self.retry, self.telemetry, self._answer_of = retry, telemetry, answer_of
        self.judge, self._capture, self.capture_corrections = judge, capture, capture_corrections
        # the ledger's pending store reads and claims in the caller's worker thread: see settle_and_search
        self._claims = pending if isinstance(pending, BlockingClaims) and pending.shared else None

    def memory_span(
        self, operation: str, scope: str | None, parent: Span | None
    ) -> contextlib.AbstractContextManager[Span]:
        name, attrs = memory_operation(operation, scope)
        return stage(self.telemetry, name, parent, **attrs)

    # -- the next user turn --------------------------------------------------------------------------------
    async def settle_next_turn(
        self,
        thread: Thread,
        cid: str,
        next_user: str,
        *,
        defer_moved_on: bool = False,
        turn: str = "",
        parent: Span | None = None,
    ) -> Callable[[], Awaitable[None]] | None:
        """The next user turn arrived: judge the answer it follows, ``thread``'s newest (unless a verdict came).

        With ``defer_moved_on`` (fact capture is on) a "moved on" verdict is not given now but returned
        as a callable for the capture worker to run once it has read this turn: a fact the user stated in
        it may supersede what the answer used, which makes the answer a failure instead.
        """
        # whichever process gave it; none when it was judged already or belongs to this very turn (a retry)
        latest = await self.pending.latest(thread)
        if latest is None or latest.turn == turn:
            return None
        answer_id = latest.answer_id
        own = self._answer_of(answer_id)  # what the judge reads, when this process gave the answer
        correction = looks_like_correction(next_user)
        rule = rules.next_turn(correction)
        judged = await self._judge(own, next_user) if self.judge is not None and own is not None else None
        verdict = judged if judged is not None and judged.success is not None else rule
        judge = judged.to_dict() if judged else None

        async def settle() -> None:
            await self._settle(
                answer_id, own, cid, verdict, heuristic=rule.to_dict(), judge=judge, parent=parent, next_user=next_user
            )

        if defer_moved_on and verdict is rule and not correction:
            return settle
        await settle()
        return None

    def blocking(self) -> BlockingMemory | None:
        """The memory, when a new turn may settle and recall in one hop (:meth:`settle_and_search`): the pending
        store is shared and claims blocking, no judge, no fact capture, and the memory's ``asearch``/``afeedback``
        are its own blocking ``search``/``feedback`` in a worker thread (none overridden on its class or the
        instance: a subclass that changes ``asearch``, say, keeps its ``asearch``)."""
        if self._claims is None or self.judge is not None or self._capture or self.capture_corrections:
            return None
        memory = self.memory
        if not _blocking_class(type(memory)) or not _OVERRIDABLE.isdisjoint(getattr(memory, "__dict__", ())):
            return None
        return cast(BlockingMemory, memory)  # _blocking_class checked it (an isinstance here costs ~20 us)

    def settle_and_search(
        self,
        memory: BlockingMemory,
        thread: Thread,
        cid: str,
        next_user: str,
        turn: str,
        query: str,
        search: Mapping[str, Any],
    ) -> tuple[SearchResult, str | None]:
        """In a worker thread: what :meth:`settle_next_turn` then ``memory.asearch`` do, for a shared pending store
        with no judge and no fact capture (the only case a new turn sends here), blocking, in the same order: the
        conversation's newest waiting answer, its claim, its feedback (a refused one releases the claim and
        raises, before any recall), its outcome line, then the recall of this turn. Returns the recall and the
        answer it settled (None if none)."""
        claims = self._claims
        assert claims is not None and self.judge is None and not self._capture
        latest = claims.latest_blocking(thread)
        settled = None
        if latest is not None and latest.turn != turn:
            own = self._answer_of(latest.answer_id)
            verdict = rules.next_turn(looks_like_correction(next_user))
            item = claims.take_blocking(latest.answer_id)
            if item is not None:  # else already judged (explicit feedback, a correction by a new fact)
                try:
                    receipt = memory.feedback(
                        item.search_id,
                        success=verdict.success is True,
                        used_ids=list(item.used_ids),
                        cited_ids=list(item.cited_ids),
                        answer=None,
                        weight=verdict.weight,
                        source=verdict.source,
                    )
                except BaseException:
                    claims.release_blocking(item)
                    raise
                settled = item.answer_id
                tracer = self._tracer()
                if tracer is not None:
                    tracer.write_sync(
                        self.outcome_record(
                            item,
                            cid.split("|", 1)[-1],
                            verdict,
                            receipt,
                            started=own.started if own is not None else None,
                            heuristic=verdict.to_dict(),
                            judge=None,
                        )
                    )
        return memory.search(query, **search), settled

    async def _settle(
        self,
        answer_id: str,
        own: AnswerContext | None,
        cid: str,
        verdict: Verdict,
        *,
        heuristic: Mapping[str, Any] | None,
        judge: Mapping[str, Any] | None,
        parent: Span | None = None,
        next_user: str | None = None,
    ) -> None:
        item = await self.pending.take(answer_id)
        if item is None:  # already judged (explicit feedback, a correction by a new fact)
            return
        await self.record(
            item,
            verdict,
            used_ids=item.used_ids,
            conversation=cid.split("|", 1)[-1],
            started=own.started if own is not None else None,
            heuristic=heuristic,
            judge=judge,
            parent=parent,
        )
        if self.capture_corrections and next_user is not None and verdict.success is False:
            await self.keep_correction(item, next_user, parent)

    async def keep_correction(self, item: Waiting, turn: str, parent: Span | None = None) -> str | None:
        """Store what the correcting ``turn`` says as the fact replacing the one ``item`` relied on
        (:mod:`.corrections` says when); returns the new memory's id, or None when nothing was kept."""
        relied = item.cited_ids or item.used_ids
        memories = []
        for mid in dict.fromkeys(relied):
            try:
                memories.append((await self.memory.ainspect(mid, scope=item.scope)).memory)
            except UnknownMemoryError:  # not of this scope (a shared-scope fact): never replaced from here
                continue
        old = corrections.target(memories, item.scope)
        fact = corrections.correction_fact(old, turn, item.answer_id) if old is not None else None
        if old is None or fact is None:
            return None
        with self.memory_span("update_memory", item.scope, parent) as span:
            try:
                (new_id,) = await self.memory.aadd_many([fact], scope=item.scope)
            except RememError as exc:  # the verdict stands; the correction is not kept
                log.warning("correction of %s not kept: %s", item.answer_id, exc)
                span.set("remem.correction.error", str(exc))
                return None
            span.set("gen_ai.memory.id", new_id)
            span.set("remem.correction.replaces", old.id)
        log.info("kept the user's correction of %s as %s (replaces %s)", item.answer_id, new_id, old.id)
        return new_id

    async def _judge(self, own: AnswerContext, next_user: str) -> Verdict | None:
        """Ask the judge model (schema-enforced); any failure of the judge leaves the heuristic's verdict."""
        judge = self.judge
        assert judge is not None
        req = ChatRequest(
            messages=(
                Message("system", JUDGE_PROMPT),
                Message("user", json.dumps({"question": own.question, "answer": own.reply, "next_message": next_user})),
            ),
            json_schema=JUDGE_SCHEMA,
            schema_name="verdict",
            max_tokens=160,
        )
        try:
            resp = await call_with_retries(lambda: judge.complete(req), self.retry)
            data = json.loads(resp.text)
            verdict = data["verdict"]
            reason = str(data.get("reason", ""))[:200]
        except (ModelError, ValueError, KeyError, TypeError) as exc:
            log.info("judge gave no usable verdict: %s", exc)
            return None
        if verdict not in ("helpful", "wrong"):
            return Verdict(success=None, source="judge", weight=0.0, reason=reason or "unclear")
        return Verdict(success=verdict == "helpful", source="judge", weight=1.0, reason=reason)

    # -- the one path of every verdict -------------------------------------------------------------------
    async def record(
        self,
        item: Waiting,
        verdict: Verdict,
        *,
        used_ids: Sequence[str] = (),
        answer: object | None = None,
        conversation: str | None = None,
        started: float | None = None,
        heuristic: Mapping[str, Any] | None = None,
        judge: Mapping[str, Any] | None = None,
        parent: Span | None = None,
    ) -> FeedbackReceipt:
        """Learn a claimed answer's verdict, then trace it: the one path every outcome takes.

        Explicit feedback, an inferred correction, "moved on" and a settled conversation turn all come
        here, so they credit alike. If the ledger refuses the feedback, the claim is released (the answer
        may be judged again) and the error propagates; nothing is traced for it.
        """
        assert verdict.success is not None
        with self.memory_span("feedback", item.scope, parent) as span:
            span.set("remem.answer_id", item.answer_id)
            span.set("remem.outcome.success", verdict.success)
            span.set("remem.outcome.source", verdict.source)
            try:
                receipt = await self.memory.afeedback(
                    item.search_id,
                    success=verdict.success,
                    used_ids=list(used_ids),
                    cited_ids=list(item.cited_ids),
                    answer=answer,
                    weight=verdict.weight,
                    source=verdict.source,
                )
            except BaseException:
                await self.pending.release(item)
                raise
            await self.write_outcome(
                item, conversation, verdict, receipt, started=started, heuristic=heuristic, judge=judge
            )
            return receipt

    async def write_outcome(
        self,
        item: Waiting,
        cid: str | None,
        verdict: Verdict,
        receipt: FeedbackReceipt,
        *,
        started: float | None,
        heuristic: Mapping[str, Any] | None = None,
        judge: Mapping[str, Any] | None = None,
    ) -> None:
        tracer = self._tracer()
        if tracer is None:
            return
        await tracer.write(
            self.outcome_record(item, cid, verdict, receipt, started=started, heuristic=heuristic, judge=judge)
        )

    def outcome_record(
        self,
        item: Waiting,
        cid: str | None,
        verdict: Verdict,
        receipt: FeedbackReceipt,
        *,
        started: float | None,
        heuristic: Mapping[str, Any] | None,
        judge: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """The trace line of one outcome."""
        return {
            "v": 2,
            "kind": "outcome",
            "ts": datetime.now(UTC).isoformat(),
            "run": self.run_id,
            "answer_id": item.answer_id,
            "conversation_id": cid,
            "search_id": item.search_id,
            "outcome": {"success": verdict.success, "source": verdict.source, "weight": verdict.weight},
            "reason": verdict.reason,
            "heuristic": dict(heuristic) if heuristic is not None else None,
            "judge": dict(judge) if judge is not None else None,
            "credit": dict(receipt.credit),
            "blame": dict(receipt.blame),
            "after_s": round(time.time() - started, 3) if started is not None else None,
        }
