"""Fitting the store's re-ranker (``ranking/rerank.py``) on the store's own answered searches, and when to.

Rows. Every served memory of the ``MAX_SEARCHES`` latest answered searches that recorded re-rank features (``r``
in the search record), labelled as the learned utility's rows are (``ranking/training.py``).

Fit. ``LearnedUtility.fit``: L2 logistic regression, the penalty chosen from ``LAMBDAS`` by the lowest
out-of-fold log-loss over ``FOLDS`` folds that split by search (a search's rows stay together; ties go to the
larger penalty). Nothing is fitted while some fold's training rows hold one label only: the store keeps serving
the utility's order.

Schedule. The store counts its answered searches from a baseline: how many it had when it first searched or
took feedback with the re-ranker on. A fit is due once ``MIN_SEARCHES`` were answered since, and again each time
that count has grown by ``GROWTH`` since the last attempt (20, 30, 45, ...): about ``log(n / 20) / log(1.5)``
fits over the first ``n``. A fit reads the ``MAX_SEARCHES`` latest answered searches, so no feedback call waits
on more than one bounded fit.

The state (baseline, last attempt and its model) is kept in the ledger's meta (``META_KEY``), so every handle on
the store serves the same model and a reopened store does not fit again until more feedback came.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.ranking.learned import LearnedUtility
from remem_agent.ranking.rerank import RERANK_FEATURES, StoreReranker
from remem_agent.ranking.training import TrainingSet, rerank_rows
from remem_agent.store.base import Store

log = logging.getLogger("remem_agent.learning.rerank_fit")

META_KEY = "store_reranker"
MIN_SEARCHES = 20
GROWTH = 1.5
MAX_SEARCHES = 2000
FOLDS = 5
LAMBDAS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1)


@dataclass(frozen=True, kw_only=True)
class RerankState:
    """The store's re-ranker: how many answered searches the last fit attempt counted (0 before the first), its
    model (None when the rows could not support one), and ``baseline``, the store's answered searches when it
    began recording re-rank features (they are counted from there)."""

    attempted: int
    model: StoreReranker | None
    baseline: int = 0

    def to_json(self) -> str:
        model = None if self.model is None else json.loads(self.model.to_json())
        return json.dumps({"attempted": self.attempted, "baseline": self.baseline, "model": model}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RerankState:
        """The state :meth:`to_json` wrote; anything else is a ``UserInputError``."""
        try:
            d: Any = json.loads(text)
            attempted, baseline = int(d["attempted"]), int(d["baseline"])
            model = d["model"]
        except (KeyError, TypeError, ValueError) as exc:
            raise UserInputError(f"not a stored re-ranker state: {exc}") from exc
        if attempted < 0 or baseline < 0:
            raise UserInputError("not a stored re-ranker state: a negative count")
        return cls(
            attempted=attempted,
            baseline=baseline,
            model=None if model is None else StoreReranker.from_json(json.dumps(model)),
        )


def next_due(state: RerankState) -> int:
    """The count of answered searches (since the baseline) at which the next fit is due."""
    return max(MIN_SEARCHES, math.ceil(state.attempted * GROWTH))


def due(answered: int, state: RerankState) -> bool:
    """Whether a fit is due with ``answered`` answered searches since the baseline."""
    return answered >= next_due(state)


def fit(rows: TrainingSet, *, searches: int, at: float, baseline: int = 0) -> RerankState:
    """The fit on ``rows`` (groups: the folds) after ``searches`` answered searches, or a state without a model
    when some fold's training rows hold one label only."""
    folds = rows.group_names
    y = rows.y
    if len(folds) < 2 or any(len(set(y[rows.groups != g].tolist())) < 2 for g in folds):
        return RerankState(attempted=searches, model=None, baseline=baseline)
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
    return RerankState(attempted=searches, model=model, baseline=baseline)


class RerankKeeper:
    """One store handle's view of its re-ranker: the model searches use, and the fits feedback makes due.

    The first search or feedback reads the stored state, or, in a store that has none, stores one whose baseline
    is the store's answered searches then. The handle counts the feedback it gives; when its count says a fit may
    be due, it counts the store's answered searches since the baseline (one query), and fits when one is due.
    A state another handle stored is picked up then. With several handles giving feedback, each counts only its
    own, so a fit can come up to that many times later than the schedule says. Searches never wait for a fit:
    they read the state in place while a fit runs, and a fit that finds another running skips (that one covers
    it)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._load_lock = threading.Lock()
        self._fit_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._state: RerankState | None = None
        self._given = 0  # feedback this handle gave since the state it holds

    def _loaded(self) -> RerankState:
        state = self._state
        if state is not None:
            return state
        with self._load_lock:
            if self._state is None:
                text = self._store.get_meta(META_KEY)
                if text is None:
                    fresh = RerankState(attempted=0, model=None, baseline=self._judged())
                    text = self._store.set_meta_default(META_KEY, fresh.to_json())
                self._state = RerankState.from_json(text)
            return self._state

    def _judged(self) -> int:
        with self._store.read() as tx:
            return tx.search_counts()[1]

    @property
    def state(self) -> RerankState:
        """The state this handle serves by."""
        return self._loaded()

    def model(self) -> StoreReranker | None:
        """The model searches re-rank with (None until a fit produced one)."""
        return self._loaded().model

    def answered(self, *, at: float) -> None:
        """Note one more answered search; fit when one is due. A fit that fails on the store's rows (a
        ``UserInputError``, e.g. a non-finite stored feature) is logged as a warning, not raised: the feedback it
        follows is already stored."""
        state = self._loaded()
        with self._count_lock:
            self._given += 1
            given = self._given
        if state.attempted + given < next_due(state) or not self._fit_lock.acquire(blocking=False):
            return
        try:
            self._refit(at=at, force=False)
        except UserInputError as exc:
            # The feedback itself is already stored: a fit that cannot read its rows must not make it look failed.
            # The store keeps serving the state it has, and the handle tries again once as many answers came.
            log.warning("the store re-ranker could not be fitted: %s", exc)
            with self._count_lock:
                self._given = 0
        finally:
            self._fit_lock.release()

    def refit(self, *, at: float) -> RerankState:
        """Fit now on the store's answered searches, due or not (``ReMem.fit_reranker``)."""
        self._loaded()
        with self._fit_lock:
            return self._refit(at=at, force=True)

    def _refit(self, *, at: float, force: bool) -> RerankState:
        text = self._store.get_meta(META_KEY)
        state = self._loaded() if text is None else RerankState.from_json(text)  # another handle may have fitted
        answered = max(0, self._judged() - state.baseline)
        if force or due(answered, state):
            rows = rerank_rows(self._store, latest=MAX_SEARCHES, folds=FOLDS, feature_names=RERANK_FEATURES)
            state = fit(rows, searches=answered, at=at, baseline=state.baseline)
            self._store.transact(lambda tx: tx.set_meta(META_KEY, state.to_json()))
        with self._count_lock:
            self._state, self._given = state, 0
        return state


def summary(store: Store) -> dict[str, Any] | None:
    """The store re-ranker's state as ``stats()`` shows it: the answered searches its last fit counted, its
    baseline and its model (each feature's weight per standard deviation, the penalty, the rows); None when the
    store never ran it."""
    stored = store.get_meta(META_KEY)
    if stored is None:
        return None
    state = RerankState.from_json(stored)
    return {
        "answered_at_last_fit": state.attempted,
        "baseline": state.baseline,
        "model": None if state.model is None else state.model.describe(),
    }


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
    "summary",
]
