"""ReMem as a LangChain retriever (``pip install 'remem-agent[langchain]'``).

>>> from remem_agent.integrations.langchain import ReMemRetriever
>>> retriever = ReMemRetriever(memory=mem, k=5, task="support")
>>> docs = retriever.invoke("Which plan is the customer on?")
>>> retriever.feedback(success=True, used_ids=[docs[0].metadata["id"]])

The retriever is a ``Runnable``: it composes with ``|``, ``batch``, ``ainvoke`` and callbacks like any
LangChain retriever. Feedback is what makes ReMem learn, so report the outcome after each answer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from remem_agent._extras import require

require("langchain_core", "langchain", feature="ReMemRetriever")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402

from remem_agent.errors import UserInputError  # noqa: E402
from remem_agent.memory import ReMem  # noqa: E402
from remem_agent.types import FeedbackReceipt, OutcomeSource, SearchResult  # noqa: E402

METADATA_KEYS = (
    "id",
    "score",
    "similarity",
    "state",
    "entity",
    "attribute",
    "role",
    "valid_from",
    "valid_to",
    "search_id",
)


def to_documents(result: SearchResult) -> list[Document]:
    """One ``Document`` per served memory, in rank order; ``metadata["search_id"]`` ties it to feedback."""
    return [
        Document(
            page_content=h.text,
            id=h.id,
            metadata={
                "id": h.id,
                "score": float(h.score),
                "similarity": float(h.similarity),
                "state": str(h.state),
                "entity": h.entity,
                "attribute": h.attribute,
                "role": h.role,
                "valid_from": float(h.valid_from),
                "valid_to": None if h.valid_to is None else float(h.valid_to),
                "search_id": result.search_id,
            },
        )
        for h in result.items
    ]


class ReMemRetriever(BaseRetriever):
    """A LangChain ``BaseRetriever`` over a :class:`~remem_agent.ReMem` store.

    ``invoke(query)`` runs ``memory.search(query, k=k, task=task, token_budget=token_budget)`` and
    returns the served memories as ``Document`` s (``page_content`` is the memory text; metadata: id,
    score, similarity, state, entity, attribute, role, valid_from, valid_to, search_id). ``ainvoke``
    uses ``memory.asearch``. ``feedback(success=..., used_ids=..., cited_ids=...)`` reports the outcome
    of the last search (or of ``search_id=``), which is what ranking and retention learn from.

    Thread-safety: ReMem itself is thread-safe, and so is this retriever's bookkeeping (a lock guards
    the remembered last search). But "the last search" is per retriever, not per thread or per
    conversation: when one retriever serves concurrent requests (threads, ``batch``, concurrent
    ``ainvoke``), pass the right ``search_id=`` (from ``doc.metadata["search_id"]``) to ``feedback``,
    or use one retriever per conversation.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: ReMem
    """The store to search (shared; the retriever does not close it)."""
    k: int = Field(default=5, ge=1)
    """How many memories to serve at most."""
    task: str | None = None
    """Task class of the searches (outcome statistics are kept per task)."""
    token_budget: int | None = Field(default=None, ge=0)
    """Serve at most this many tokens of memory text (None: no budget)."""

    _last: SearchResult | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    # -- retrieval ------------------------------------------------------------------------------
    def _search_kwargs(self) -> dict[str, Any]:
        return {"k": self.k, "task": self.task, "token_budget": self.token_budget}

    def _remember(self, result: SearchResult) -> list[Document]:
        with self._lock:
            self._last = result
        return to_documents(result)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._remember(self.memory.search(query, **self._search_kwargs()))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self._remember(await self.memory.asearch(query, **self._search_kwargs()))

    @property
    def last_search(self) -> SearchResult | None:
        """The most recent search of this retriever (None before the first one)."""
        with self._lock:
            return self._last

    # -- feedback -------------------------------------------------------------------------------
    def _feedback_args(
        self,
        search_id: str | None,
        used_ids: Sequence[str | Document] | None,
        cited_ids: Sequence[str | Document] | None,
    ) -> tuple[str, list[str] | None, list[str] | None]:
        if search_id is None:
            last = self.last_search
            if last is None:
                raise UserInputError("no search to give feedback for: call invoke()/ainvoke() first or pass search_id=")
            search_id = last.search_id
        return search_id, _ids(used_ids, "used_ids"), _ids(cited_ids, "cited_ids")

    def feedback(
        self,
        *,
        success: bool,
        used_ids: Sequence[str | Document] | None = None,
        cited_ids: Sequence[str | Document] | None = None,
        search_id: str | None = None,
        answer: Any = None,
        weight: float = 1.0,
        source: OutcomeSource = "api",
    ) -> FeedbackReceipt:
        """Report the outcome of the last search (or ``search_id``); see :meth:`ReMem.feedback`.

        ``used_ids`` / ``cited_ids`` take memory ids or the returned ``Document`` s themselves.
        """
        sid, used, cited = self._feedback_args(search_id, used_ids, cited_ids)
        return self.memory.feedback(
            sid, success=success, used_ids=used, cited_ids=cited, answer=answer, weight=weight, source=source
        )

    async def afeedback(
        self,
        *,
        success: bool,
        used_ids: Sequence[str | Document] | None = None,
        cited_ids: Sequence[str | Document] | None = None,
        search_id: str | None = None,
        answer: Any = None,
        weight: float = 1.0,
        source: OutcomeSource = "api",
    ) -> FeedbackReceipt:
        """Async :meth:`feedback` (runs on a worker thread)."""
        sid, used, cited = self._feedback_args(search_id, used_ids, cited_ids)
        return await self.memory.afeedback(
            sid, success=success, used_ids=used, cited_ids=cited, answer=answer, weight=weight, source=source
        )


def _ids(items: Sequence[str | Document] | None, what: str) -> list[str] | None:
    if items is None:
        return None
    if isinstance(items, str | Document):
        raise UserInputError(f"{what} must be a list of memory ids or Documents")
    out: list[str] = []
    for item in items:
        if isinstance(item, Document):
            mid = item.metadata.get("id") or item.id
            if not isinstance(mid, str):
                raise UserInputError(f"{what}: a Document without a memory id in metadata['id']")
            out.append(mid)
        else:
            out.append(item)  # ReMem.feedback validates the type and that the id was served
    return out


__all__ = ["METADATA_KEYS", "ReMemRetriever", "to_documents"]
