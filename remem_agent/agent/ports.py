"""What the middleware needs from a memory: a small structural protocol that ``ReMem`` satisfies.

``MemoryAgent`` depends on this, not on the ``ReMem`` class, so any object with these async calls (a
remote client, a test double, a wrapper that adds scoping) can stand behind an agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from remem_agent._time import Timestamp
from remem_agent.learning.credit import Replay
from remem_agent.types import FeedbackReceipt, MemoryInfo, OutcomeSource, Role, SearchResult
from remem_agent.validate import MemoryInput


class AgentMemory(Protocol):
    """Recall, learn, remember and inspect; ``path`` is where the memory lives (a folder or a URL)."""

    @property
    def path(self) -> Path | str: ...

    async def asearch(
        self,
        query: str,
        *,
        k: int | None = None,
        task: str | None = None,
        as_of: Timestamp | None = None,
        now: Timestamp | None = None,
        token_budget: int | None = None,
        explain: bool = False,
        scope: str | None = None,
    ) -> SearchResult: ...

    async def afeedback(
        self,
        search_id: str,
        *,
        success: bool,
        used_ids: Sequence[str] | None = None,
        cited_ids: Sequence[str] | None = None,
        answer: Any = None,
        replay: Replay | None = None,
        weight: float = 1.0,
        source: OutcomeSource = "api",
        scope: str | None = None,
        now: Timestamp | None = None,
    ) -> FeedbackReceipt: ...

    async def aadd(
        self,
        text: str,
        *,
        entity: str | None = None,
        attribute: str | None = None,
        role: Role = "state",
        task: str | Sequence[str] | None = None,
        timestamp: Timestamp | None = None,
        confidence: float = 1.0,
        scope: str | None = None,
    ) -> str: ...

    async def aadd_many(
        self, items: Iterable[MemoryInput | Mapping[str, Any] | str], *, scope: str | None = None
    ) -> list[str]: ...

    async def ainspect(self, memory_id: str, *, scope: str | None = None) -> MemoryInfo: ...


@runtime_checkable
class BlockingMemory(Protocol):
    """An :class:`AgentMemory` whose ``asearch``/``afeedback`` are its blocking ``search``/``feedback`` run in a
    worker thread (``ReMem``): a caller already in a worker thread calls these instead, so a chat turn that
    settles the previous answer and recalls spends one thread hop on both (``Conversations.begin``)."""

    def search(
        self,
        query: str,
        *,
        k: int | None = None,
        task: str | None = None,
        now: Timestamp | None = None,
        token_budget: int | None = None,
        scope: str | None = None,
    ) -> SearchResult: ...

    def feedback(
        self,
        search_id: str,
        *,
        success: bool,
        used_ids: Sequence[str] | None = None,
        cited_ids: Sequence[str] | None = None,
        answer: Any = None,
        weight: float = 1.0,
        source: OutcomeSource = "api",
    ) -> FeedbackReceipt: ...
