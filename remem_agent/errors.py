"""The one exception tree of remem-agent.

Every error the library raises on purpose derives from :class:`RememError`, so callers can catch
one base class. The tree::

    RememError
    ├── UserInputError (also ValueError)        bad arguments; nothing was written
    │   ├── UnknownMemoryError (also KeyError)  a memory id that is not in the ledger
    │   ├── UnknownSearchError (also KeyError)  a search_id or answer_id that was never issued
    │   │   └── AnswerExpiredError              an answer whose verdict came after its TTL
    │   ├── FeedbackConflictError               a second, *different* feedback for one search
    │   ├── EmbeddingError                      NaN/inf vectors, wrong dimension, wrong shape
    │   └── NoPropensitiesError                 off-policy evaluation of searches logged without propensities
    ├── InvalidTransition                       a lifecycle move the state machine forbids
    ├── StoreError                              the ledger could not do its job
    │   ├── SchemaVersionError                  store written by a newer remem-agent
    │   ├── LedgerIntegrityError                verify() found violated invariants
    │   │   └── LedgerCorruptError              the ledger file is damaged (says what, and how to recover)
    │   ├── StoreBusyError                      the database stayed locked (or in conflict) past every retry
    │   ├── StoreConnectionError                PostgreSQL unreachable, wrong credentials, no such database
    │   └── MissingExtensionError               PostgreSQL without the pgvector extension
    ├── ModelError                              a chat/embedding model call failed (status, body)
    │   └── ModelNotAvailableError (also ImportError)  a local model package is not installed
    └── OutputValidationError                   the model never produced a valid answer
                                                (attempts, last_raw)

SDK and database errors are mapped at the boundary with ``raise ... from`` so the original cause is
kept in ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RememError(Exception):
    """Base class of every error remem-agent raises on purpose."""


class UserInputError(RememError, ValueError):
    """The caller passed something the library cannot accept. Nothing was written."""


class UnknownMemoryError(UserInputError, KeyError):
    """A memory id that is not in the ledger."""

    def __init__(self, memory_id: str) -> None:
        super().__init__(f"unknown memory id: {memory_id!r}")
        self.memory_id = memory_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.memory_id,))

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class UnknownSearchError(UserInputError, KeyError):
    """A search_id (or an answer id standing for one) that this store never issued, or not in this scope.

    ``field`` is the name the caller used for the id ("search_id", "answer_id"), so the message speaks the
    caller's words; ``detail`` says more where the caller's path knows more.
    """

    def __init__(self, search_id: str, *, field: str = "search_id", detail: str | None = None) -> None:
        super().__init__(f"unknown {field}: {search_id!r}" + (f" ({detail})" if detail else ""))
        self.search_id = search_id
        self.field = field
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unknown_search, (self.search_id, self.field, self.detail))

    def __str__(self) -> str:
        return str(self.args[0])


def _unknown_search(search_id: str, field: str, detail: str | None) -> UnknownSearchError:
    """Unpickles an UnknownSearchError (its keyword-only arguments do not fit ``__reduce__``'s args tuple)."""
    return UnknownSearchError(search_id, field=field, detail=detail)


class AnswerExpiredError(UnknownSearchError):
    """Feedback for an answer that waited longer than its store's answer TTL: it expired with no outcome
    (never a failure), and no verdict is recorded for it any more. Nothing was written."""

    def __init__(self, answer_id: str, *, field: str = "answer_id", detail: str | None = None) -> None:
        super().__init__(answer_id, field=field, detail=detail or "it expired without a verdict")
        self.args = (f"expired {field}: {answer_id!r} ({self.detail})",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_answer_expired, (self.search_id, self.field, self.detail))


def _answer_expired(answer_id: str, field: str, detail: str | None) -> AnswerExpiredError:
    """Unpickles an AnswerExpiredError."""
    return AnswerExpiredError(answer_id, field=field, detail=detail)


class FeedbackConflictError(UserInputError):
    """Feedback for a search that already received *different* feedback.

    Repeating the identical feedback is idempotent (it returns the first receipt and counts
    nothing twice); only a conflicting second verdict is an error.
    """

    def __init__(self, search_id: str, detail: str) -> None:
        super().__init__(f"search {search_id!r} already has different feedback: {detail}")
        self.search_id = search_id
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.search_id, self.detail))


