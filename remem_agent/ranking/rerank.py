"""The store's re-ranker: a small model, fitted on the store's own feedback, that re-orders a ranking's head.

The utility (``ranking/utility.py``) scores each candidate from what the ledger knows about that memory. The
re-ranker looks at how a candidate sits in *this* query's ranking instead: its place and score against the best,
what the search explains of its score, whether the query names its speaker, how much of the ranking's head its
conversation session holds, and whether it holds a time expression when the query asks "when". What those say
about usefulness differs between stores (a store of conversation turns is not one of facts), so each store fits
its own model on its answered searches (``learning/rerank_fit.py``) when ``RememConfig.rerank="store"``.

Model. An L2 logistic regression on standardised features (``ranking/learned.py``): ``z = b + w . (x - mean) /
std``. Labels are those of the learned utility's training rows (the task succeeded and the memory's credit is at
least 0.5).

Re-ordering. The ``RERANK_DEPTH`` best candidates of the utility's order keep their scores as a set, handed out
again in the order of the model's ``z`` (ties keep the utility's order); the rest of the pool keeps its scores.
Selection (floor, knapsack, ``k``) and exploratory serving then read the re-ordered scores, so the propensities a
search logs are those of the scores it served by.

``search(..., explain=True)`` shows a candidate's logit as ``component.rerank`` when it was in the head.

Everything here is pure: the features of a pool and the re-ordering of its scores.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import UserInputError
from remem_agent.ranking.learned import LearnedUtility
from remem_agent.types import Memory

RERANK_FEATURES: tuple[str, ...] = (
    "similarity",
    "lexical",
    "retrieval",
    "tokens",
    "gap",
    "log_place",
    "score_ratio",
    "speaker_named",
    "length",
    "session_share",
    "timed",
    "timed_when",
)
RERANK_DEPTH = 20  # how many of the utility's best candidates the model re-orders
SESSION_DEPTH = 20  # a session's share of the ranking is counted over this many places
LENGTH_SCALE = 200.0  # characters; the length feature is the text's length over this
FORMAT = "remem-agent/store-reranker"
FORMAT_VERSION = 1

# A time expression: a digit, a relative day or season, a month or a weekday.
TIME_EXPRESSION = re.compile(
    r"\d|\b(?:yesterday|today|tomorrow|ago|tonight|weekend|(?:last|next|this) (?:week|month|year|night|summer|"
    r"winter|spring|fall)|january|february|march|april|may|june|july|august|september|october|november|december|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"\w+")
_STATIC = ("similarity", "lexical", "retrieval", "tokens", "gap")


@lru_cache(maxsize=65_536)
def _timed(text: str) -> bool:
    """Whether ``text`` holds a time expression (cached: a store's texts recur in every pool they enter)."""
    return bool(TIME_EXPRESSION.search(text))


@lru_cache(maxsize=4_096)
def _speaker_words(speaker: str) -> frozenset[str]:
    return frozenset(_WORD.findall(speaker.lower()))


def utility_order(p: NDArray[np.float64], order_by: NDArray[np.float64]) -> NDArray[np.int64]:
    """The pool's indices best first, as selection orders them: by score, then by ``order_by`` (the retrieval
    score), then by index."""
    idx = np.arange(len(p))
    return np.lexsort((idx, -np.asarray(order_by, dtype=np.float64), -np.asarray(p, dtype=np.float64)))


def asks_when(query: str) -> bool:
    """Whether ``query`` asks when (its first word is "when")."""
    words = _WORD.findall(query.lower())
    return bool(words) and words[0] == "when"


def rerank_features(
    *,
    query: str,
    memories: Sequence[Memory],
    features: Mapping[str, NDArray[np.float64]],
    p: NDArray[np.float64],
    order: NDArray[np.int64],
) -> NDArray[np.float64]:
    """One row per candidate of the pool (in pool order, ``RERANK_FEATURES`` columns): how it sits in the ranking
    ``order`` of scores ``p`` for ``query``. Static features the pool lacks (a configuration without the static
    group) are 0."""
    n = len(memories)
    out = np.zeros((n, len(RERANK_FEATURES)), dtype=np.float64)
    if n == 0:
        return out
    for j, name in enumerate(_STATIC):
        col = features.get(name)
        if col is not None:
            out[:, j] = col
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)
    top = float(p[order[0]])
    ratio = np.asarray(p, dtype=np.float64) / (top if top > 0 else 1.0)
    sessions = [m.session for m in memories]
    share: dict[str, float] = {}
    for i in order[:SESSION_DEPTH].tolist():
        session = sessions[i]
        if session is not None:
            share[session] = share.get(session, 0.0) + float(ratio[i])
    words = frozenset(_WORD.findall(query.lower()))
    base = len(_STATIC)
    out[:, base] = np.log1p(place)
    out[:, base + 1] = ratio
    out[:, base + 2] = [bool(m.speaker) and _speaker_words(m.speaker or "") <= words for m in memories]
    out[:, base + 3] = [len(m.text) / LENGTH_SCALE for m in memories]
    out[:, base + 4] = [share.get(x, 0.0) if x is not None else 0.0 for x in sessions]
    timed = np.array([_timed(m.text) for m in memories], dtype=np.float64)
    out[:, base + 5] = timed
    out[:, base + 6] = timed if asks_when(query) else 0.0
    return out


