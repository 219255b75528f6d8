"""One ``MemoryAgent.ask``: recall -> prompt -> call and enforce -> score -> learn -> trace.

Each stage is one function here, run in that order by :func:`run_ask`; the stages' own rules live in their
modules (:mod:`.prompt`, :mod:`.call`, :mod:`.enforce`, :mod:`.scoring`, :mod:`.outcomes`, :mod:`.trace`).
The model sees and cites per-ask aliases (``M1``, ``M2``, ... in rank order); they are mapped back to memory
ids right after enforcement, so credit, ``Answer.citations`` and the trace hold real memory ids. An ask with a
``truth`` learns at once (source "truth"); one without waits for its verdict (:mod:`.outcomes`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from remem_agent._time import Timestamp
from remem_agent.adapters.base import ChatModel, Message
from remem_agent.adapters.retry import RetryPolicy
from remem_agent.agent.call import Enforced, Sampling, call_and_enforce
from remem_agent.agent.ports import AgentMemory
from remem_agent.agent.prompt import build_messages, citation_aliases, with_citations
from remem_agent.agent.scoring import Outcome, Scorer
from remem_agent.agent.trace import AttemptRecord, TraceRecord, TraceWriter
from remem_agent.errors import ModelError, OutputValidationError
from remem_agent.learning.credit import values_used
from remem_agent.outcomes.pending import PendingStore, Waiting
from remem_agent.types import FeedbackReceipt, Hit, SearchResult


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class AskRequest:
    """One ``ask``'s arguments, checked (``schema`` is the caller's, before citations are added)."""

    question: str
    task: str | None
    schema: dict[str, Any]
    truth: Any
    as_of: Timestamp | None
    now: Timestamp | None
    k: int | None
    token_budget: int | None
    task_id: str | None
    scope: str

    @property
    def thread(self) -> tuple[str, str]:
        """The thread an ask's waiting answer joins: one per scope and task class."""
        return ("task", f"{self.scope}|{self.task}")


@dataclass(kw_only=True)
class AskState:
    """What an ask has done so far: enough for a trace line whichever stage fails."""

    t0: float
    answer_id: str
    schema: Mapping[str, Any]
    search_id: str | None = None
    served: list[dict[str, Any]] = field(default_factory=list)
    aliases: Mapping[str, str] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    traced: bool = False
    t_recall: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Recalled:
    """The recall and prompt stages' result: what was served, and the messages and schema the model gets."""

    result: SearchResult
    aliases: dict[str, str]
    schema: dict[str, Any]
    messages: list[Message]

    @property
    def labels(self) -> list[str]:
        return list(self.aliases)


class AskHost(Protocol):
    """What an ask reads of the ``MemoryAgent`` running it (its settings are read at each ask)."""

    memory: AgentMemory
    model: ChatModel
    k: int
    token_budget: int | None
    max_reasks: int
    retry: RetryPolicy
    run_id: str
    system: str | None
    scorer: Scorer
    success_threshold: float
    on_invalid: Literal["raise", "return"]
    sampling: Sampling
    system_prompt: str | None
    tracer: TraceWriter | None
    _pending: PendingStore


async def run_ask(host: AskHost, st: AskState, req: AskRequest) -> Answer:
    """The stages in order; each writes what it did into ``st`` so that a failure still leaves a trace line."""
    rec = await recall(host, st, req)
    try:
        enforced = await call_and_enforce(
            host.model,
            rec.messages,
            rec.schema,
            rec.labels,
            attempts=st.attempts,
            retry=host.retry,
            max_reasks=host.max_reasks,
            sampling=host.sampling,
        )
    except ModelError as exc:
        model_ms = sum(a.latency_ms for a in st.attempts)
        await write(
            host, st, trace(host, st, req, rec, error=f"model error: {exc}", latency_ms=latencies(st, model_ms))
        )
        raise
    if not enforced.ok:
        return await invalid(host, st, req, rec, enforced)
    assert enforced.checked is not None
    cited_ids = tuple(rec.aliases[c] for c in enforced.checked.citations)  # enforce accepted served aliases only
    value = enforced.checked.value or {}
    t_learn = time.perf_counter()
    outcome, receipt = await learn(host, st, req, rec.result, value, cited_ids)
    learn_ms = (time.perf_counter() - t_learn) * 1000
    credit = dict(receipt.credit) if receipt else {}
    await write(
        host,
        st,
        trace(
            host, st, req, rec,
            answer=value,
            citations=list(cited_ids),
            outcome=outcome.to_dict() if outcome else None,
            credit=credit,
            blame=dict(receipt.blame) if receipt else {},
            latency_ms=latencies(st, enforced.model_ms, learn_ms),
        ),
    )  # fmt: skip
    return Answer(
        answer_id=st.answer_id,
        question=req.question,
        task=req.task,
        value=value,
        citations=cited_ids,
        served=rec.result.items,
        search_id=rec.result.search_id,
        raw=enforced.last_raw,
        attempts=len(st.attempts),
        outcome=outcome,
        credit=credit,
        aliases=rec.aliases,
    )


