"""``MemoryAgent``: async middleware that wraps any chat model with an outcome-learning memory.

Per ``ask``: recall -> prompt -> call -> enforce -> score -> learn -> trace. The model sees and cites
short per-ask aliases (``M1``, ``M2``, ... in rank order; see ``prompt.citation_aliases``). Enforcement
validates them and the middleware maps them back to memory ids right after, so credit,
``Answer.citations`` and the trace's ``citations`` hold real memory ids (the trace also keeps the map).

Composition only: the wrapped model is any :class:`~remem_agent.adapters.base.ChatModel`; nothing of a
vendor SDK is patched. Blocking work (embedding, SQLite, trace writes) runs on worker threads;
concurrent asks are bounded by a semaphore, and each ask learns only through its own ``search_id``
so credit never crosses between concurrent calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from remem_agent._time import Timestamp
from remem_agent.adapters.base import ChatModel, ChatRequest, ChatResponse, Message
from remem_agent.adapters.retry import RetryPolicy, call_with_retries
from remem_agent.agent.enforce import Checked, check_reply
from remem_agent.agent.prompt import (
    build_messages,
    check_answer_schema,
    citation_aliases,
    reask_message,
    with_citations,
)
from remem_agent.agent.scoring import Outcome, Scorer, exact_match
from remem_agent.agent.trace import TraceWriter
from remem_agent.errors import ModelError, OutputValidationError, UnknownSearchError, UserInputError
from remem_agent.ingest import check_text
from remem_agent.memory import ReMem
from remem_agent.types import FeedbackReceipt, Hit, Role, SearchResult

log = logging.getLogger("remem_agent.agent")

WEAK_SUCCESS_WEIGHT = 0.3  # an inferred "moved on without correcting" success counts this much


@dataclass(frozen=True)
class Answer:
    """The result of one ``ask``. ``value`` is the caller's schema fields; ``error`` is set on failure."""

    answer_id: str
    question: str
    task: str | None
    value: dict[str, Any] | None
    citations: tuple[str, ...]
    served: tuple[Hit, ...]
    search_id: str
    raw: str | None
    attempts: int
    outcome: Outcome | None = None
    credit: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)  # alias shown to the model -> memory id

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class _Pending:
    """An answer whose outcome is not known yet (no truth given)."""

    answer: Answer
    scored: bool = False