@dataclass(frozen=True, kw_only=True)
class StoreReranker:
    """A fitted re-ranker: the logistic model and what it was fitted on (``searches`` answered searches, ``rows``
    served rows of which ``positives`` were used), with the penalty cross-validation chose."""

    weights: tuple[float, ...]
    intercept: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    lam: float
    searches: int
    rows: int
    positives: int
    fitted_at: float
    feature_names: tuple[str, ...] = RERANK_FEATURES
    _model: LearnedUtility = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.feature_names != RERANK_FEATURES:
            raise UserInputError(
                f"a re-ranker of features {list(self.feature_names)}; this remem-agent uses {list(RERANK_FEATURES)}"
            )
        if not math.isfinite(self.lam):
            raise UserInputError("a re-ranker's penalty must be finite")
        # the logistic model itself, and its checks (one weight, mean and std per feature, finite, stds positive)
        model = LearnedUtility(
            self.weights, self.intercept, self.mean, self.std, feature_names=self.feature_names, lam=self.lam
        )
        object.__setattr__(self, "_model", model)

    def logits(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The model's ``z`` of each row of ``X``."""
        return self._model.logits(X)

    def reorder(
        self, p: NDArray[np.float64], head: NDArray[np.int64], X: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``p`` with the candidates of ``head`` (the utility order's first ``RERANK_DEPTH``, best first) re-ordered
        by the model's ``z`` on the rows ``X`` (pool order): the head's scores, best first, handed out in ``z``'s
        order (ties in ``z`` keep ``head``'s order; tied scores are split by the smallest float step, so selection
        keeps that order). Also ``z`` per candidate (NaN outside the head)."""
        z = np.full(len(p), np.nan, dtype=np.float64)
        if len(head) < 2:
            return np.asarray(p, dtype=np.float64), z
        z[head] = self.logits(X[head])
        ranked = sorted(range(len(head)), key=lambda r: (-float(z[head[r]]), r))
        out = np.array(p, dtype=np.float64)
        values = np.sort(np.asarray(p, dtype=np.float64)[head])[::-1]
        for r in range(len(values) - 2, -1, -1):  # tied scores would let selection's tie-break undo the order:
            if values[r] <= values[r + 1]:  # split them upward, so the head's last still ties or beats the rest
                values[r] = np.nextafter(values[r + 1], np.inf)
        out[head[ranked]] = values
        return out, z

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "feature_names": list(self.feature_names),
                "weights": list(self.weights),
                "intercept": self.intercept,
                "mean": list(self.mean),
                "std": list(self.std),
                "lam": self.lam,
                "searches": self.searches,
                "rows": self.rows,
                "positives": self.positives,
                "fitted_at": self.fitted_at,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> StoreReranker:
        """The re-ranker :meth:`to_json` wrote; anything else is a ``UserInputError``."""
        try:
            d: Any = json.loads(text)
            if d["format"] != FORMAT or d["version"] != FORMAT_VERSION:
                raise ValueError(f"not a {FORMAT} version {FORMAT_VERSION} record")
            return cls(
                weights=tuple(float(v) for v in d["weights"]),
                intercept=float(d["intercept"]),
                mean=tuple(float(v) for v in d["mean"]),
                std=tuple(float(v) for v in d["std"]),
                lam=float(d["lam"]),
                searches=int(d["searches"]),
                rows=int(d["rows"]),
                positives=int(d["positives"]),
                fitted_at=float(d["fitted_at"]),
                feature_names=tuple(str(v) for v in d["feature_names"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserInputError(f"not a stored re-ranker: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        """The model as a reader inspects it: each feature's weight (per standard deviation) and the fit's size."""
        return {
            "weights": dict(zip(self.feature_names, self.weights, strict=True)),
            "intercept": self.intercept,
            "lam": self.lam,
            "searches": self.searches,
            "rows": self.rows,
            "positives": self.positives,
            "fitted_at": self.fitted_at,
        }


__all__ = [
    "RERANK_DEPTH",
    "RERANK_FEATURES",
    "TIME_EXPRESSION",
    "StoreReranker",
    "asks_when",
    "rerank_features",
    "utility_order",
]