async def recall(host: AskHost, st: AskState, req: AskRequest) -> Recalled:
    """1-2. Recall the memories for the question, then build the prompt that shows them under aliases."""
    res: SearchResult = await host.memory.asearch(
        req.question,
        k=req.k or host.k,
        task=req.task,
        as_of=req.as_of,
        now=req.now,
        token_budget=host.token_budget if req.token_budget is None else req.token_budget,
        scope=req.scope,
    )
    st.search_id, st.served = res.search_id, [served_entry(h) for h in res.items]
    st.t_recall = time.perf_counter()
    aliases = citation_aliases(res.ids)  # "M1" -> first served id, ...
    schema = with_citations(req.schema, list(aliases))
    messages = build_messages(req.question, res.items, schema, system_prompt=host.system_prompt, labels=list(aliases))
    st.aliases, st.schema, st.messages = aliases, schema, [m.to_dict() for m in messages]
    return Recalled(result=res, aliases=aliases, schema=schema, messages=messages)


async def learn(
    host: AskHost, st: AskState, req: AskRequest, res: SearchResult, value: dict[str, Any], cited_ids: tuple[str, ...]
) -> tuple[Outcome | None, FeedbackReceipt | None]:
    """5-6. Score against the truth and learn now, or leave the answer waiting for its verdict."""
    if req.truth is not None:
        outcome = Outcome.from_score(host.scorer(value, req.truth), threshold=host.success_threshold)
        receipt = await host.memory.afeedback(
            res.search_id, success=outcome.success, cited_ids=list(cited_ids), answer=value, source="truth"
        )
        return outcome, receipt
    waiting = Waiting(
        answer_id=st.answer_id,
        search_id=res.search_id,
        served_ids=tuple(res.ids),
        cited_ids=cited_ids,
        value=value,
        used_ids=tuple(sorted(values_used({h.id: h.text for h in res.items}, value))),
        scope=req.scope,
    )
    await host._pending.add(waiting, req.thread)
    return None, None


async def invalid(host: AskHost, st: AskState, req: AskRequest, rec: Recalled, enforced: Enforced) -> Answer:
    """No valid reply within the re-asks: trace it, then raise or return an ``Answer`` with ``error``."""
    attempts = len(st.attempts)
    error = f"no valid answer after {attempts} attempt(s): {'; '.join(enforced.errors[-3:])}"
    await write(host, st, trace(host, st, req, rec, error=error, latency_ms=latencies(st, enforced.model_ms)))
    if host.on_invalid == "raise":
        raise OutputValidationError(error, attempts=attempts, last_raw=enforced.last_raw, errors=list(enforced.errors))
    return Answer(
        answer_id=st.answer_id,
        question=req.question,
        task=req.task,
        value=None,
        citations=(),
        served=rec.result.items,
        search_id=rec.result.search_id,
        raw=enforced.last_raw,
        attempts=attempts,
        error=error,
        aliases=rec.aliases,
    )


def trace(host: AskHost, st: AskState, req: AskRequest, rec: Recalled, **rest: Any) -> TraceRecord:
    """7. The ask's trace line: the request, what was served and shown, every attempt, then ``rest``."""
    return TraceRecord(
        **_who(host, st, req),
        model={
            "adapter": host.model.adapter,
            "name": host.model.name,
            "params": host.sampling.to_dict(),
            "native_json_schema": host.model.capabilities.native_json_schema,
        },
        search_id=rec.result.search_id,
        served=[served_entry(h) for h in rec.result.items],
        aliases=rec.aliases,
        schema=rec.schema,
        messages=[m.to_dict() for m in rec.messages],
        attempts=st.attempts,
        truth=req.truth,
        **rest,
    )


def _who(host: AskHost, st: AskState, req: AskRequest) -> dict[str, Any]:
    """The fields every trace line of an ask opens with: when, which run and answer, what was asked."""
    return {
        "ts": datetime.now(UTC).isoformat(),
        "run": host.run_id,
        "answer_id": st.answer_id,
        "task_id": req.task_id,
        "task": req.task,
        "question": req.question,
        "system": host.system,
    }


def fallback_trace(host: AskHost, st: AskState, req: AskRequest, exc: Exception) -> TraceRecord:
    """The trace line of an ask that failed outside the model call (the recall, the learning step, a bug)."""
    return TraceRecord(
        **_who(host, st, req),
        model={"adapter": host.model.adapter, "name": host.model.name, "params": host.sampling.to_dict()},
        search_id=st.search_id,
        served=st.served,
        aliases=st.aliases,
        schema=st.schema,
        messages=st.messages,
        attempts=st.attempts,
        truth=req.truth,
        error=f"{type(exc).__name__}: {exc}",
        latency_ms={"total": round((time.perf_counter() - st.t0) * 1000, 3)},
    )


async def write(host: AskHost, st: AskState, record: TraceRecord) -> None:
    st.traced = True
    if host.tracer is not None:
        await host.tracer.write(record.to_dict())


def served_entry(h: Hit) -> dict[str, Any]:
    return {
        "id": h.id,
        "rank": h.rank,
        "score": round(h.score, 6),
        "similarity": round(h.similarity, 6),
        "state": h.state.value,
        "text": h.text,
    }


def latencies(st: AskState, model_ms: float, learn_ms: float = 0.0) -> dict[str, float]:
    total = (time.perf_counter() - st.t0) * 1000
    return {
        "recall": round((st.t_recall - st.t0) * 1000, 3),
        "model": round(model_ms, 3),
        "learn": round(learn_ms, 3),
        "total": round(total, 3),
        "overhead": round(total - model_ms, 3),
    }
