"""What a chat call carries between its stages: the keyword arguments a caller may pass (:class:`RecallArgs`,
:class:`ChatArgs`, written once for every entry point), the validated request (:class:`ChatOptions`), the state
of a user turn while its agent loop may continue it (:class:`TurnState`), and the reply with what memory did
for it (:class:`ChatReply`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from remem_agent._time import Timestamp
from remem_agent.adapters.base import ChatModel, FinishReason, Message, ToolCall, ToolSpec, Usage
from remem_agent.agent.call import Sampling
from remem_agent.types import Hit, SearchResult


class RecallArgs(TypedDict, total=False):
    """The keyword arguments of a chat call that shape its recall (``MemoryAgent.prepare_chat`` takes these)."""

    tools: Sequence[Mapping[str, Any] | ToolSpec] | None  # OpenAI-style function tools
    tool_choice: str | Mapping[str, Any] | None
    conversation_id: str | None  # the caller's thread; None: the agent follows the history
    scope: str | None  # whose memory (default "default")
    task: str | None  # the task class outcomes are learned in
    k: int | None  # memories to recall (default: the agent's)
    now: Timestamp | None  # the clock of the search (default: the wall clock)
    token_budget: int | None  # tokens the memory block may take (default: the agent's)


class ChatArgs(RecallArgs, total=False):
    """The keyword arguments of ``MemoryAgent.chat`` and ``chat_stream``, written once."""

    strip_citations: bool | None  # take the [M1] labels out of the reply text (default: the agent's)
    temperature: float | None
    max_tokens: int | None
    extra: Mapping[str, Any] | None  # provider fields passed to the model untouched
    model: ChatModel | None  # this call's model instead of the agent's (a gateway routes per request)
    json_schema: Mapping[str, Any] | None  # structured output through the model's native mechanism
    schema_name: str | None  # the schema's name where the provider wants one (default "answer")


@dataclass(frozen=True, kw_only=True)
class ChatReply:
    """One model reply in a conversation, with what the memory did for it."""

    text: str  # citations stripped when the agent was asked to (``raw`` keeps them)
    raw: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    usage: Usage
    answer_id: str  # the turn's answer: its own per new user turn; the same for an agent loop's later calls
    conversation_id: str
    scope: str
    search_id: str | None
    served: tuple[Hit, ...]
    aliases: Mapping[str, str]
    citations: tuple[str, ...]  # memory ids cited inline in this reply
    used: tuple[str, ...]  # served memories whose values this reply (or its tool arguments) repeats
    recalled: bool  # False when the call reused its turn's recall (an agent-loop continuation)
    abstained: bool = False  # the abstain gate found nothing relevant: no memory block was injected


@dataclass
class TurnState:
    """State of one user turn (one answer), kept while its agent loop may continue it."""

    key: tuple[int, str]
    answer_id: str
    result: SearchResult
    aliases: dict[str, str]
    query: str
    user_text: str  # all user turns so far: a value they contain is not evidence of memory use
    question: str
    started: float = field(default_factory=time.time)
    cited: list[str] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    answered: bool = False  # a reply of this turn was delivered (so it waits for an outcome)


@dataclass(frozen=True, kw_only=True)
class ChatOptions:
    """What one chat call asked for, validated."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    tool_choice: str | None
    conversation_id: str  # the caller's, else a label derived from the opening (``conversation_key``)
    threaded: bool  # the caller gave the conversation id: its latest answer is what a new turn follows
    scope: str
    task: str | None
    k: int | None
    now: Timestamp | None
    token_budget: int | None
    strip: bool
    sampling: Sampling
    extra: Mapping[str, Any]
    model: ChatModel  # the call's model: the one passed, else the agent's
    json_schema: Mapping[str, Any] | None = None
    schema_name: str = "answer"
