"""Fitting the store's re-ranker (``ranking/rerank.py``) on the store's own answered searches, and when to.

Rows. Every served memory of the ``MAX_SEARCHES`` latest answered searches that recorded re-rank features (``r``
in the search record), labelled as the learned utility's rows are (``ranking/training.py``).

Fit. ``LearnedUtility.fit``: L2 logistic regression, the penalty chosen from ``LAMBDAS`` by the lowest
out-of-fold log-loss over ``FOLDS`` folds that split by search (a search's rows stay together; ties go to the
larger penalty). Nothing is fitted while some fold's training rows hold one label only: the store keeps serving
the utility's order.

Schedule. A fit is due once ``MIN_SEARCHES`` answered searches recorded re-rank features, and again each time
their count has grown by ``GROWTH`` since the last attempt (20, 30, 45, ...): a store fits about
``log(n / 20) / log(1.5)`` times over its first ``n`` answered searches, and a fit reads at most
``MAX_SEARCHES`` of them, so no feedback call waits on more than one bounded fit.

The attempt is kept in the ledger's meta (``META_KEY``), with its model when it fitted one, so every handle on
the store serves the same model and a reopened store does not fit again until more feedback came.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.ranking.learned import LearnedUtility
from remem_agent.ranking.rerank import StoreReranker
from remem_agent.ranking.training import TrainingSet, rerank_rows
from remem_agent.store.base import Store

META_KEY = "store_reranker"
MIN_SEARCHES = 20
GROWTH = 1.5
MAX_SEARCHES = 2000
FOLDS = 5
LAMBDAS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1)


@dataclass(frozen=True, kw_only=True)
class RerankState:
    """The last fit attempt: how many answered searches with re-rank features it read, and its model (None when
    the rows could not support one)."""

    attempted: int
    model: StoreReranker | None

    def to_json(self) -> str:
        model = None if self.model is None else json.loads(self.model.to_json())
        return json.dumps({"attempted": self.attempted, "model": model}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RerankState:
        """The state :meth:`to_json` wrote; anything else is a ``UserInputError``."""
        try:
            d: Any = json.loads(text)
            attempted = int(d["attempted"])
            model = d["model"]
        except (KeyError, TypeError, ValueError) as exc:
            raise UserInputError(f"not a stored re-ranker state: {exc}") from exc
        if attempted < 0:
            raise UserInputError("not a stored re-ranker state: a negative count")
        return cls(attempted=attempted, model=None if model is None else StoreReranker.from_json(json.dumps(model)))


def due(answered: int, state: RerankState | None) -> bool:
    """Whether a fit is due with ``answered`` answered searches holding re-rank features."""
    if answered < MIN_SEARCHES:
        return False
    return state is None or answered >= math.ceil(state.attempted * GROWTH)


def next_due(state: RerankState | None) -> int:
    """The count of answered searches at which the next fit is due."""
    return MIN_SEARCHES if state is None else max(MIN_SEARCHES, math.ceil(state.attempted * GROWTH))


def fit(rows: TrainingSet, *, searches: int, at: float) -> RerankState:
    """The fit on ``rows`` (groups: the folds), or a state without a model when some fold's training rows hold
    one label only."""
    folds = rows.group_names
    y = rows.y
    if len(folds) < 2 or any(len(set(y[rows.groups != g].tolist())) < 2 for g in folds):
        return RerankState(attempted=searches, model=None)
    fitted = LearnedUtility.fit(rows, LAMBDAS, cv="leave-one-group-out", explore="none")
    model = StoreReranker(
        weights=tuple(float(v) for v in fitted.weights),
        intercept=fitted.intercept,
        mean=tuple(float(v) for v in fitted.mean),
        std=tuple(float(v) for v in fitted.std),
        lam=fitted.lam,
        searches=searches,
        rows=len(rows),
        positives=rows.positives,
        fitted_at=at,
    )
    return RerankState(attempted=searches, model=model)


class RerankKeeper:
    """One store handle's view of its re-ranker: the model searches use, and the fits feedback makes due.

    The handle reads the stored state once, counts the feedback it gives from there, and when that count
    reaches :func:`next_due` reads the rows (their exact count), fits if still due and stores the state; a
    model another handle stored is picked up then too. Thread-safe: searches and feedback may run on worker
    threads (the async twins)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._state: RerankState | None = None
        self._loaded = False
        self._answered = 0  # answered searches with re-rank features, as far as this handle knows

    def _load(self) -> None:
        if not self._loaded:
            self._state = self._read()
            self._answered = 0 if self._state is None else self._state.attempted
            self._loaded = True

    def _read(self) -> RerankState | None:
        text = self._store.get_meta(META_KEY)
        return None if text is None else RerankState.from_json(text)

    @property
    def state(self) -> RerankState | None:
        """The last fit attempt this handle knows of (None before the first)."""
        with self._lock:
            self._load()
            return self._state

    def model(self) -> StoreReranker | None:
        """The model searches re-rank with (None until a fit produced one)."""
        state = self.state
        return None if state is None else state.model

    def answered(self, *, at: float) -> RerankState | None:
        """Note one more answered search; fit when one is due. Returns the state after it."""
        with self._lock:
            self._load()
            self._answered += 1
            if self._answered < next_due(self._state):
                return self._state
            return self._refit(at=at, force=False)

    def refit(self, *, at: float) -> RerankState:
        """Fit now on the store's answered searches, due or not (``ReMem.fit_reranker``)."""
        with self._lock:
            self._load()
            state = self._refit(at=at, force=True)
            assert state is not None
            return state

    def _refit(self, *, at: float, force: bool) -> RerankState | None:
        stored = self._read()
        if stored is not None and (self._state is None or stored.attempted > self._state.attempted):
            self._state = stored  # another handle fitted since
        rows, answered = rerank_rows(self._store, latest=MAX_SEARCHES, folds=FOLDS)
        self._answered = answered
        if not force and not due(answered, self._state):
            return self._state
        state = fit(rows, searches=answered, at=at)
        self._store.transact(lambda tx: tx.set_meta(META_KEY, state.to_json()))
        self._state = state
        return state


__all__ = [
    "FOLDS",
    "GROWTH",
    "MAX_SEARCHES",
    "META_KEY",
    "MIN_SEARCHES",
    "RerankKeeper",
    "RerankState",
    "due",
    "fit",
    "next_due",
]
