"""Typed values that cross the public API: states, memories, search results, receipts.

All are frozen dataclasses so a result handed to the caller cannot drift from what the ledger
recorded.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Role = Literal["state", "preference", "note"]
DEFAULT_SCOPE = "default"  # where memories and searches go when no scope is named (and old stores' rows)
OutcomeSource = Literal["api", "truth", "user", "inferred", "judge"]
OUTCOME_SOURCES: tuple[OutcomeSource, ...] = ("api", "truth", "user", "inferred", "judge")
ROLES: tuple[Role, ...] = ("state", "preference", "note")

# The overall statistics row of a memory uses this task class; per-class rows use the caller's name.
ALL_TASKS = "*"

# The ledger's calibration of the relevance prior (``prior_calibration``, ranking/utility.py PriorCalibration):
# judged exposures are counted per bin of width 1 / CALIBRATION_BINS of their prior.
CALIBRATION_BINS = 10


def calibration_bins(priors: NDArray[np.float64]) -> NDArray[np.int64]:
    """The calibration bin of each relevance prior in [0, 1] (1.0 falls in the last bin)."""
    return np.clip((np.asarray(priors, dtype=np.float64) * CALIBRATION_BINS).astype(np.int64), 0, CALIBRATION_BINS - 1)


def calibration_bin(prior: float) -> int:
    """The calibration bin of one relevance prior (:func:`calibration_bins`)."""
    return int(calibration_bins(np.array([prior]))[0])


TimeFormat = Literal["epoch", "iso"]
_TIME_FIELDS = frozenset({"created_at", "valid_from", "valid_to", "at", "last_retrieved_at", "last_credited_at"})


def iso_time(t: float | None) -> str | None:
    """Epoch seconds as an ISO-8601 UTC string (``...Z``)."""
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _to_dict(obj: Any, times: TimeFormat, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The one JSON shape of every record type: its field names; states as strings, times as asked."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in skip:
            continue
        v = getattr(obj, f.name)
        if isinstance(v, enum.Enum):
            v = v.value
        elif isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, Mapping):
            v = dict(v)
        elif times == "iso" and f.name in _TIME_FIELDS:
            v = iso_time(v)
        out[f.name] = v
    return out


class State(enum.StrEnum):
    """Lifecycle state of a memory. Nothing is deleted; states only change, with a logged reason. ``ERASED``
    is the one exception to keeping everything: the row and its events stay, redacted (``ReMem.erase``)."""

    ACTIVE = "ACTIVE"
    LOW_VALUE = "LOW_VALUE"
    COMPRESSED = "COMPRESSED"
    ARCHIVED = "ARCHIVED"
    INVALIDATED = "INVALIDATED"
    ERASED = "ERASED"  # its text, vector and keys were erased on request; never served, never changes again

    def __str__(self) -> str:
        return self.value


# States served by a default (present-tense) search.
SERVABLE_STATES: frozenset[State] = frozenset({State.ACTIVE, State.LOW_VALUE, State.COMPRESSED})


@dataclass(frozen=True, slots=True)
class Memory:
    """One row of the ledger."""

    id: str
    text: str
    original_text: str
    entity: str | None
    attribute: str | None
    role: Role
    tasks: tuple[str, ...]
    created_at: float
    valid_from: float
    valid_to: float | None
    superseded_by: str | None
    state: State
    token_cost: int
    confidence: float
    scope: str = "default"  # who the memory belongs to (see ``DEFAULT_SCOPE``; a search reads only its own)
    speaker: str | None = None  # who said it, for a conversation turn (schema 5; immutable)
    session: str | None = None  # which conversation session it came from (schema 5; immutable)

    @property
    def key(self) -> tuple[str, str] | None:
        """The (entity, attribute) key used for supersession, if both are set."""
        if self.entity is None or self.attribute is None:
            return None
        return (self.entity, self.attribute)

    def valid_at(self, t: float) -> bool:
        """True when the fact held at time ``t`` (valid_from <= t < valid_to)."""
        return self.valid_from <= t and (self.valid_to is None or t < self.valid_to)

    def to_dict(self, times: TimeFormat = "epoch") -> dict[str, Any]:
        return _to_dict(self, times)


@dataclass(frozen=True, slots=True)
class Event:
    """An append-only ledger event: a state transition or another logged fact about a memory."""

    seq: int
    memory_id: str
    at: float
    kind: str
    from_state: State | None
    to_state: State
    reason: str
    evidence: Mapping[str, Any]

    def to_dict(self, times: TimeFormat = "epoch") -> dict[str, Any]:
        return _to_dict(self, times)


@dataclass(frozen=True, slots=True)
class TaskStats:
    """Outcome statistics of one memory for one task class (``"*"`` = all classes)."""

    task: str
    retrieved: int = 0
    shown: int = 0
    credited: int = 0
    wasted: int = 0
    blamed: int = 0
    credit_sum: float = 0.0
    blame_sum: float = 0.0
    last_retrieved_at: float | None = None
    last_credited_at: float | None = None
    # The relevance prior of each judged exposure summed: how many uses its exposures were expected to bring
    # (ranking/utility.py ContributionUtility). ``expected_n`` counts the exposures it covers; feedback given
    # before the ledger recorded priors (schema 10) is the rest of ``shown``.
    expected_sum: float = 0.0
    expected_n: int = 0

    @property
    def alpha(self) -> float:
        """Beta posterior alpha with a uniform Beta(1, 1) prior: 1 + accumulated credit."""
        return 1.0 + self.credit_sum

    @property
    def beta(self) -> float:
        """Beta posterior beta: 1 + exposures that earned no credit."""
        return 1.0 + max(0.0, self.shown - self.credit_sum)

    @property
    def contribution_rate(self) -> float:
        """Posterior mean of P(contributes | shown): ``alpha / (alpha + beta)``, written out (a search reads it
        for every candidate with stats; the same operations in the same order as through the properties)."""
        credit = self.credit_sum
        a = 1.0 + credit
        return a / (a + (1.0 + max(0.0, self.shown - credit)))

    @property
    def posterior_std(self) -> float:
        credit = self.credit_sum
        a, b = 1.0 + credit, 1.0 + max(0.0, self.shown - credit)
        return float(((a * b) / ((a + b) ** 2 * (a + b + 1.0))) ** 0.5)

    def to_dict(self, times: TimeFormat = "epoch") -> dict[str, Any]:
        return {**_to_dict(self, times), "contribution_rate": self.contribution_rate}


@dataclass(frozen=True, slots=True)
class AttributeInfo:
    """What the ledger learned about an attribute: value changes and single-valuedness evidence."""

    attribute: str
    changes: int = 0
    confirmations: int = 0
    counter: int = 0
    single_valued: bool = False
    decided_at: float | None = None

    @property
    def single_valued_posterior(self) -> float:
        """Beta(1, 1) posterior mean that the attribute holds one value at a time."""
        return (1.0 + self.confirmations) / (2.0 + self.confirmations + self.counter)


@dataclass(frozen=True, slots=True)
class Hit:
    """One served memory in a search result."""

    id: str
    text: str
    score: float
    similarity: float
    state: State
    rank: int
    valid_from: float
    valid_to: float | None
    entity: str | None
    attribute: str | None
    role: Role
    token_cost: int
    explain: Mapping[str, float] | None = None

    @property
    def validity(self) -> tuple[float, float | None]:
        return (self.valid_from, self.valid_to)

    def to_dict(self, times: TimeFormat = "epoch") -> dict[str, Any]:
        """Without ``explain`` (ask ``search(..., explain=True)`` and read it from the hit)."""
        return _to_dict(self, times, frozenset({"explain"}))


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What ``search`` served, under the id that ``feedback`` refers to."""

    search_id: str
    query: str
    task: str | None
    items: tuple[Hit, ...]
    as_of: float | None = None
    now: float | None = None
    token_budget: int | None = None
    scope: str = "default"
    # True when the abstain gate found nothing relevant (``RememConfig.abstain``): nothing is served
    abstained: bool = False

    @property
    def ids(self) -> list[str]:
        return [h.id for h in self.items]

    @property
    def tokens(self) -> int:
        return sum(h.token_cost for h in self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRecord:
    """A search as the ledger keeps it: what was asked, what was served (with feature snapshots), the verdict."""

    search_id: str
    at: float  # wall-clock time the search was recorded
    query: str
    task: str | None
    as_of: float | None
    now: float | None  # the caller's present at search time
    token_budget: int | None
    served: tuple[Mapping[str, Any], ...]  # {"id", "rank", "score", "similarity", "f"} per served memory
    feedback: Mapping[str, Any] | None
    feedback_at: float | None
    scope: str = "default"

    @property
    def served_ids(self) -> list[str]:
        return [str(s["id"]) for s in self.served]


@dataclass(frozen=True, slots=True)
class CreditRecord:
    """What one feedback call attributed to one served memory."""

    search_id: str
    memory_id: str
    task: str | None
    at: float
    success: bool
    cited: bool
    used: bool
    credit: float
    blame: float
    # the memory's relevance prior when it was served, and the uses that exposure was expected to bring (the
    # prior as the store's calibration rated it at feedback); None for feedback recorded before the ledger
    # kept them, or for a search without feature snapshots
    prior: float | None = None
    expected: float | None = None

    def to_dict(self, times: TimeFormat = "epoch") -> dict[str, Any]:
        return _to_dict(self, times)


@dataclass(frozen=True, slots=True)
class FeedbackReceipt:
    """The result of ``feedback``: credit per served memory and any lifecycle transitions."""

    search_id: str
    success: bool
    credit: Mapping[str, float]
    blame: Mapping[str, float]
    transitions: tuple[Event, ...] = ()
    repeated: bool = False
    replay_calls: int = 0
    source: OutcomeSource = "api"


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """Everything the ledger knows about one memory (``inspect``)."""

    memory: Memory
    stats: Mapping[str, TaskStats]
    history: tuple[Event, ...]
    credits: tuple[CreditRecord, ...]
    supersedes: tuple[str, ...] = ()

    @property
    def state(self) -> State:
        return self.memory.state

    @property
    def overall(self) -> TaskStats:
        return self.stats.get(ALL_TASKS, TaskStats(task=ALL_TASKS))

    @property
    def reason(self) -> str | None:
        """The reason of the latest transition (e.g. why it was invalidated)."""
        return self.history[-1].reason if self.history else None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Result of ``verify()``: ``ok`` is True when no invariant is violated."""

    ok: bool
    problems: tuple[str, ...]
    counts: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts for ``stats()``."""

    memories: int
    by_state: Mapping[str, int]
    by_role: Mapping[str, int]
    events: int
    searches: int
    feedbacks: int
    tokens_active: int
    embedder: str
    dim: int
    schema_version: int
    # What the ledger keeps of its traffic (store/pruning.py: judged and unjudged searches; answers waiting,
    # settled and expired; stored responses) and the bytes the ledger takes on disk (None: not known).
    kept: Mapping[str, int] = field(default_factory=dict)
    disk_bytes: int | None = field(default=None, compare=False)  # changes with every write: not compared
    # The store's re-ranker (learning/rerank_fit.py ``summary``): None when the store never ran it.
    reranker: Mapping[str, Any] | None = None