class MemoryAgent:
    """Wrap a chat model so that it recalls, answers with citations, and learns from outcomes.

    >>> agent = MemoryAgent(ReMem("mem"), OpenAIChat("gpt-4o-mini"))
    >>> ans = await agent.ask("Where is our server?", task="ops", truth={"answer": "west-2"})
    """

    def __init__(
        self,
        memory: ReMem,
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
        temperature: float = 0.0,
        max_tokens: int | None = 512,
        seed: int | None = 0,
        system_prompt: str | None = None,
        infer_outcomes: bool = True,
    ) -> None:
        if not isinstance(model, ChatModel):
            raise UserInputError("model must implement the ChatModel protocol (name, adapter, capabilities, complete)")
        if max_reasks < 0 or max_concurrency < 1:
            raise UserInputError("max_reasks must be >= 0 and max_concurrency >= 1")
        self.memory = memory
        self.model = model
        self.k = k
        self.token_budget = token_budget
        self.max_reasks = max_reasks
        self.retry = retry or RetryPolicy()
        self.run_id = run_id or datetime.now(UTC).strftime("run-%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
        self.system = system
        self.scorer = scorer
        self.success_threshold = success_threshold
        self.on_invalid = on_invalid
        self.temperature, self.max_tokens, self.seed = temperature, max_tokens, seed
        self.system_prompt = system_prompt
        self.infer_outcomes = infer_outcomes
        if trace is False:
            self.tracer: TraceWriter | None = None
        elif isinstance(trace, TraceWriter):
            self.tracer = trace
        else:
            self.tracer = TraceWriter(trace or Path("traces") / f"{self.run_id}.jsonl")
        self._sem = asyncio.Semaphore(max_concurrency)
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # answer_id -> pending, oldest first
        self._last_by_task: dict[str | None, str] = {}
        self._lock = asyncio.Lock()

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
    ) -> Answer:
        question = check_text(question, "question")
        base_schema = check_answer_schema(schema)
        async with self._sem:
            return await self._ask(question, task, base_schema, truth, as_of, now, k, token_budget, task_id)

    async def _ask(
        self,
        question: str,
        task: str | None,
        base_schema: dict[str, Any],
        truth: Any,
        as_of: Timestamp | None,
        now: Timestamp | None,
        k: int | None,
        token_budget: int | None,
        task_id: str | None,
    ) -> Answer:
        t0 = time.perf_counter()
        answer_id = f"a_{uuid.uuid4().hex[:16]}"
        if self.infer_outcomes:
            await self._infer_moved_on(task)
        # 1. recall
        res: SearchResult = await self.memory.asearch(
            question,
            k=k or self.k,
            task=task,
            as_of=as_of,
            now=now,
            token_budget=self.token_budget if token_budget is None else token_budget,
        )
        t_recall = time.perf_counter()
        # 2. prompt
        aliases = citation_aliases(res.ids)  # "M1" -> first served id, ...
        labels = list(aliases)
        schema = with_citations(base_schema, labels)
        messages = build_messages(question, res.items, schema, system_prompt=self.system_prompt, labels=labels)
        trace: dict[str, Any] = {
            "v": 1,
            "ts": datetime.now(UTC).isoformat(),
            "run": self.run_id,
            "answer_id": answer_id,
            "task_id": task_id,
            "task": task,
            "question": question,
            "system": self.system,
            "model": {
                "adapter": self.model.adapter,
                "name": self.model.name,
                "params": {"temperature": self.temperature, "max_tokens": self.max_tokens, "seed": self.seed},
                "native_json_schema": self.model.capabilities.native_json_schema,
            },
            "search_id": res.search_id,
            "served": [
                {
                    "id": h.id,
                    "rank": h.rank,
                    "score": round(h.score, 6),
                    "similarity": round(h.similarity, 6),
                    "state": h.state.value,
                    "text": h.text,
                }
                for h in res.items
            ],
            "aliases": aliases,
            "schema": schema,
            "messages": [m.to_dict() for m in messages],
            "attempts": [],
            "answer": None,
            "citations": [],
            "error": None,
            "outcome": None,
            "truth": truth,
            "credit": {},
            "blame": {},
            "latency_ms": {},
        }
        # 3-4. call + enforce, with bounded re-asks
        checked: Checked | None = None
        last_raw: str | None = None
        all_errors: list[str] = []
        model_ms = 0.0
        convo = list(messages)
        error: str | None = None
        try:
            for _ in range(self.max_reasks + 1):
                retries: list[dict[str, Any]] = []
                attempt_rec: dict[str, Any] = {
                    "raw": None,
                    "finish_reason": None,
                    "errors": [],
                    "kind": "model_error",
                    "latency_ms": 0.0,
                    "usage": {},
                    "retries": retries,
                }
                trace["attempts"].append(attempt_rec)
                request = ChatRequest(
                    messages=tuple(convo),
                    json_schema=schema,
                    schema_name="answer",
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    seed=self.seed,
                )
                t_call = time.perf_counter()
                try:
                    resp = await self._call(request, retries)
                finally:
                    attempt_rec["latency_ms"] = round((time.perf_counter() - t_call) * 1000, 3)
                    model_ms += attempt_rec["latency_ms"]
                last_raw = resp.text
                checked = check_reply(resp.text, schema, labels, truncated=resp.finish_reason == "length")
                attempt_rec.update(
                    raw=resp.text,
                    finish_reason=resp.finish_reason,
                    errors=list(checked.errors),
                    kind=checked.kind,
                    usage=resp.usage.to_dict(),
                )
                if checked.ok:
                    break
                all_errors += checked.errors
                convo += [Message("assistant", resp.text), reask_message(checked.errors)]
        except ModelError as exc:
            error = f"model error: {exc}"
            trace["error"] = error
            trace["latency_ms"] = self._latencies(t0, t_recall, model_ms, 0.0)
            await self._write(trace)
            raise
        attempts = len(trace["attempts"])
        if checked is None or not checked.ok:
            error = f"no valid answer after {attempts} attempt(s): {'; '.join(all_errors[-3:])}"
            trace["error"] = error
            trace["latency_ms"] = self._latencies(t0, t_recall, model_ms, 0.0)
            await self._write(trace)
            if self.on_invalid == "raise":
                raise OutputValidationError(error, attempts=attempts, last_raw=last_raw, errors=all_errors)
            return Answer(
                answer_id,
                question,
                task,
                None,
                (),
                res.items,
                res.search_id,
                last_raw,
                attempts,
                error=error,
                aliases=aliases,
            )
        # aliases -> memory ids (check_reply accepted only served aliases, each once)
        cited_ids = tuple(aliases[c] for c in checked.citations)
        # 5-6. score + learn
        t_learn = time.perf_counter()
        value = checked.value or {}
        outcome: Outcome | None = None
        receipt: FeedbackReceipt | None = None
        if truth is not None:
            score = float(self.scorer(value, truth))
            outcome = Outcome(score >= self.success_threshold, "truth", score)
            receipt = await self.memory.afeedback(
                res.search_id,
                success=outcome.success,
                cited_ids=list(cited_ids),
                answer=value,
                source="truth",
            )
        answer = Answer(
            answer_id,
            question,
            task,
            value,
            cited_ids,
            res.items,
            res.search_id,
            last_raw,
            attempts,
            outcome,
            dict(receipt.credit) if receipt else {},
            aliases=aliases,
        )
        if outcome is None:
            async with self._lock:
                self._pending[answer_id] = _Pending(answer)
                self._last_by_task[task] = answer_id
                while len(self._pending) > 10_000:
                    self._pending.popitem(last=False)
        learn_ms = (time.perf_counter() - t_learn) * 1000
        # 7. trace
        trace.update(
            answer=value,
            citations=list(cited_ids),
            outcome=outcome.to_dict() if outcome else None,
            credit=dict(receipt.credit) if receipt else {},
            blame=dict(receipt.blame) if receipt else {},
            latency_ms=self._latencies(t0, t_recall, model_ms, learn_ms),
        )
        await self._write(trace)
        return answer

    async def _call(self, request: ChatRequest, retries: list[dict[str, Any]]) -> ChatResponse:
        def on_retry(attempt: int, exc: ModelError, wait: float) -> None:
            retries.append({"attempt": attempt, "status": exc.status, "error": str(exc)[:500], "wait_s": wait})

        return await call_with_retries(lambda: self.model.complete(request), self.retry, on_retry=on_retry)

    @staticmethod
    def _latencies(t0: float, t_recall: float, model_ms: float, learn_ms: float) -> dict[str, float]:
        total = (time.perf_counter() - t0) * 1000
        return {
            "recall": round((t_recall - t0) * 1000, 3),
            "model": round(model_ms, 3),
            "learn": round(learn_ms, 3),
            "total": round(total, 3),
            "overhead": round(total - model_ms, 3),
        }

    async def _write(self, record: dict[str, Any]) -> None:
        if self.tracer is not None:
            await self.tracer.write(record)

    # -- outcomes that arrive later -------------------------------------------------------------
    async def feedback(
        self, answer_id: str, *, success: bool, used_ids: Sequence[str] | None = None
    ) -> FeedbackReceipt:
        """An explicit user signal for an earlier answer (source "user")."""
        async with self._lock:
            pending = self._pending.get(answer_id)
            if pending is None or pending.scored:
                raise UnknownSearchError(answer_id)
            pending.scored = True
        a = pending.answer
        try:
            return await self.memory.afeedback(
                a.search_id,
                success=success,
                used_ids=used_ids,
                cited_ids=list(a.citations),
                answer=a.value,
                source="user",
            )
        except BaseException:
            pending.scored = False
            raise

    async def remember(
        self,
        text: str,
        *,
        entity: str | None = None,
        attribute: str | None = None,
        role: Role = "state",
        task: str | None = None,
        timestamp: Timestamp | None = None,
    ) -> str:
        """Add a memory; if it corrects a ``state`` memory served to a pending answer, that answer failed."""
        new_id = await self.memory.aadd(
            text, entity=entity, attribute=attribute, role=role, task=task, timestamp=timestamp
        )
        if self.infer_outcomes and role == "state" and entity and attribute:
            await self._infer_correction(new_id)
        return new_id

    async def _infer_correction(self, new_id: str) -> None:
        info = await self.memory.ainspect(new_id)
        corrected = set(info.supersedes)
        if not corrected:
            return
        async with self._lock:
            hits = [p for p in self._pending.values() if not p.scored and corrected & {h.id for h in p.answer.served}]
            for p in hits:
                p.scored = True
        for p in hits:
            blamed = sorted(corrected & {h.id for h in p.answer.served})
            log.debug("inferred failure of %s: corrected %s", p.answer.answer_id, blamed)
            await self.memory.afeedback(
                p.answer.search_id,
                success=False,
                used_ids=blamed,
                cited_ids=list(p.answer.citations),
                source="inferred",
            )

    async def _infer_moved_on(self, task: str | None) -> None:
        """A new ask in the same task with no correction since: the previous answer was a weak success."""
        async with self._lock:
            prev_id = self._last_by_task.pop(task, None)
            p = self._pending.get(prev_id) if prev_id else None
            if p is None or p.scored:
                return
            p.scored = True
        await self.memory.afeedback(
            p.answer.search_id,
            success=True,
            cited_ids=list(p.answer.citations),
            answer=p.answer.value,
            weight=WEAK_SUCCESS_WEIGHT,
            source="inferred",
        )
