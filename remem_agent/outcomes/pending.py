"""Answers that wait for their verdict: what is kept of each, and the stores that keep them.

An answer given without ground truth waits until its verdict arrives:

* ``user``: an explicit :meth:`PendingOutcomes.take` for that answer (``MemoryAgent.feedback``);
* ``inferred``: a correction of a memory it relied on, or its thread moving on (the rules of
  :mod:`remem_agent.outcomes.rules`).

Each answer gets at most one verdict: whichever arrives first claims it (under one lock), so a
correction and a "moved on" racing for the same answer never both count.

Two stores hold the waiting answers, behind one :class:`PendingStore` protocol: :class:`PendingOutcomes`
here (in this process's memory: the default of a ``MemoryAgent``, gone with the process) and
:class:`~remem_agent.outcomes.ledger.LedgerPendingOutcomes` (rows of the ledger that every process
serving the store claims alike: what ``remem serve`` uses, so ``--workers N`` and several gateways on one
PostgreSQL store learn as one).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Collection, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from remem_agent.errors import UserInputError
from remem_agent.outcomes import rules

MAX_PENDING = 10_000  # oldest waiting answers are forgotten beyond this (their outcome never arrives)


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """What learning needs of an answer whose outcome is not known yet."""

    answer_id: str
    search_id: str
    served_ids: tuple[str, ...]
    cited_ids: tuple[str, ...]
    value: object  # the answer's value (a schema answer's dict): value use is credited from it
    used_ids: tuple[str, ...] = ()  # served memories whose values a free-text reply repeated
    scope: str = "default"  # the scope the answer was given in: only a caller of that scope may judge it
    turn: str = ""  # which user turn of its thread the answer belongs to (a retry of that turn is no next turn)


K = TypeVar("K", bound=Hashable)
# ("task", "<scope>|<task class>") for ask; for chat ("conv", "<scope>|<id>") or ("after", "<scope>|<digest>")
Thread = tuple[str, str | None]


class PendingStore(Protocol):
    """Where waiting answers wait; every method claims under the store's own exclusion (see the module doc)."""

    @property
    def shared(self) -> bool:
        """True when other processes add and claim the same answers (the next turn may come from any)."""
        ...

    async def add(self, item: Waiting, thread: Thread) -> None: ...

    async def take(self, answer_id: str, *, scope: str | None = None) -> Waiting | None: ...

    async def release(self, item: Waiting) -> None: ...

    async def take_latest(self, thread: Thread) -> Waiting | None: ...

    async def latest(self, thread: Thread) -> Waiting | None:
        """The thread's newest answer if it is still waiting (not claimed)."""
        ...

    async def take_relying_on(self, memory_ids: Collection[str]) -> list[tuple[Waiting, list[str]]]: ...

    async def scope_of(self, answer_id: str) -> str | None:
        """The scope a waiting (or judged) answer was given in; None if this store never held it."""
        ...

    async def judged(self, answer_id: str, *, scope: str | None = None) -> Waiting | None:
        """The answer (of ``scope``, when given) if a verdict already claimed it; None if waiting or unknown.
        A repeated verdict is checked against the recorded one through it."""
        ...

    async def expired(self, answer_id: str, *, scope: str | None = None) -> bool:
        """Whether this store holds the answer (of ``scope``, when given) and it expired without a verdict
        (older than the store's TTL): no verdict can claim it any more."""
        ...


@runtime_checkable
class BlockingAdd(Protocol):
    """A pending store whose ``add`` is blocking work it runs in a worker thread: ``add_blocking`` is that
    work itself, so a caller already in a worker thread (with the call's trace line to write too) spends one
    thread hop on both instead of one each."""

    def add_blocking(self, item: Waiting, thread: Thread) -> None: ...


@runtime_checkable
class BlockingClaims(Protocol):
    """A pending store whose reads and claims are blocking work it runs in a worker thread (the ledger's):
    these are that work itself, each what its async twin (``latest``, ``take``, ``release``) does, so a caller
    already in a worker thread settles the previous turn and recalls the next in one thread hop."""

    def latest_blocking(self, thread: Thread) -> Waiting | None: ...

    def take_blocking(self, answer_id: str, *, scope: str | None = None) -> Waiting | None: ...

    def release_blocking(self, item: Waiting) -> None: ...


