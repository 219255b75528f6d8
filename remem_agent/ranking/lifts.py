"""What a query says about when and who, turned into lifts of the candidates' retrieval scores (pure, no I/O).

Similarity alone does not read "in May 2023" or "What did Caroline ..." as constraints. Two lifts do:

- **time**: a query that names a time (resolved by :mod:`remem_agent.temporal` against the search's now, a
  question looking back) lifts each candidate said or valid from within that time, or whose text speaks of
  it (its stored mentions), by ``RememConfig.time_weight``. Not in an ``as_of`` search: there the question's
  time is the ``as_of``, and what was valid then is already decided by eligibility;
- **speaker**: a query that names a candidate's speaker (a word of the speaker's name, ignoring case, as a
  word of the query) lifts that candidate by ``RememConfig.speaker_weight``: a question about what Caroline
  did is mostly answered by what Caroline said.

The lifts add to the fused retrieval score in :func:`remem_agent.ranking.fusion.fuse` ("hybrid" and
"lexical" retrieval). Both weights were chosen on LoCoMo's dev conversations by leave-one-conversation-out
(``evals/bench/locomo_loco.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from remem_agent.temporal import TimeMention, matching, resolve
from remem_agent.types import Memory

_WORD = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True, slots=True)
class QueryContext:
    """The times a query names (resolved) and its words (lower-cased), read once per search."""

    times: tuple[TimeMention, ...]
    words: frozenset[str]

    @classmethod
    def of(cls, query: str, now: float | None, *, words: bool = True) -> QueryContext:
        """``now`` None reads no times; ``words`` False no words (a lift whose weight is 0 needs neither)."""
        times = resolve(query, now, past=True) if now is not None else ()
        found = frozenset(w.lower() for w in _WORD.findall(query)) if words else frozenset()
        return cls(times=times, words=found)


def names_speaker(words: frozenset[str], speaker: str | None) -> bool:
    """True when a word of ``speaker``'s name (two letters or more) is one of the query's ``words``."""
    if not speaker:
        return False
    return any(len(w) > 1 and w.lower() in words for w in _WORD.findall(speaker))


def lifts(
    ctx: QueryContext,
    pooled: Sequence[Memory],
    mentions: Mapping[str, Sequence[tuple[float, float]]],
    *,
    time_weight: float,
    speaker_weight: float,
) -> dict[str, float]:
    """Each pooled memory's lift (absent when 0): ``time_weight`` if it matches a time the query names,
    plus ``speaker_weight`` if the query names its speaker."""
    out: dict[str, float] = {}
    if ctx.times and time_weight > 0:
        said: Iterable[tuple[str, float]] = ((m.id, m.valid_from) for m in pooled)
        for mid in matching(ctx.times, said, mentions):
            out[mid] = time_weight
    if speaker_weight > 0 and ctx.words:
        for m in pooled:
            if names_speaker(ctx.words, m.speaker):
                out[m.id] = out.get(m.id, 0.0) + speaker_weight
    return out
