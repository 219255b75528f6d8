"""Cost-aware selection: what from the ranked pool is worth the context it costs.

Three rules, in order (reference design §7 and §8.1):

1. Candidates whose predicted utility ``p`` is below ``p_floor`` are not worth context (``p_floor`` may be
   one value per candidate: ``rank_and_select`` scales it by each candidate's outcome evidence).
2. The similarity guard: the ``guard_top`` most similar candidates are always served, unless the
   ledger holds evidence they are useless for this task class (the caller passes that as
   ``guard_exempt``). It protects against the utility layer pushing out a correct, highly similar
   memory.
3. Under a hard token budget an exact 0/1 knapsack maximises the sum of ``p`` subject to the token
   and count limits; without a budget the top ``k`` by ``p`` are taken.

Candidates marked ``exclude`` take part in none of the three (the ranking passes the second and later copies
of a text: a served set never holds the same text twice, see :func:`text_twins`). ``include`` names one candidate
served whatever its score, before the guard: what an exploratory serving puts in (ranking/explore.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import cast

import numpy as np
from numpy.typing import NDArray

# Budgets above this are solved on a coarser token grid (weights rounded *up*, so the selection never
# exceeds the budget); below it the knapsack is exact.
EXACT_BUDGET_LIMIT = 4096
# Bound on the backtracking table (items x (k+1) x (budget+1) booleans): ~20 MB.
MAX_TABLE_CELLS = 20_000_000


def knapsack(values: NDArray[np.float64], weights: NDArray[np.int64], budget: int, max_items: int) -> list[int]:
    """Exact 0/1 knapsack with a cardinality limit: indices maximising sum(values).

    Items with non-positive value are never taken. Ties keep the earlier items.
    """
    n = len(values)
    if n == 0 or budget < 0 or max_items <= 0:
        return []
    w = np.asarray(weights, dtype=np.int64)
    k = min(max_items, n)
    # Grid size: exact up to EXACT_BUDGET_LIMIT tokens and MAX_TABLE_CELLS backtracking cells.
    limit = min(EXACT_BUDGET_LIMIT, max(64, MAX_TABLE_CELLS // (n * (k + 1))))
    if budget > limit:
        scale = math.ceil(budget / limit)
        w = -(-w // scale)
        budget = budget // scale
    neg = -np.inf
    dp = np.full((k + 1, budget + 1), neg)
    dp[0, :] = 0.0
    keep = np.zeros((n, k + 1, budget + 1), dtype=bool)
    for i in range(n):
        wi, vi = int(w[i]), float(values[i])
        if vi <= 0 or wi > budget:
            continue
        # Item i into every count j = 1..top at once: row j reads row j - 1 as it was before item i, which
        # is what the classic descending-j loop reads too, so the sums, comparisons and ties are the same.
        top = min(i + 1, k)
        cand = dp[:top, : budget + 1 - wi] + vi
        cur = dp[1 : top + 1, wi:]
        better = cand > cur + 1e-12
        keep[i, 1 : top + 1, wi:] = better
        dp[1 : top + 1, wi:] = np.where(better, cand, cur)
    best_j = int(np.argmax(dp[:, budget]))
    if not np.isfinite(dp[best_j, budget]) or dp[best_j, budget] <= 0:
        return []
    chosen: list[int] = []
    j, b = best_j, budget
    for i in range(n - 1, -1, -1):
        if j > 0 and keep[i, j, b]:
            chosen.append(i)
            b -= int(w[i])
            j -= 1
    return sorted(chosen)


def fold(text: str) -> str:
    """``text`` up to case and blanks: what two copies of one note share."""
    return " ".join(text.casefold().split())


class FoldMemo:
    """Folded texts (:func:`fold`) by text, bounded, so that a search folds only the texts it has not met yet.

    A store's read cache hands every search the same text objects, whose hashes Python keeps, so one lookup per
    text in C replaces a fold per text in Python (folding a pool's ~60 texts was ~2 % of a search at 10k
    memories). It holds texts, so an erasure empties it (:func:`forget_folded_texts`); when full it starts over.
    """

    def __init__(self, max_texts: int = 16_384) -> None:
        self.max_texts = max_texts
        self._folded: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._folded)

    def folded(self, texts: Sequence[str]) -> list[str]:
        """Each of ``texts`` folded, in order."""
        memo = self._folded
        out: list[str | None] = list(map(memo.get, texts))
        if None in out:  # texts not met yet: fold them once
            if len(memo) + len(out) > self.max_texts:
                memo.clear()
            for i, t in enumerate(texts):
                if out[i] is None:
                    out[i] = memo[t] = fold(t)
        return cast("list[str]", out)

    def clear(self) -> None:
        self._folded.clear()


_MEMO = FoldMemo()


def forget_folded_texts() -> None:
    """Empty the memo of folded texts, so that no erased text stays in this process's memory through it."""
    _MEMO.clear()


