"""The trace line of one chat call (version 2, kind ``chat``) as a typed value.

:class:`ChatTraceLine` holds what the line says; :meth:`ChatTraceLine.to_dict` is exactly what the
:class:`~remem_agent.agent.trace.TraceWriter` writes (key order included). :func:`chat_line` builds it for a call
that recalled, :func:`failed_recall_line` for a call whose recall failed (no turn: the keys that describe one
are left out). Latency is filled in last (``with_latency``), once the answer is waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from remem_agent.adapters.base import ToolCall, Usage
from remem_agent.agent.chat_types import ChatOptions, ChatReply, TurnState
from remem_agent.agent.conversation import extract_citations, latest_user_index


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True, kw_only=True)
class ChatTraceLine:
    """One chat call's trace line. ``None`` in ``abstained``, ``unknown_citations`` and ``used`` leaves the key
    out (a call whose recall failed has no turn to describe)."""

    run: str
    answer_id: str
    conversation_id: str
    scope: str
    turn: int
    task: str | None
    model: Mapping[str, Any]
    search_id: str | None
    recall_query: str | None
    recalled: bool
    served: Sequence[Mapping[str, Any]]
    aliases: Mapping[str, str]
    messages: Sequence[Mapping[str, Any]]
    memory_block: str | None
    tools: Sequence[str]
    stream: bool
    reply: Mapping[str, Any]
    citations: Sequence[str]
    error: str | None
    abstained: bool | None = None
    unknown_citations: Sequence[str] | None = None
    used: Sequence[str] | None = None
    latency_ms: Mapping[str, float] = field(default_factory=dict)
    ts: str = field(default_factory=_now)

    def with_latency(self, latency: Mapping[str, float]) -> ChatTraceLine:
        return replace(self, latency_ms=dict(latency))

    def to_dict(self) -> dict[str, Any]:
        """The line as written (the order of its keys is the trace format's)."""
        out: dict[str, Any] = {
            "v": 2, "kind": "chat", "ts": self.ts, "run": self.run, "answer_id": self.answer_id,
            "conversation_id": self.conversation_id, "scope": self.scope, "turn": self.turn, "task": self.task,
            "model": dict(self.model), "search_id": self.search_id, "recall_query": self.recall_query,
            "recalled": self.recalled,
        }  # fmt: skip
        if self.abstained is not None:
            out["abstained"] = self.abstained
        out.update(
            served=[dict(s) for s in self.served], aliases=dict(self.aliases),
            messages=[dict(m) for m in self.messages], memory_block=self.memory_block, tools=list(self.tools),
            stream=self.stream, reply=dict(self.reply), citations=list(self.citations),
        )  # fmt: skip
        if self.unknown_citations is not None:
            out["unknown_citations"] = list(self.unknown_citations)
        if self.used is not None:
            out["used"] = list(self.used)
        out.update(error=self.error, latency_ms=dict(self.latency_ms))
        return out


class CallOutcome(TypedDict):
    """What one call did, as its trace line records it beside the turn."""

    recalled: bool
    block: str | None  # the memory block added to the messages
    stream: bool
    text: str
    tool_calls: Sequence[ToolCall]
    finish_reason: str | None
    usage: Usage
    reply: ChatReply | None  # None when the model failed
    error: str | None


def chat_line(run_id: str, opts: ChatOptions, turn: TurnState, **call: Unpack[CallOutcome]) -> ChatTraceLine:
    """The line of a call that recalled (its reply, or the model's error)."""
    recalled, text, reply, usage = call["recalled"], call["text"], call["reply"], call["usage"]
    return ChatTraceLine(
        run=run_id,
        answer_id=turn.answer_id,
        conversation_id=opts.conversation_id,
        scope=opts.scope,
        turn=turn.key[0],
        task=opts.task,
        model={"adapter": opts.model.adapter, "name": opts.model.name, "params": opts.sampling.to_dict()},
        search_id=turn.result.search_id,
        recall_query=turn.query if recalled else None,
        recalled=recalled,
        abstained=turn.result.abstained,
        served=[
            {"id": h.id, "rank": h.rank, "score": round(h.score, 6), "state": h.state.value, "text": h.text}
            for h in turn.result.items
        ],
        aliases=dict(turn.aliases),
        messages=[m.to_dict() for m in opts.messages],
        memory_block=call["block"],
        tools=[t.name for t in opts.tools],
        stream=call["stream"],
        reply={
            "text": text,
            "tool_calls": [c.to_dict() for c in call["tool_calls"]],
            "finish_reason": call["finish_reason"],
            "usage": usage.to_dict(),
        },
        citations=list(reply.citations) if reply else [],
        unknown_citations=list(extract_citations(text, turn.aliases)[1]),
        used=list(reply.used) if reply else [],
        error=call["error"],
    )


def failed_recall_line(run_id: str, opts: ChatOptions, exc: BaseException, total_ms: float) -> ChatTraceLine:
    """The line of a call whose recall failed (a store error, say): no turn, no model call."""
    return ChatTraceLine(
        run=run_id,
        answer_id="",
        conversation_id=opts.conversation_id,
        scope=opts.scope,
        turn=latest_user_index(opts.messages),
        task=opts.task,
        model={"adapter": opts.model.adapter, "name": opts.model.name},
        search_id=None,
        recall_query=None,
        recalled=False,
        served=[],
        aliases={},
        messages=[m.to_dict() for m in opts.messages],
        memory_block=None,
        tools=[],
        stream=False,
        reply={"text": "", "tool_calls": [], "finish_reason": "error"},
        citations=[],
        error=f"recall failed: {type(exc).__name__}: {exc}",
        latency_ms={"total": total_ms},
    )
