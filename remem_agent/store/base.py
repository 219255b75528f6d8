"""The store seam: what a ledger backend provides, and how a location picks one.

Two backends implement it: ``SQLiteStore`` (a folder, the embedded default) and ``PostgresStore``
(a ``postgresql://`` URL: one memory shared by many processes and machines). Everything above the
store (ingest, ranking, credit, lifecycle, the middleware) talks to a ``Store`` and the
``LedgerTx`` objects it hands out, never to a database driver.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from remem_agent.store import pruning
from remem_agent.store.erasure import ScrubReport
from remem_agent.store.pruning import GrowthLimits, PruneReport
from remem_agent.store.sql import LedgerTx

log = logging.getLogger("remem_agent.store")

T = TypeVar("T")

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


@runtime_checkable
class VectorSearch(Protocol):
    """Candidate generation served by the ledger itself (e.g. pgvector's HNSW index).

    ``candidates`` returns the ``k`` most similar memories of ``scopes`` (None: every scope), best first.
    Fewer than ``k`` means the scopes hold no more: the caller stops widening its pool.
    """

    def candidates(
        self, query: NDArray[np.float32], k: int, *, scopes: Collection[str] | None = None
    ) -> tuple[list[str], NDArray[np.float32]]: ...

    def __len__(self) -> int: ...


class Store(Protocol):
    """A ledger backend. Writes go through ``transact``; ``write``/``read`` open one transaction."""

    @property
    def location(self) -> str:
        """Where the ledger lives, safe to print (no password)."""
        ...

    @property
    def schema_version(self) -> int: ...

    def transact(self, fn: Callable[[LedgerTx], T], *, commutative: bool = False) -> T:
        """Run ``fn`` in one write transaction, all or nothing, and return its result.

        ``fn`` may run more than once (a backend retries on serialization conflicts), so it must
        have no effects outside the transaction. ``commutative=True`` declares that ``fn`` only
        appends rows and increments counters, so concurrent runs cannot conflict in meaning and a
        backend may use a cheaper isolation level.
        """
        ...

    def write(self) -> AbstractContextManager[LedgerTx]: ...

    def read(self) -> AbstractContextManager[LedgerTx]: ...

    def close(self) -> None: ...

    def bind_dimension(self, dim: int) -> None:
        """Called once the embedding width is known (PostgreSQL types its vector column and indexes it)."""
        ...

    def vector_search(self) -> VectorSearch | None:
        """The ledger's own candidate generator, or None when an in-process index is needed."""
        ...

    def integrity_problems(self) -> list[str]:
        """The database engine's own consistency check (invariant 1 of ``verify``)."""
        ...

    # Provided by StoreCommon for every backend:
    def get_meta(self, key: str) -> str | None: ...

    def set_meta_default(self, key: str, value: str) -> str: ...

    def max_seq(self) -> int: ...

    def scoped_embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32], list[str]]: ...

    def embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32]]: ...

    def counts(self, scope: str | None = None) -> dict[str, Any]: ...

    def verify(self, dim: int | None = None) -> list[str]: ...

    def prune(self, limits: GrowthLimits, *, now: float) -> PruneReport: ...

    def disk_bytes(self) -> int:
        """The bytes the ledger takes on disk (its files, or its tables and indexes)."""
        ...

    def scrub(self) -> ScrubReport:
        """Rewrite the ledger's files so that no freed space keeps the bytes of erased rows
        (:mod:`remem_agent.store.erasure`)."""
        ...


class StoreCommon:
    """Store methods that are the same for every backend (they only use ``read``/``write``)."""

    read: Callable[[], AbstractContextManager[LedgerTx]]
    write: Callable[[], AbstractContextManager[LedgerTx]]
    transact: Callable[..., Any]

    def integrity_problems(self) -> list[str]:
        return []

    def get_meta(self, key: str) -> str | None:
        with self.read() as tx:
            return tx.get_meta(key)

    def set_meta_default(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is already stored; return the stored one."""
        return str(self.transact(lambda tx: tx.set_meta_default(key, value)))

    def max_seq(self) -> int:
        with self.read() as tx:
            return tx.max_seq()

    def embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32]]:
        with self.read() as tx:
            return tx.embeddings_after(seq, dim)

    def scoped_embeddings_after(self, seq: int, dim: int) -> tuple[int, list[str], NDArray[np.float32], list[str]]:
        """``embeddings_after`` plus each row's scope, from one snapshot."""
        with self.read() as tx:
            last, ids, mat = tx.embeddings_after(seq, dim)
            return last, ids, mat, tx.scopes_between(seq, last) if ids else []

    def counts(self, scope: str | None = None) -> dict[str, Any]:
        with self.read() as tx:
            return {**tx.counts(scope), "kept": pruning.kept(tx, scope)}

    def prune(self, limits: GrowthLimits, *, now: float) -> PruneReport:
        """Expire waiting answers and prune old unjudged traffic (:mod:`remem_agent.store.pruning`)."""
        return pruning.prune(self.transact, limits, now=now)

    def verify(self, dim: int | None = None) -> list[str]:
        """Check the ledger's invariants; return human-readable violations (empty = healthy)."""
        from remem_agent.store.verify import verify_ledger

        problems = self.integrity_problems()
        with self.read() as tx:
            return verify_ledger(tx, dim, problems)


def backoff_retry(
    fn: Callable[[], T],
    *,
    retryable: Callable[[BaseException], bool],
    deadline_s: float,
    on_give_up: Callable[[BaseException, str], BaseException],
) -> T:
    """Call ``fn`` until it succeeds, retrying errors that ``retryable`` accepts with jittered backoff.

    Every retry is logged at DEBUG (contention shows up in the log before it shows up as an error). When the
    deadline passes, ``on_give_up`` gets the last error and how long the retries went on ("12 attempts over
    60.1 s"), for the message: a user who sees it knows it was sustained contention, not one conflict.
    """
    start = time.monotonic()
    deadline = start + deadline_s
    delay = 0.005
    attempts = 0
    while True:
        attempts += 1
        try:
            return fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            now = time.monotonic()
            if now > deadline:
                raise on_give_up(exc, f"{attempts} attempts over {now - start:.1f} s") from exc
            pause = delay * (0.5 + random.random())
            log.debug("attempt %d conflicted (%s); retrying in %.0f ms", attempts, type(exc).__name__, pause * 1000)
            time.sleep(pause)
            delay = min(delay * 2, 0.5)


def is_postgres_url(location: object) -> bool:
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)