def text_keys(texts: Sequence[str]) -> tuple[int, ...]:
    """One group number per text: texts equal up to case and blanks share the number of the first of them
    (``0, 1, 2, ...`` when all differ, the common case)."""
    folded = _MEMO.folded(texts)
    if len(set(folded)) == len(folded):
        return tuple(range(len(folded)))
    first: dict[str, int] = {}
    return tuple([first.setdefault(f, i) for i, f in enumerate(folded)])


def text_twins(texts: list[str], p: NDArray[np.float64], similarity: NDArray[np.float64]) -> NDArray[np.bool_] | None:
    """True for every candidate whose text (case and blanks aside) another candidate with a higher ``p`` (then
    similarity, then earlier position) also has: the copy that would add nothing to a served set but its cost.
    None when all texts differ (the common case: nothing to exclude)."""
    return key_twins(text_keys(texts), p, similarity)


def key_twins(
    keys: Sequence[Hashable], p: NDArray[np.float64], similarity: NDArray[np.float64]
) -> NDArray[np.bool_] | None:
    """:func:`text_twins` over group keys (:func:`text_keys`) instead of the texts."""
    if len(set(keys)) == len(keys):
        return None
    best: dict[Hashable, int] = {}
    for i, key in enumerate(keys):
        j = best.get(key)
        if j is None or (p[i], similarity[i]) > (p[j], similarity[j]):
            best[key] = i
    twins = np.ones(len(keys), dtype=bool)
    twins[list(best.values())] = False
    return twins


def guarded(
    similarity: NDArray[np.float64],
    guard_top: int,
    guard_exempt: NDArray[np.bool_] | None,
    exclude: NDArray[np.bool_] | None,
) -> list[int]:
    """The candidates the similarity guard serves, most similar first: the ``guard_top`` most similar of those not
    excluded, less the exempt ones."""
    if guard_top <= 0:
        return []
    ranked = np.argsort(-similarity, kind="stable")
    if exclude is not None:
        ranked = ranked[~exclude[ranked]]
    return [int(i) for i in ranked[:guard_top] if guard_exempt is None or not guard_exempt[i]]


def select(
    p: NDArray[np.float64],
    similarity: NDArray[np.float64],
    tokens: NDArray[np.int64],
    *,
    k: int,
    token_budget: int | None = None,
    p_floor: float | NDArray[np.float64] = 0.0,
    guard_top: int = 0,
    guard_exempt: NDArray[np.bool_] | None = None,
    method: str = "knapsack",
    exclude: NDArray[np.bool_] | None = None,
    item_cost: float = 0.0,
    include: int | None = None,
) -> list[int]:
    """Indices to serve, ordered by ``p`` (best first).

    ``method="greedy"`` fills the budget in ``p`` order, skipping what does not fit: what a plain
    similarity search truncated to a budget does (system A/B of the evaluation). ``item_cost`` is what each
    memory costs the knapsack (it maximises the sum of ``p - item_cost``): two weak memories no longer
    outweigh one strong one that costs the same tokens.
    """
    n = len(p)
    if n == 0 or k <= 0:
        return []
    forced: list[int] = [] if include is None else [include]
    forced += [i for i in guarded(similarity, guard_top, guard_exempt, exclude) if i != include]
    # Vectorised, with the per-candidate semantics: p >= floor elementwise (NaN p is never eligible), the
    # guarded candidates excluded, indices ascending; the sorts below are Python's stable sorts on the same
    # float keys (-p, -similarity), as plain lists so each comparison is a float's, not a numpy scalar's.
    floor = np.asarray(p_floor, dtype=np.float64)
    if floor.ndim and floor.shape != (n,):
        floor = np.broadcast_to(floor, (n,))  # one value per candidate, or the same shape error as before
    ok = p >= floor
    if exclude is not None:
        ok &= ~exclude
    if forced:
        ok[forced] = False
    eligible: list[int] = np.flatnonzero(ok).tolist()
    neg_p: list[float] = (-p).tolist()
    by_p = neg_p.__getitem__
    if token_budget is None:
        forced = forced[:k]
        rest = sorted(eligible, key=by_p)[: k - len(forced)]
        chosen = forced + rest
    else:
        chosen, used = [], 0
        for i in forced:  # the included one, then most similar first; skip a guarded item that cannot fit
            if len(chosen) < k and used + int(tokens[i]) <= token_budget:
                chosen.append(i)
                used += int(tokens[i])
        idx = np.array(eligible, dtype=np.int64)
        if method == "greedy":
            for i in sorted(eligible, key=by_p):
                if len(chosen) < k and used + int(tokens[i]) <= token_budget:
                    chosen.append(i)
                    used += int(tokens[i])
        elif len(idx) and len(chosen) < k:
            picked = knapsack(p[idx] - item_cost, tokens[idx], token_budget - used, k - len(chosen))
            chosen += [int(idx[j]) for j in picked]
    neg_sim: list[float] = (-np.asarray(similarity)).tolist()
    return sorted(chosen, key=lambda i: (neg_p[i], neg_sim[i]))
