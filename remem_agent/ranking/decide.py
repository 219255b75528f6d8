"""The serving decision on a scored pool, apart from the memory rows: utility -> floor, guard and knapsack.

:class:`PoolView` holds exactly what selection reads of a candidate pool (every feature of every candidate, the
token costs, the guard's evidence, which texts are copies of each other) and nothing about the memories
themselves. A live search builds one from its pool (``ranking/pipeline.py``); a search made with exploratory
serving stores it (``ranking/explore.py``), so that another configuration can be asked what *it* would have
served on that same pool, which is what off-policy evaluation needs (``remem_agent/learning/ope.py``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import UserInputError
from remem_agent.ranking.policy import RankingPolicy
from remem_agent.ranking.select import guarded, key_twins, select
from remem_agent.ranking.utility import UtilityModel, own_record, prior_of

POOL_ENCODING = "f4-base64"  # how a stored pool writes its real-valued arrays


@dataclass(frozen=True, kw_only=True)
class PoolView:
    """What selection reads of a pool of ``n`` candidates (arrays of length ``n``, in pool order).

    ``shown`` and ``rate`` are the candidate's exposures and contribution rate in the search's task class (the
    guard's exemption reads them; ``shown`` is -1 where the ledger holds no statistics). ``text_keys`` gives
    candidates whose texts are equal up to case and blanks the same number.
    """

    features: Mapping[str, NDArray[np.float64]]
    similarity: NDArray[np.float64]
    tokens: NDArray[np.int64]
    shown: NDArray[np.int64]
    rate: NDArray[np.float64]
    text_keys: tuple[int, ...]
    k: int
    token_budget: int | None

    @property
    def size(self) -> int:
        return len(self.tokens)

    def scores(self, utility: UtilityModel) -> tuple[NDArray[np.float64], dict[str, NDArray[np.float64]]]:
        """The utility's scores of the pool, and their components."""
        try:
            return utility.score(dict(self.features))
        except KeyError as exc:  # a replay of a pool logged without a feature this utility reads
            raise UserInputError(f"this pool has no feature {exc.args[0]!r}, which the utility reads") from exc

    def choose(
        self,
        config: RankingPolicy,
        p: NDArray[np.float64],
        *,
        include: int | None = None,
    ) -> list[int]:
        """The indices ``config`` serves given scores ``p`` (best first); ``include`` is served whatever its score
        (:meth:`Selection.choose`)."""
        return self.selection(config, p).choose(include)

    def selection(self, config: RankingPolicy, p: NDArray[np.float64]) -> Selection:
        """``config``'s selection rules on this pool scored ``p``, worked out once for any number of choices.

        The ``p_floor`` grows with each candidate's outcome evidence (``evidence_all`` = n / (n + 2) exposures)
        under the default cold-start rule: a never-shown candidate's score only restates its retrieval score, so
        it has no floor and a fresh store serves ``k``. With ``p_floor_reference="best"`` the floor is a share of
        the pool's best score rather than a score of its own. With ``p_floor_exempt`` a candidate whose own record
        (:func:`~remem_agent.ranking.utility.own_record`) reaches it has no floor. The guard and the final order
        follow the retrieval score (the fused one in hybrid mode, the cosine without static features).
        """
        feats = self.features
        floors = (
            config.p_floor * feats["evidence_all"]
            if config.static_prior == "with_evidence" and "outcome" in config.features.groups
            else np.full(self.size, config.p_floor)
        )
        if config.p_floor_reference == "best" and self.size:
            # relative to the pool's best score: a floor on how much worse than the best candidate a memory may
            # be, so that a pool whose scores are all low (a question every memory matches weakly) is not emptied
            floors = floors * float(np.max(p))
        if config.p_floor_exempt is not None and "outcome" in config.features.groups and self.size:
            # what has helped more than its relevance promised is not dropped for being less similar than the best
            record = own_record(feats, prior_of(config.relevance_static, feats))
            floors = np.where(record >= config.p_floor_exempt, 0.0, floors)
        order_by = self.order_by(config)
        return Selection(
            view=self,
            config=config,
            p=p,
            floors=floors,
            order_by=order_by,
            # the guard's exemption: shown often enough for this task class and (almost) never useful
            exempt=(self.shown >= config.guard_min_shown) & (self.rate < config.guard_max_rate),
            twins=key_twins(self.text_keys, p, order_by),
        )

    def order_by(self, config: RankingPolicy) -> NDArray[np.float64]:
        """What the guard and ties in score follow: the retrieval score (the fused one in hybrid mode), or the
        cosine without static features."""
        return np.asarray(
            self.features["retrieval"] if "static" in config.features.groups else self.similarity, dtype=np.float64
        )

    # -- the stored form ---------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """A JSON-ready form: the real-valued arrays as little-endian float32, base64 (a pool of 40 candidates
        and 20 features is ~4 KB and decodes in microseconds; JSON numbers took 0.5 ms per search to parse)."""
        names = sorted(self.features)
        matrix = np.array([np.asarray(self.features[n], dtype=np.float64) for n in names]).reshape(len(names), -1)
        return {
            "encoding": POOL_ENCODING,
            "names": names,
            "features": _pack(matrix),
            "similarity": _pack(self.similarity),
            "rate": _pack(self.rate),
            "tokens": self.tokens.tolist(),
            "shown": self.shown.tolist(),
            "text_keys": list(self.text_keys),
            "k": self.k,
            "token_budget": self.token_budget,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PoolView:
        """The view :meth:`record` wrote; a record of another shape is a ``UserInputError``."""
        try:
            if rec["encoding"] != POOL_ENCODING:
                raise ValueError(f"unknown encoding {rec['encoding']!r}")
            tokens = np.asarray(rec["tokens"], dtype=np.int64)
            n = len(tokens)
            names = [str(x) for x in rec["names"]]
            matrix = _unpack(rec["features"]).reshape(len(names), n)
            view = cls(
                features={name: matrix[j] for j, name in enumerate(names)},
                similarity=_unpack(rec["similarity"]),
                tokens=tokens,
                shown=np.asarray(rec["shown"], dtype=np.int64),
                rate=_unpack(rec["rate"]),
                text_keys=tuple(int(x) for x in rec["text_keys"]),
                k=int(rec["k"]),
                token_budget=None if rec["token_budget"] is None else int(rec["token_budget"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise UserInputError(f"not a stored pool: {exc}") from exc
        arrays: Sequence[Any] = (view.similarity, view.shown, view.rate, view.text_keys)
        if any(len(a) != n for a in arrays):
            raise UserInputError("not a stored pool: its arrays differ in length")
        return view


@dataclass(frozen=True, kw_only=True)
class Selection:
    """The selection rules of one configuration on one scored pool (:meth:`PoolView.selection`): the floors,
    the guard's order and exemptions, and the copies of a better-scored text (``twins``, excluded)."""

    view: PoolView
    config: RankingPolicy
    p: NDArray[np.float64]
    floors: NDArray[np.float64]
    order_by: NDArray[np.float64]
    exempt: NDArray[np.bool_]
    twins: NDArray[np.bool_] | None

    def choose(self, include: int | None = None) -> list[int]:
        """The indices served (best first); ``include`` is served whatever its score."""
        view, config = self.view, self.config
        return select(
            self.p,
            self.order_by,
            view.tokens,
            k=view.k,
            token_budget=view.token_budget,
            p_floor=self.floors,
            guard_top=config.guard_top,
            guard_exempt=self.exempt,
            method=config.selection,
            item_cost=config.item_cost,
            exclude=self.twins,
            include=include,
        )

    def priority(self, chosen: Sequence[int]) -> list[int]:
        """``chosen`` in the order selection takes them: the guard's first (most similar first), then by ``p``.
        Its prefixes are what a smaller ``k``, a higher floor or a dearer memory would serve."""
        p, order_by = self.p, self.order_by
        taken = set(chosen)
        first = [i for i in guarded(order_by, self.config.guard_top, self.exempt, self.twins) if i in taken]
        rest = sorted(taken - set(first), key=lambda i: (-float(p[i]), -float(order_by[i]), i))
        return first + rest


def _pack(values: NDArray[np.float64]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


def _unpack(text: str) -> NDArray[np.float64]:
    return np.frombuffer(base64.b64decode(text.encode("ascii"), validate=True), dtype="<f4").astype(np.float64)
