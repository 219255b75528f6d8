"""Waiting answers in the ledger: :class:`LedgerPendingOutcomes`, the
:class:`~remem_agent.outcomes.pending.PendingStore` that several processes on one store share (``remem serve
--workers N``, two gateways on one PostgreSQL ledger). The only module of ``outcomes/`` that touches the
ledger: the agent depends on the protocol and imports nothing of ``store/``.

Every method is one short transaction of :mod:`remem_agent.store.pending` run in a worker thread, so a claim
made by one process is seen by every other at once, and of two racing claims exactly one wins. Answers live
as long as the ledger (a restart keeps them) or, with ``ttl_s``, until they expire (:mod:`remem_agent.store.
pruning`); see that module for what a crash between a claim and its feedback loses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import TypeVar

from remem_agent.outcomes import rules
from remem_agent.outcomes.pending import Thread, Waiting
from remem_agent.store import pending
from remem_agent.store.base import Store
from remem_agent.store.pending import PendingRecord
from remem_agent.store.pruning import GrowthLimits
from remem_agent.store.sql import LedgerTx

T = TypeVar("T")


def thread_key(thread: Thread) -> str:
    kind, name = thread
    return f"{kind}:{name}"


def _waiting(rec: PendingRecord) -> Waiting:
    return Waiting(
        answer_id=rec.answer_id,
        search_id=rec.search_id,
        served_ids=rec.served_ids,
        cited_ids=rec.cited_ids,
        value=rec.value,
        used_ids=rec.used_ids,
        scope=rec.scope,
        turn=rec.turn,
    )


class LedgerPendingOutcomes:
    """Waiting answers as ledger rows, claimed atomically by whichever process judges them first."""

    shared = True

    def __init__(self, store: Store, *, claimant: str = "remem", ttl_s: float | None = None) -> None:
        if ttl_s is not None:
            GrowthLimits(answer_ttl_s=ttl_s)  # the same check as the sweep's (a positive, finite number)
        self._store = store
        self._claimant = claimant  # who claimed, kept in the row (e.g. "gateway-<pid>") for the audit
        self.ttl_s = ttl_s  # an answer older than this has expired: nothing claims it (store/pruning.py)

    def _fresh_after(self) -> float | None:
        return None if self.ttl_s is None else time.time() - self.ttl_s

    async def _write(self, fn: Callable[[LedgerTx], T]) -> T:
        return await asyncio.to_thread(self._store.transact, fn)

    async def _read(self, fn: Callable[[LedgerTx], T]) -> T:
        def run() -> T:
            with self._store.read() as tx:
                return fn(tx)

        return await asyncio.to_thread(run)

    async def add(self, item: Waiting, thread: Thread) -> None:
        await asyncio.to_thread(self.add_blocking, item, thread)

    def add_blocking(self, item: Waiting, thread: Thread) -> None:
        """``add`` itself, for a caller already in a worker thread (one hop for the answer and its trace line)."""
        rec = PendingRecord(
            answer_id=item.answer_id,
            scope=item.scope,
            thread=thread_key(thread),
            turn=item.turn,
            search_id=item.search_id,
            served_ids=item.served_ids,
            cited_ids=item.cited_ids,
            used_ids=item.used_ids,
            value=item.value,
            created_at=time.time(),
        )
        self._store.transact(lambda tx: pending.put(tx, rec))

    async def take(self, answer_id: str, *, scope: str | None = None) -> Waiting | None:
        return await asyncio.to_thread(self.take_blocking, answer_id, scope=scope)

    def take_blocking(self, answer_id: str, *, scope: str | None = None) -> Waiting | None:
        """``take`` itself, for a caller already in a worker thread."""
        rec = self._store.transact(
            lambda tx: pending.claim(
                tx, answer_id, scope=scope, by=self._claimant, at=time.time(), fresh_after=self._fresh_after()
            )
        )
        return _waiting(rec) if rec is not None else None

    async def release(self, item: Waiting) -> None:
        await asyncio.to_thread(self.release_blocking, item)

    def release_blocking(self, item: Waiting) -> None:
        """``release`` itself, for a caller already in a worker thread."""
        self._store.transact(lambda tx: pending.release(tx, item.answer_id))

    async def take_latest(self, thread: Thread) -> Waiting | None:
        key = thread_key(thread)
        rec = await self._write(
            lambda tx: pending.claim_latest(tx, key, by=self._claimant, at=time.time(), fresh_after=self._fresh_after())
        )
        return _waiting(rec) if rec is not None else None

    async def latest(self, thread: Thread) -> Waiting | None:
        return await asyncio.to_thread(self.latest_blocking, thread)

    def latest_blocking(self, thread: Thread) -> Waiting | None:
        """``latest`` itself, for a caller already in a worker thread."""
        key = thread_key(thread)
        with self._store.read() as tx:
            rec = pending.latest(tx, key, fresh_after=self._fresh_after())
        return _waiting(rec) if rec is not None else None

    async def take_relying_on(self, memory_ids: Collection[str]) -> list[tuple[Waiting, list[str]]]:
        """Claim every waiting answer that cited or used one of ``memory_ids`` (see ``PendingOutcomes``)."""
        wanted = set(memory_ids)
        if not wanted:
            return []

        def claim_all(tx: LedgerTx) -> list[tuple[PendingRecord, list[str]]]:
            out = []
            for rec in pending.waiting(tx, fresh_after=self._fresh_after()):
                hit = rules.blamed(wanted, rules.relied_on(rec))
                if hit:
                    got = pending.claim(tx, rec.answer_id, scope=None, by=self._claimant, at=time.time())
                    if got is not None:
                        out.append((got, hit))
            return out

        return [(_waiting(rec), hit) for rec, hit in await self._write(claim_all)]

    async def scope_of(self, answer_id: str) -> str | None:
        return await self._read(lambda tx: pending.scope_of(tx, answer_id))

    async def judged(self, answer_id: str, *, scope: str | None = None) -> Waiting | None:
        rec = await self._read(lambda tx: pending.judged(tx, answer_id, scope=scope))
        return _waiting(rec) if rec is not None else None

    async def expired(self, answer_id: str, *, scope: str | None = None) -> bool:
        fresh_after = self._fresh_after()
        return await self._read(lambda tx: pending.expired(tx, answer_id, scope=scope, fresh_after=fresh_after))
