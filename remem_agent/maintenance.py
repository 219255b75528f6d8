"""Reading and maintaining a store: what ``ReMem`` offers besides add, search and feedback.

``get``, ``inspect``, ``list`` and ``stats`` read the ledger; ``verify`` checks its invariants; ``prune`` bounds
its growth (:mod:`remem_agent.store.pruning`); ``erase`` forgets memories on request (:mod:`remem_agent.erasure`).
``ReMem`` inherits them from :class:`Maintenance`, which needs only its store, embedder and index.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from remem_agent import erasure
from remem_agent._time import Timestamp, to_epoch
from remem_agent._time import now as wall_now
from remem_agent.embedders.base import Embedder
from remem_agent.erasure import EraseRequest, ErasureReport
from remem_agent.errors import LedgerIntegrityError, UnknownMemoryError, UserInputError
from remem_agent.index.base import IndexBackend
from remem_agent.learning import rerank_fit
from remem_agent.store.base import Store, VectorSearch
from remem_agent.store.pruning import GrowthLimits, PruneReport
from remem_agent.types import ROLES, Memory, MemoryInfo, Role, State, StoreStats, VerifyReport
from remem_agent.validate import check_int, check_scope, check_text


def store_stats(store: Store, scope: str | None, *, embedder: str, dim: int) -> StoreStats:
    """``ReMem.stats()`` of ``store`` (``remem stats`` passes the embedder and dimension the store records)."""
    c = store.counts(None if scope is None else check_scope(scope))
    return StoreStats(
        memories=c["memories"],
        by_state={s.value: c["by_state"].get(s.value, 0) for s in State},
        by_role={r: c["by_role"].get(r, 0) for r in ROLES},
        events=c["events"],
        searches=c["searches"],
        feedbacks=c["feedbacks"],
        tokens_active=c["tokens_active"],
        embedder=embedder,
        dim=dim,
        schema_version=store.schema_version,
        kept=c["kept"],
        disk_bytes=store.disk_bytes(),
        reranker=rerank_fit.summary(store),
    )


class Maintenance:
    """The reading and maintenance calls of :class:`~remem_agent.memory.ReMem` (its store, embedder, dimension
    and candidate index are set by ``ReMem.__init__``)."""

    store: Store
    embedder: Embedder
    dim: int
    index: IndexBackend | VectorSearch

    # -- inspection -----------------------------------------------------------------------------
    def get(self, memory_id: str, *, scope: str | None = None) -> Memory:
        """One memory; with ``scope``, only if it belongs to that scope (else ``UnknownMemoryError``)."""
        memory_id = check_text(memory_id, "memory_id")
        scope = None if scope is None else check_scope(scope)
        with self.store.read() as tx:
            return _in_scope(tx.memory(memory_id), scope)

    def inspect(self, memory_id: str, *, scope: str | None = None) -> MemoryInfo:
        """State, credit statistics, credit history and every transition of one memory (of ``scope``, if given)."""
        memory_id = check_text(memory_id, "memory_id")
        scope = None if scope is None else check_scope(scope)
        with self.store.read() as tx:
            m = _in_scope(tx.memory(memory_id), scope)
            return MemoryInfo(
                memory=m,
                stats=tx.all_stats(memory_id),
                history=tuple(tx.events(memory_id)),
                credits=tuple(tx.credits_for(memory_id)),
                supersedes=tuple(tx.supersedes(memory_id)),
            )

    def list(
        self,
        state: State | str | None = None,
        *,
        role: Role | None = None,
        limit: int | None = None,
        offset: int = 0,
        scope: str | None = None,
    ) -> builtins.list[Memory]:
        """Memories in insertion order, optionally filtered by state, role and scope (None: every scope)."""
        st: State | None = None
        if state is not None:
            try:
                st = State(str(state).upper())
            except ValueError as exc:
                raise UserInputError(f"unknown state {state!r}; one of {[s.value for s in State]}") from exc
        if role is not None and role not in ROLES:
            raise UserInputError(f"role must be one of {ROLES}")
        if limit is not None:
            check_int(limit, "limit", minimum=0)
        check_int(offset, "offset", minimum=0)
        scope = None if scope is None else check_scope(scope)
        with self.store.read() as tx:
            return tx.list_memories(st, role, limit, offset, scope)

    def stats(self, *, scope: str | None = None) -> StoreStats:
        """Counts of the whole store, or of one scope (its memories, their events, its searches)."""
        return store_stats(self.store, scope, embedder=self.embedder.name, dim=self.dim)

    def prune(
        self, *, answer_ttl_s: float | None = None, retention_s: float | None = None, now: Timestamp | None = None
    ) -> PruneReport:
        """Expire waiting answers older than ``answer_ttl_s`` and delete unjudged searches (and settled or
        expired answers) older than ``retention_s``, keeping every learned statistic
        (:mod:`remem_agent.store.pruning`). Judged searches, memories and events are never pruned."""
        limits = GrowthLimits(answer_ttl_s=answer_ttl_s, retention_s=retention_s)
        at = to_epoch(now, name="now", default=wall_now())
        assert at is not None
        return self.store.prune(limits, now=at)

    def verify(self, *, raise_on_error: bool = False) -> VerifyReport:
        """Check the ledger's invariants (see remem_agent/store/verify.py)."""
        problems = self.store.verify(self.dim)
        c = self.store.counts()
        report = VerifyReport(not problems, tuple(problems), {"memories": c["memories"], "events": c["events"]})
        if problems and raise_on_error:
            raise LedgerIntegrityError(problems)
        return report

    def erase(
        self,
        ids: str | Sequence[str] | None = None,
        *,
        scope: str | None = None,
        whole_scope: bool = False,
        entity: str | None = None,
        attribute: str | None = None,
        speaker: str | None = None,
        session: str | None = None,
        role: Role | None = None,
        contains: str | None = None,
        reason: str = erasure.DEFAULT_REASON,
        traces: Sequence[str | Path] | None = None,
        scrub: bool = True,
        now: Timestamp | None = None,
    ) -> ErasureReport:
        """Erase memories for good: ``ids``, or every memory matching a filter (``entity``, ``attribute``,
        ``speaker``, ``session``, ``role``, ``contains``: a substring of the text), or with ``whole_scope`` all
        of ``scope`` and its traffic. ``scope`` limits ids and filters to that scope (another scope's id is
        unknown: ``UnknownMemoryError``, nothing erased).

        Their text, vector, keys and time mentions, the lexical index's entries, the waiting answers that
        served them, queries and stored responses of their scope that quote them, and the lines of
        ``traces`` (files or folders; default the store folder's ``traces``) that name or quote them are
        removed; rows and events stay, redacted, so that ``verify()`` passes and other memories' history is
        intact (:mod:`remem_agent.store.erasure`). ``scrub`` (default) then rewrites the store's files
        (``VACUUM``; on PostgreSQL ``VACUUM FULL`` of the touched tables, which locks them meanwhile) so that no
        freed page keeps the bytes. ``reason`` is logged (never the text). Erasing an erased memory again
        repeats the steps after the ledger's (traces, scrub): how an interrupted erasure is completed.
        """
        req = EraseRequest.checked(
            ids,
            scope=scope,
            whole_scope=whole_scope,
            entity=entity,
            attribute=attribute,
            speaker=speaker,
            session=session,
            role=role,
            contains=contains,
            reason=reason,
        )
        paths = erasure.check_trace_paths(self.store, traces)
        at = to_epoch(now, name="now", default=wall_now())
        assert at is not None
        return erasure.run(self.store, req, traces=paths, scrub=scrub, at=at, forget_vectors=self._forget_vectors)

    def _forget_vectors(self, ids: Sequence[str]) -> None:
        """Drop erased memories' vectors from the in-process index (a caller's backend: if it can)."""
        discard = getattr(self.index, "discard", None)  # FlatIndex has it; a caller's backend may
        if callable(discard):
            discard(ids)

    async def aerase(self, ids: str | Sequence[str] | None = None, **kw: Any) -> ErasureReport:
        """``erase`` on a worker thread."""
        return await asyncio.to_thread(lambda: self.erase(ids, **kw))


def _in_scope(memory: Memory, scope: str | None) -> Memory:
    """``memory`` if it belongs to ``scope`` (None: any); another scope's memory is as good as absent."""
    if scope is not None and memory.scope != scope:
        raise UnknownMemoryError(memory.id)
    return memory
