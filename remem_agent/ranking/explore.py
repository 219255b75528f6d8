"""Exploratory serving with logged propensities: a stochastic policy whose every probability is known exactly.

A memory that is never served can never show that it helps, and a smaller set can never show that it would
have done as well. With ``RememConfig(explore_serving=eps)`` a search serves, with probability ``1 - eps``, the
set the configured ranking chooses (``S*``, in serving order), and otherwise one of ``m`` alternatives, each
with probability ``eps / m``:

* *put in*: for each of the ``explore_width`` best-scored candidates left out of ``S*``, the set chosen when it
  is put in whatever its score (the ranking then fills the rest of ``k`` and of the token budget as usual);
* *cut short*: each proper prefix of ``S*``, in the order selection takes its members (the guard's first,
  then by score), that holds at least one memory: what a higher floor, a smaller ``k`` or a dearer memory
  would serve. It is served in ``S*``'s own order, only shorter.

Alternatives that coincide are one set whose probabilities add up. So the whole distribution over served sets
is finite and written out:

    P(S) = (1 - eps) [S = S*] + (eps / m) #{alternatives a : S_a = S}

and each candidate's inclusion probability is the sum of P(S) over the sets holding it. Both are computed at
serve time from ``m + 1`` selections, no sampling, and stored with the search in the same transaction (ledger
schema 15), beside the pool's features, so the logged decision can be re-scored under another configuration
(``remem_agent/learning/ope.py``).

The draw itself is a number in [0, 1) derived from ``explore_seed`` and the search's query, task class, scope
and times (:func:`draw_for`): a rerun of the same searches serves the same sets, bit for bit, in any order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

POLICY_NAME = "epsilon-alternatives"


@dataclass(frozen=True, kw_only=True)
class ServingDraw:
    """The served set of one search and the distribution it was drawn from (indices into the pool)."""

    chosen: tuple[int, ...]  # the served candidates, in serving order
    greedy: tuple[int, ...]  # S*: what the ranking alone serves
    support: tuple[tuple[tuple[int, ...], float], ...]  # every possible set (sorted indices) and its probability
    inclusion: NDArray[np.float64]  # per candidate: the probability that it is served
    probability: float  # of the drawn set
    explored: int | None  # which alternative was drawn (its position in the list of alternatives; None: S*)

    def record(self, *, epsilon: float, width: int, seed: int, u: float) -> dict[str, Any]:
        """The JSON-ready policy part of the stored decision."""
        return {
            "name": POLICY_NAME,
            "epsilon": epsilon,
            "width": width,
            "seed": seed,
            "u": u,
            "chosen": list(self.chosen),
            "greedy": list(self.greedy),
            "support": [[list(s), p] for s, p in self.support],
            "inclusion": self.inclusion.round(12).tolist(),
            "probability": self.probability,
            "explored": self.explored,
        }


def draw_for(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) fixed by ``seed`` and the search's identifying ``parts``."""
    text = "|".join(repr(p) for p in (seed, *parts))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def explore_candidates(
    p: NDArray[np.float64],
    greedy: tuple[int, ...],
    *,
    width: int,
    excluded: NDArray[np.bool_] | None,
    fits: NDArray[np.bool_],
) -> list[int]:
    """The candidates an exploratory draw may put in: the ``width`` best-scored (ties: pool order) of those
    left out of ``greedy`` that are not copies of a served text (``excluded``) and fit the budget alone."""
    left = np.ones(len(p), dtype=bool)
    left[list(greedy)] = False
    left &= fits & ~np.isnan(p)
    if excluded is not None:
        left &= ~excluded
    idx = np.flatnonzero(left)
    order = sorted(idx.tolist(), key=lambda i: (-float(p[i]), i))
    return order[:width]


def draw(
    choose: Callable[[int | None], list[int]],
    p: NDArray[np.float64],
    *,
    priority: Callable[[tuple[int, ...]], list[int]] = list,
    epsilon: float,
    width: int,
    u: float,
    excluded: NDArray[np.bool_] | None,
    fits: NDArray[np.bool_],
) -> ServingDraw:
    """Draw a served set with number ``u``. ``choose(j)`` is the ranking's selection with candidate ``j`` put in
    (``None``: the plain selection, ``S*``, in serving order); ``priority(S*)`` orders ``S*`` as selection takes
    its members, whose prefixes are the cut-short alternatives (default: the serving order)."""
    n = len(p)
    greedy = tuple(choose(None))
    alternatives: list[tuple[int, ...]] = []
    if epsilon > 0:
        alternatives = [
            tuple(choose(j)) for j in explore_candidates(p, greedy, width=width, excluded=excluded, fits=fits)
        ]
        order = tuple(priority(greedy))
        # each prefix is served in S*'s own order (the ranking's), only shorter
        alternatives += [tuple(i for i in greedy if i in order[:m]) for m in range(1, len(order))]
    if not alternatives:
        inclusion = np.zeros(n)
        inclusion[list(greedy)] = 1.0
        return ServingDraw(
            chosen=greedy,
            greedy=greedy,
            support=((tuple(sorted(greedy)), 1.0),),
            inclusion=inclusion,
            probability=1.0,
            explored=None,
        )
    sets: dict[tuple[int, ...], float] = {tuple(sorted(greedy)): 1.0 - epsilon}
    share = epsilon / len(alternatives)
    for alt in alternatives:
        key = tuple(sorted(alt))
        sets[key] = sets.get(key, 0.0) + share
    inclusion = np.zeros(n)
    for key, prob in sets.items():
        inclusion[list(key)] += prob
    explored: int | None = None
    chosen = greedy
    if u >= 1.0 - epsilon:
        explored = min(int((u - (1.0 - epsilon)) / share), len(alternatives) - 1)
        chosen = alternatives[explored]
    return ServingDraw(
        chosen=chosen,
        greedy=greedy,
        support=tuple(sorted(sets.items())),
        inclusion=inclusion,
        probability=sets[tuple(sorted(chosen))],
        explored=explored,
    )