class EmbeddingError(UserInputError):
    """An embedding that is not finite or does not have the store's dimension."""


class NoPropensitiesError(UserInputError):
    """Off-policy evaluation asked of a store whose judged searches were not logged with propensities.

    Decisions with their probabilities are stored from ledger schema 15 on, and only by searches made with
    ``RememConfig(explore_serving > 0)``; searches made before, or without exploration, cannot be re-weighted.
    """


class InvalidTransition(RememError):
    """A lifecycle move that the retention state machine forbids."""

    def __init__(self, memory_id: str, from_state: str, event: str) -> None:
        super().__init__(f"memory {memory_id!r}: event {event!r} is not allowed in state {from_state}")
        self.memory_id = memory_id
        self.from_state = from_state
        self.event = event

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.memory_id, self.from_state, self.event))


class StoreError(RememError):
    """The ledger could not complete an operation."""


class SchemaVersionError(StoreError):
    """The store was written by a newer remem-agent than this one."""

    def __init__(self, found: int, supported: int, where: str) -> None:
        super().__init__(
            f"{where} has schema version {found}, but this remem-agent supports up to {supported}; "
            "upgrade remem-agent to open it"
        )
        self.found = found
        self.supported = supported
        self.where = where

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.found, self.supported, self.where))


class LedgerIntegrityError(StoreError):
    """``verify()`` found violated invariants (raised only when asked to raise)."""

    def __init__(self, problems: Sequence[str]) -> None:
        shown = "; ".join(problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"ledger integrity check failed: {shown}{more}")
        self.problems = list(problems)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems,))


class LedgerCorruptError(LedgerIntegrityError):
    """The ledger is damaged: unreadable pages, a missing table, an emptied or missing file.

    ``what`` says what is damaged, ``recovery`` how to get the data back (restore a backup, or salvage
    the readable rows with ``sqlite3 ledger.db ".recover"``).
    """

    def __init__(self, what: str, recovery: str) -> None:
        StoreError.__init__(self, f"{what}; {recovery}")
        self.problems = [what]
        self.what = what
        self.recovery = recovery

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.what, self.recovery))


class StoreBusyError(StoreError):
    """The database stayed locked by other writers (or kept conflicting with them) past every retry."""


class StoreConnectionError(StoreError):
    """The ledger's database server could not be reached or refused the login; the message names the fix."""


class MissingExtensionError(StoreError):
    """The PostgreSQL database lacks the pgvector extension and this user cannot create it."""


class ModelError(RememError):
    """A model endpoint failed. ``status`` and ``body`` are set for HTTP failures.

    ``retryable`` marks transient failures (timeouts, connection errors, 429, 5xx) that the single retry
    layer (``remem_agent.adapters.retry``) may try again; ``retry_after`` is the server's hint in seconds.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.retryable = retryable
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {"status": self.status, "body": self.body, "retryable": self.retryable, "retry_after": self.retry_after}
        return (_rebuild, (type(self), (str(self.args[0]) if self.args else "",), kw))


class ModelNotAvailableError(ModelError, ImportError):
    """A package that ships a local model is not installed (or its files are missing)."""


class OutputValidationError(RememError):
    """The model never produced an answer that parses and validates."""

    def __init__(self, message: str, *, attempts: int, last_raw: str | None, errors: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.last_raw = last_raw
        self.errors = list(errors)

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {"attempts": self.attempts, "last_raw": self.last_raw, "errors": self.errors}
        return (_rebuild, (type(self), (str(self.args[0]) if self.args else "",), kw))


def _rebuild(cls: type[Exception], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exception:
    """Unpickle an error whose constructor takes keyword-only arguments."""
    return cls(*args, **kwargs)


__all__ = [
    "AnswerExpiredError",
    "EmbeddingError",
    "FeedbackConflictError",
    "InvalidTransition",
    "LedgerCorruptError",
    "LedgerIntegrityError",
    "MissingExtensionError",
    "ModelError",
    "ModelNotAvailableError",
    "NoPropensitiesError",
    "OutputValidationError",
    "RememError",
    "SchemaVersionError",
    "StoreBusyError",
    "StoreConnectionError",
    "StoreError",
    "UnknownMemoryError",
    "UnknownSearchError",
    "UserInputError",
]