class PendingOutcomes(Generic[K]):
    """Waiting answers, oldest first, and the latest one per thread key (a task, or a conversation).

    With ``ttl_s`` an answer expires that many seconds after it was given: nothing claims it any more."""

    shared = False  # one process's memory

    def __init__(self, max_pending: int = MAX_PENDING, *, ttl_s: float | None = None) -> None:
        if ttl_s is not None and (
            isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s) or ttl_s <= 0
        ):
            raise UserInputError(f"ttl_s must be a positive number of seconds or None, got {ttl_s!r}")
        self._waiting: OrderedDict[str, Waiting] = OrderedDict()
        self._given: dict[str, float] = {}  # answer id -> when it was added (time.monotonic)
        self._claimed: set[str] = set()
        self._latest: dict[K, str] = {}
        self._max = max_pending
        self._ttl = ttl_s
        self._lock = asyncio.Lock()

    async def add(self, item: Waiting, thread: K) -> None:
        async with self._lock:
            self._waiting[item.answer_id] = item
            self._given[item.answer_id] = time.monotonic()
            self._latest[thread] = item.answer_id
            while len(self._waiting) > self._max:
                old, _ = self._waiting.popitem(last=False)
                self._claimed.discard(old)
                self._given.pop(old, None)

    def _stale(self, answer_id: str) -> bool:
        """Past the TTL (an expired answer is never claimed)."""
        return self._ttl is not None and time.monotonic() - self._given.get(answer_id, math.inf) > self._ttl

    async def take(self, answer_id: str, *, scope: str | None = None) -> Waiting | None:
        """Claim one answer for an explicit verdict; None if unknown, already judged, or of another ``scope``."""
        async with self._lock:
            item = self._waiting.get(answer_id)
            if item is None or (scope is not None and item.scope != scope):
                return None
            return self._claim(answer_id)

    async def release(self, item: Waiting) -> None:
        """Undo a claim whose verdict could not be recorded (the caller may try again)."""
        async with self._lock:
            self._claimed.discard(item.answer_id)

    async def take_latest(self, thread: K) -> Waiting | None:
        """Claim the latest waiting answer of ``thread`` (a new turn arrived: it "moved on")."""
        async with self._lock:
            answer_id = self._latest.pop(thread, None)
            return self._claim(answer_id) if answer_id else None

    async def latest(self, thread: K) -> Waiting | None:
        async with self._lock:
            answer_id = self._latest.get(thread)
            if answer_id is None or answer_id in self._claimed or self._stale(answer_id):
                return None
            return self._waiting.get(answer_id)

    async def scope_of(self, answer_id: str) -> str | None:
        item = self._waiting.get(answer_id)
        return item.scope if item is not None else None

    async def judged(self, answer_id: str, *, scope: str | None = None) -> Waiting | None:
        item = self._waiting.get(answer_id)
        if item is None or answer_id not in self._claimed or (scope is not None and item.scope != scope):
            return None
        return item

    async def expired(self, answer_id: str, *, scope: str | None = None) -> bool:
        item = self._waiting.get(answer_id)
        if item is None or answer_id in self._claimed or (scope is not None and item.scope != scope):
            return False
        return self._stale(answer_id)

    async def take_relying_on(self, memory_ids: Collection[str]) -> list[tuple[Waiting, list[str]]]:
        """Claim every waiting answer that cited or used one of ``memory_ids``, with those ids.

        An answer that was merely served a memory, without citing it or repeating its value, did not rely
        on it: a correction of that memory says nothing about that answer, whose own verdict still comes.
        """
        wanted = set(memory_ids)
        out: list[tuple[Waiting, list[str]]] = []
        async with self._lock:
            for item in list(self._waiting.values()):
                hit = rules.blamed(wanted, rules.relied_on(item))
                if hit and self._claim(item.answer_id) is not None:
                    out.append((item, hit))
        return out

    def _claim(self, answer_id: str) -> Waiting | None:
        item = self._waiting.get(answer_id)
        if item is None or answer_id in self._claimed or self._stale(answer_id):
            return None
        self._claimed.add(answer_id)
        return item
