"""How much can outcome feedback on some LoCoMo questions lift recall on the others? Bounds, not a learner.

    python -m evals.bench.locomo_transfer_bound --data locomo-dev.json [--system ReMem] [--embedder minilm]
        [--out results/locomo]

The learning-transfer protocol of ``evals.bench.run_locomo --transfer`` gives feedback on the even-index
questions of each conversation (``used_ids`` = the served evidence turns) and measures recall@k on the odd-index
ones. Whatever a learner keeps per memory, what it learned is a partition of the turns by that feedback:

* ``used``: served for some even question and evidence of it (the only turns feedback calls useful);
* ``unused``: served for some even question and never evidence of one it was served for;
* ``unseen``: never served.

This script runs the protocol's learning arm (the same searches and feedback) and records that partition, then
re-orders each odd question's cold top-10 (the cold arm's searches, exactly as the protocol's) by it and reports
recall@k of each re-ordering beside the cold and the learned figures:

* ``promote used``: used turns first (a learner that trusts positive feedback across questions);
* ``demote unused``: unused turns last (a learner that trusts negative feedback across questions);
* ``promote used, demote unused``: both;
* ``oracle: promote used evidence``: only the used turns that are evidence of *this* odd question move first
  (needs the odd question's answer: no learner can do it, an upper bound within the top-10);
* ``ceiling``: the cold top-k's evidence plus every used turn that is evidence of this question, wherever it
  ranks, as if the top-k had room for all of them (looser still: a bound for any re-ranking by what feedback
  taught, capacity ignored).

The bound says nothing about a learner that generalises through features rather than turns, so one is run
beside it: ``features (LearnedUtility)`` fits the library's logistic utility (``ranking/learned.py``, k-fold
CV over its L2 grid, no exploration) on the feedback rows of the even questions (each served turn's feature
snapshot, labelled by the credit it got) and ranks the odd questions with it.

A learner that keeps verdicts per turn *and* per question neighbourhood is run too: ``neighbourhood (kNN,
LOCO)`` re-ranks each odd question's cold top-``N`` (up to 30, so it can bring in turns the top-10 lacks) by its
retrieval score (or its rank) plus, for every even question whose embedding's cosine with it exceeds ``tau``,
``a * (cos - tau)`` for a turn that question used and ``-b * (cos - tau)`` for one it was served and did not use.
Its settings are chosen on the other conversations (leave one conversation out, from ``NEIGHBOURHOOD_GRID``;
with one conversation, nothing is learned and the cold top-``N`` order stays).

A learner that generalises through the embedding space is run as well: ``embedding adapter (LOCO)`` fits, per
conversation, an L2 logistic regression on the elementwise product of an even question's embedding and each
served turn's (label: used), and re-ranks each odd question's cold top-``N`` by its retrieval score plus
``weight`` times that model's logit. Its settings (``ADAPTER_GRID``) are chosen leaving one conversation out too.

A learner that generalises through what surrounds a turn is the third: ``context re-ranker (LOCO)`` fits, per
conversation, an L2 logistic regression on features of each turn an even question was served (label: used):
its retrieval score and the parts the search explains (similarity, lexical match, length, gap to the top), its
rank, whether its speaker is named in the question, and, by ``features``, the retrieval scores of the turns
before and after it in its session and how much of the question's top-20 its session holds (``context``), and
whether it holds a time expression, alone and for a "when" question (``context+time``). It re-ranks each odd
question's cold top-``N`` by that model's logit. Its settings (``RERANKER_GRID``) are chosen leaving one
conversation out as well.

The re-ranker is also run as a store could run it with no other conversation to choose on: ``fixed design,
penalty by own CV`` fixes ``RERANKER_DESIGN`` (every feature, the top-20 re-ranked) and chooses the penalty by
cross-validation on the conversation's own feedback rows.

A learner that generalises through the conversation's sessions is the fourth: ``session credit (LOCO)`` adds to
each odd question's retrieval score (over the best) ``w`` times the log credit factor of the memory's session,
``log((alpha + uses) / (alpha + r * exposures))`` over the even questions' feedback (``r`` the conversation's use
rate), and re-ranks its cold top-``N`` by that. Its settings (``SESSION_GRID``) are chosen leaving one
conversation out.

Every learner here re-orders some depth of the cold ranking, so ``oracle: evidence of the cold top-N first``
bounds them all at each depth of ``ORACLE_DEPTHS``: the members of each odd question's cold top-``N`` that hold
one of its evidence turns move first (it needs the question's answer).

All of them are also reported ``tuned on test``: each conversation's settings chosen on its own odd questions'
recall@5. No learner can choose so (it needs the answers it is scored on); the rows bound what the learner
families could show on these conversations with the luckiest settings of their grids.

Also reported: the shares of the odd questions' evidence turns in each part of the partition. Paired
differences against cold carry their 95% t-interval (``evals/harness/stats.py``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from evals.bench.retrieval import KS, command_line, select_systems, write_outputs
from evals.bench.run_locomo import (
    CATEGORIES,
    SCORED,
    TASK,
    give_feedback,
    load_samples,
    recall_at,
    sample_questions,
    sample_turns,
    store_turns,
    transfer_arms,
)
from evals.harness.embedders import make_embedder
from evals.harness.replay import temp_store
from evals.harness.stats import estimate, paired
from evals.harness.systems import System
from remem_agent.ranking.learned import LearnedUtility, fit_logistic
from remem_agent.ranking.rerank import TIME_EXPRESSION
from remem_agent.ranking.training import TrainingSet, training_rows

Ranked = list[set[str]]
NeighbourhoodParams = tuple[float, float, float, int, str]
AdapterParams = tuple[float, float, int]
P = TypeVar("P")  # one learner's settings, as its grid spells them
Choice = tuple[list[list[Ranked]], list[P]]  # per conversation: the odd questions' orders; the settings
ORDERINGS = (
    "cold",
    "learned",
    "promote used",
    "demote unused",
    "promote used, demote unused",
    "oracle: promote used evidence",
    "ceiling",
    "features (LearnedUtility)",
    "neighbourhood (kNN, LOCO)",
    "embedding adapter (LOCO)",
    "neighbourhood (kNN, tuned on test)",
    "embedding adapter (tuned on test)",
    "context re-ranker (LOCO)",
    "context re-ranker (tuned on test)",
    "context re-ranker (other conversations' feedback, LOCO)",
    "context re-ranker (fixed design, penalty by own CV)",
    "session credit (LOCO)",
    "session credit (tuned on test)",
    *(f"oracle: evidence of the cold top-{n} first" for n in (10, 20, 30, 60)),
)
NEIGHBOURHOOD = "neighbourhood (kNN, LOCO)"
ADAPTER = "embedding adapter (LOCO)"
NEIGHBOURHOOD_TUNED = "neighbourhood (kNN, tuned on test)"
ADAPTER_TUNED = "embedding adapter (tuned on test)"
RERANKER = "context re-ranker (LOCO)"
RERANKER_TUNED = "context re-ranker (tuned on test)"
RERANKER_ELSEWHERE = "context re-ranker (other conversations' feedback, LOCO)"
RERANKER_OWN_CV = "context re-ranker (fixed design, penalty by own CV)"
SESSION = "session credit (LOCO)"
SESSION_TUNED = "session credit (tuned on test)"
ORACLE_DEPTHS = (10, 20, 30, 60)  # how deep the depth oracles read each odd question's cold ranking
# (a, b, tau, N, base): weight of a neighbour's used turn, of its served-unused turn, the cosine below which a
# question is no neighbour, how much of the cold ranking is re-ranked, and what the re-ranking starts from
NEIGHBOURHOOD_GRID: tuple[NeighbourhoodParams, ...] = tuple(
    itertools.product(
        (0.0, 0.5, 1.0, 2.0, 4.0), (0.0, 0.5, 1.0, 2.0), (0.3, 0.4, 0.5, 0.6), (10, 20, 30), ("score", "rank")
    )
)
NO_LEARNING: NeighbourhoodParams = (0.0, 0.0, 1.0, 30, "score")  # nothing moves: the cold top-30 in its own order
# (lam, weight, N): the adapter's L2 penalty (on standardised products), the weight of its logit beside the
# retrieval score, and how much of the cold ranking is re-ranked
ADAPTER_GRID: tuple[AdapterParams, ...] = tuple(
    itertools.product((1e-3, 1e-2, 1e-1, 1.0), (0.02, 0.05, 0.1, 0.2, 0.5), (10, 20, 30))
)
ADAPTER_OFF: AdapterParams = (1.0, 0.0, 30)  # nothing moves
# (w, alpha, N): the weight of a session's log credit factor beside the normalised retrieval score, the factor's
# prior in uses, and how much of the cold ranking is re-ranked
SessionParams = tuple[float, float, int]
SESSION_GRID: tuple[SessionParams, ...] = tuple(
    itertools.product((0.02, 0.05, 0.1, 0.2), (1.0, 5.0, 20.0), (10, 20, 30))
)
SESSION_OFF: SessionParams = (0.0, 1.0, 10)  # nothing moves
RerankerFeatures = Literal["plain", "context", "context+time"]
RerankerParams = tuple[float, int, RerankerFeatures]
# (lam, N, features): the re-ranker's L2 penalty (on standardised features), how much of the cold ranking it
# re-ranks, and which features it sees
RERANKER_GRID: tuple[RerankerParams, ...] = tuple(
    itertools.product((1e-4, 1e-3, 1e-2, 1e-1), (10, 20, 30), ("plain", "context", "context+time"))
)
RERANKER_OFF: RerankerParams = (1.0, 0, "plain")  # nothing moves
# what a store could run with no other conversation to choose on: every feature, the top-20 re-ranked (the design
# every left-out choice picked), and the penalty chosen by cross-validation on the store's own feedback
RERANKER_DESIGN: tuple[int, RerankerFeatures] = (20, "context+time")
RERANKER_FOLDS = 5
RERANK_DEPTH = 60  # each question's cold ranking is read this deep, for the scores of a turn's neighbours
SESSION_DEPTH = 20  # a session's share of a question's ranking is counted over this many places
_DIA = re.compile(r"D(\d+):(\d+)")
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True, kw_only=True)
class Neighbourhood:
    """One conversation as the learners see it: each even question's served and used turns (the protocol's
    feedback), each odd question's cold top-30 (turns and retrieval scores) and evidence, the questions' unit
    embeddings (even ones first, in ``even`` order, then the odd ones) and the turns', and every question's cold
    ranking as the context re-ranker reads it."""

    even: list[tuple[set[str], set[str]]]  # (served, used) per even question
    odd_top: list[tuple[Ranked, list[float]]]
    odd_evidence: list[list[str]]
    vectors: NDArray[np.float64]
    turn_vectors: dict[str, NDArray[np.float64]]  # dia id -> unit embedding of the turn's text
    even_ranked: list[Asked] = field(default_factory=list)  # each even question's cold ranking, ``RERANK_DEPTH`` deep
    odd_ranked: list[Asked] = field(default_factory=list)  # each odd question's


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One place of a question's cold ranking as the context re-ranker sees it."""

    turns: frozenset[str]  # the dia ids the memory stands for
    score: float
    explain: dict[str, float]  # the search's explanation of the score (``search(..., explain=True)``)
    text: str


@dataclass(frozen=True, kw_only=True)
class Asked:
    """A question and its cold ranking, read ``RERANK_DEPTH`` deep."""

    question: str
    ranked: list[Candidate]


def neighbourhood_inputs(
    system: System, embedder: Any, turns: list[dict[str, Any]], questions: list[dict[str, Any]], now: datetime
) -> Neighbourhood:
    """Every question's cold ranking in a store of its own, as the protocol serves it and deeper (``_asked``): the
    even questions' served top-10 and the turns of it their feedback calls used, the odd questions' top-30."""
    train = [q for q in questions if q["index"] % 2 == 0]
    test = [q for q in questions if q["index"] % 2 == 1]
    with temp_store(system.config, embedder, prefix="remem_bench_") as mem:
        dias = store_turns(mem, turns)
        ranked = [_asked(mem, dias, q["question"], now) for q in [*train, *test]]
    served = [set().union(*(c.turns for c in asked.ranked[: max(KS)])) for asked in ranked[: len(train)]]
    even = [(s, s & set(q["evidence"])) for q, s in zip(train, served, strict=True)]
    odd_top = [
        ([set(c.turns) for c in a.ranked[:30]], _descending([c.score for c in a.ranked[:30]]))
        for a in ranked[len(train) :]
    ]
    vectors = _unit(embedder.embed([q["question"] for q in [*train, *test]]))
    turn_vectors = dict(zip((t["dia"] for t in turns), _unit(embedder.embed([t["text"] for t in turns])), strict=True))
    return Neighbourhood(
        even=even,
        odd_top=odd_top,
        odd_evidence=[q["evidence"] for q in test],
        vectors=vectors,
        turn_vectors=turn_vectors,
        even_ranked=ranked[: len(train)],
        odd_ranked=ranked[len(train) :],
    )


def _asked(mem: Any, dias: dict[str, set[str]], question: str, now: datetime) -> Asked:
    """``question``'s cold ranking as the protocol serves it (its top-10, in order), then the rest of its ranking
    to ``RERANK_DEPTH`` places (a deeper search can order its head differently: the served head is kept)."""

    def candidate(h: Any) -> Candidate:
        turns = frozenset(dias.get(h.id, set()))
        return Candidate(turns=turns, score=h.score, explain=dict(h.explain or {}), text=h.text)

    served = mem.search(question, k=max(KS), now=now, task=TASK, explain=True).items
    seen = {h.id for h in served}
    deep = mem.search(question, k=RERANK_DEPTH, now=now, task=TASK, explain=True).items
    deeper = [h for h in deep if h.id not in seen]
    return Asked(question=question, ranked=[candidate(h) for h in [*served, *deeper]])


def _descending(scores: list[float]) -> list[float]:
    """``scores`` as a running minimum: a deeper search's scores can exceed the served tail's, and a re-ranking
    that adds nothing to them must keep the served order."""
    return [float(x) for x in np.minimum.accumulate(scores)]


def _unit(rows: Any) -> NDArray[np.float64]:
    out = np.asarray(rows, dtype=np.float64)
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out


def neighbourhood_orders(conv: Neighbourhood, params: NeighbourhoodParams) -> list[Ranked]:
    """Each odd question's cold top-``N`` re-ranked by the verdicts of its neighbouring even questions."""
    a, b, tau, n, base = params
    n_even = len(conv.even)
    out: list[Ranked] = []
    for j, (top, scores) in enumerate(conv.odd_top):
        cos = conv.vectors[n_even:][j] @ conv.vectors[:n_even].T if n_even else np.zeros(0)
        weights = [(float(c) - tau, served, used) for c, (served, used) in zip(cos, conv.even, strict=True) if c > tau]
        keyed = []
        for r, turn in enumerate(top[:n]):
            value = scores[r] if base == "score" else -r / 10.0
            for w, served, used in weights:
                if turn & used:
                    value += a * w
                elif turn & served:
                    value -= b * w
            keyed.append((-value, r))
        out.append([top[r] for _, r in sorted(keyed)])
    return out


def choose_settings(
    convs: Sequence[Neighbourhood],
    grid: Sequence[P],
    off: P,
    orders_of: Callable[[int, P], list[Ranked]],
) -> tuple[Choice[P], Choice[P]]:
    """One learner's settings chosen two ways, each as (per conversation, the odd questions' orders under
    ``orders_of(i, params)``; those settings):

    * leaving one conversation out: the settings of ``grid`` whose mean recall@5 over the *other* conversations'
      odd questions is highest (``off`` when there is no other conversation), an honest choice;
    * tuned on the test: those whose mean recall@5 over the conversation's *own* odd questions is highest, an
      optimistic bound for the learner family that no learner can reach without the answers.

    Ties go to the first in ``grid``."""
    orders_by = {(i, g): orders_of(i, g) for i in range(len(convs)) for g in grid}
    recall5 = {
        (i, g): [
            recall_at(order, evidence)["recall@5"]
            for order, evidence in zip(orders_by[i, g], convs[i].odd_evidence, strict=True)
        ]
        for i, g in orders_by
    }

    def best_of(settings: Sequence[P], scored: list[int]) -> P:
        """The first of ``settings`` with the highest mean recall@5 over the odd questions of ``scored``."""
        best, best_mean = settings[0], -1.0
        for g in settings:
            got = [x for k in scored for x in recall5[k, g]]
            mean = sum(got) / len(got) if got else 0.0
            if mean > best_mean:
                best, best_mean = g, mean
        return best

    loco: Choice[P] = ([], [])
    tuned: Choice[P] = ([], [])
    for i in range(len(convs)):
        others = [k for k in range(len(convs)) if k != i]
        honest = best_of(grid, others) if others else off
        best = best_of(grid, [i])
        for (orders, chosen), params in ((loco, honest), (tuned, best)):
            chosen.append(params)
            orders.append(orders_by[i, params] if (i, params) in orders_by else orders_of(i, params))
    return loco, tuned


def neighbourhood_choices(
    convs: Sequence[Neighbourhood],
) -> tuple[Choice[NeighbourhoodParams], Choice[NeighbourhoodParams]]:
    """The neighbourhood learner's orders and settings, chosen leaving one conversation out (``NO_LEARNING``
    when there is no other conversation) and tuned on the test."""
    return choose_settings(convs, NEIGHBOURHOOD_GRID, NO_LEARNING, lambda i, g: neighbourhood_orders(convs[i], g))


def _pair(conv: Neighbourhood, question: NDArray[np.float64], turn: set[str]) -> NDArray[np.float64]:
    """The adapter's features of a (question, memory) pair: the elementwise product of the question's embedding
    and the mean embedding of the memory's turns (zeros for a memory that stands for none)."""
    vecs = [conv.turn_vectors[d] for d in sorted(turn) if d in conv.turn_vectors]
    return question * np.mean(vecs, axis=0) if vecs else np.zeros_like(question)


Adapter = tuple[NDArray[np.float64], float, NDArray[np.float64], NDArray[np.float64]]


def fit_adapter(conv: Neighbourhood, lam: float) -> Adapter | None:
    """A diagonal bilinear relevance model fitted on the protocol's feedback: one row per turn an even question
    was served, its features ``_pair``, labelled used (1) or not (0); the library's L2 logistic regression on
    standardised features (``fit_logistic``). ``None`` when the feedback has one label only."""
    rows, labels = [], []
    for j, (served, used) in enumerate(conv.even):
        for dia in sorted(served):
            rows.append(_pair(conv, conv.vectors[j], {dia}))
            labels.append(int(dia in used))
    if not rows or len(set(labels)) < 2:
        return None
    return fit_logistic(np.asarray(rows), np.asarray(labels), lam)


def adapter_orders(conv: Neighbourhood, params: AdapterParams, model: Adapter | None) -> list[Ranked]:
    """Each odd question's cold top-``N`` re-ranked by its retrieval score plus ``weight`` times the adapter's
    logit (``model`` fitted with ``params``' lam); the rest of the top-30 follows in its cold order."""
    _, weight, n = params
    n_even = len(conv.even)
    out: list[Ranked] = []
    for j, (top, scores) in enumerate(conv.odd_top):
        if model is None or weight == 0.0:
            out.append(list(top))
            continue
        w, b, mean, std = model
        question = conv.vectors[n_even + j]
        head = top[:n]
        logits = [float(((_pair(conv, question, turn) - mean) / std) @ w + b) for turn in head]
        keyed = sorted((-(scores[r] + weight * z), r) for r, z in enumerate(logits))
        out.append([head[r] for _, r in keyed] + list(top[n:]))
    return out


def adapter_choices(convs: Sequence[Neighbourhood]) -> tuple[Choice[AdapterParams], Choice[AdapterParams]]:
    """The adapter's orders and settings, chosen leaving one conversation out (``ADAPTER_OFF`` when there is no
    other conversation) and tuned on the test, each conversation's models fitted on its own feedback."""
    models = {(i, lam): fit_adapter(conv, lam) for i, conv in enumerate(convs) for lam in {g[0] for g in ADAPTER_GRID}}
    return choose_settings(
        convs,
        ADAPTER_GRID,
        ADAPTER_OFF,
        lambda i, g: adapter_orders(convs[i], g, models.get((i, g[0]))),
    )


def _place(turns: frozenset[str]) -> tuple[int, int] | None:
    """(session, turn) of a memory that stands for one turn with a dia id ``D<session>:<turn>``, else ``None``."""
    if len(turns) != 1:
        return None
    m = _DIA.fullmatch(next(iter(turns)))
    return (int(m.group(1)), int(m.group(2))) if m else None


def reranker_features(asked: Asked, kind: RerankerFeatures) -> NDArray[np.float64]:
    """One row per place of ``asked``'s ranking: the context re-ranker's features of that (question, memory)."""
    ranked = asked.ranked
    if not ranked:
        return np.zeros((0, 0))
    top = ranked[0].score if ranked[0].score > 0 else 1.0
    places = [_place(c.turns) for c in ranked]
    by_place = {p: c.score / top for c, p in zip(ranked, places, strict=True) if p is not None}
    session_share: dict[int, float] = {}
    for c, p in zip(ranked[:SESSION_DEPTH], places[:SESSION_DEPTH], strict=True):
        if p is not None:
            session_share[p[0]] = session_share.get(p[0], 0.0) + c.score / top
    words = set(_WORD.findall(asked.question.lower()))
    when = float(asked.question.lower().lstrip().startswith("when"))
    rows = []
    for r, (c, p) in enumerate(zip(ranked, places, strict=True)):
        ex = c.explain
        speaker = c.text.split(":", 1)[0].strip().lower()
        row = [
            ex.get("feature.similarity", 0.0),
            ex.get("feature.lexical", 0.0),
            ex.get("feature.retrieval", 0.0),
            ex.get("feature.tokens", 0.0),
            ex.get("feature.gap", 0.0),
            math.log1p(r),
            c.score / top,
            float(speaker in words),
            len(c.text) / 200.0,
        ]
        if kind != "plain":
            row += (
                [by_place.get((p[0], p[1] - 1), 0.0), by_place.get((p[0], p[1] + 1), 0.0), session_share.get(p[0], 0.0)]
                if p is not None
                else [0.0, 0.0, 0.0]
            )
        if kind == "context+time":
            timed = float(bool(TIME_EXPRESSION.search(c.text)))
            row += [timed, timed * when]
        rows.append(row)
    return np.asarray(rows, dtype=np.float64)


Reranker = tuple[NDArray[np.float64], float, NDArray[np.float64], NDArray[np.float64]]


def reranker_rows(
    convs: Sequence[Neighbourhood], kind: RerankerFeatures
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """The re-ranker's training rows from the protocol's feedback in ``convs``: one per turn an even question was
    served (its cold top-10), its ``reranker_features``; labels used (1) or not (0); each row's question (0, 1,
    ... over ``convs``' even questions in order)."""
    rows, labels, question = [], [], []
    pairs = [p for conv in convs for p in zip(conv.even_ranked, conv.even, strict=True)]
    for j, (asked, (_, used)) in enumerate(pairs):
        served = asked.ranked[: max(KS)]
        if not served:
            continue
        rows.append(reranker_features(asked, kind)[: len(served)])
        labels += [int(bool(c.turns & used)) for c in served]
        question += [j] * len(served)
    return (
        np.vstack(rows) if rows else np.zeros((0, 0)),
        np.asarray(labels, dtype=np.int64),
        np.asarray(question, dtype=np.int64),
    )


def fit_reranker(convs: Sequence[Neighbourhood], lam: float, kind: RerankerFeatures) -> Reranker | None:
    """The context re-ranker fitted on ``reranker_rows(convs, kind)``: the library's L2 logistic regression on
    standardised features (``fit_logistic``). ``None`` when the feedback has one label only."""
    X, y, _ = reranker_rows(convs, kind)
    if len(set(y.tolist())) < 2:
        return None
    return fit_logistic(X, y, lam)


def own_cv_fit(conv: Neighbourhood, kind: RerankerFeatures) -> LearnedUtility | None:
    """The re-ranker fitted on the conversation's own feedback rows with its penalty chosen by the library's
    cross-validation (``LearnedUtility.fit``: the grid's penalty with the lowest out-of-fold log-loss, ties to the
    larger), ``RERANKER_FOLDS`` folds by question (a question's rows stay together). ``None`` when some fold's
    training rows have one label only."""
    X, y, question = reranker_rows([conv], kind)
    fold = question % RERANKER_FOLDS
    if len(y) == 0 or any(len(set(y[fold != f].tolist())) < 2 for f in range(RERANKER_FOLDS)):
        return None
    names = tuple(f"x{j}" for j in range(X.shape[1]))
    rows = TrainingSet(
        X=X,
        y=y.astype(np.int8),
        groups=fold.astype(str),
        feature_names=names,
        search_ids=question.astype(str),
        memory_ids=question.astype(str),
    )
    lambdas = sorted({g[0] for g in RERANKER_GRID})
    return LearnedUtility.fit(rows, lambdas, cv="leave-one-group-out", explore="none")


def own_cv_penalty(conv: Neighbourhood, kind: RerankerFeatures) -> float | None:
    """The penalty ``own_cv_fit`` chose (``None`` when it fitted nothing)."""
    fitted = own_cv_fit(conv, kind)
    return None if fitted is None else fitted.lam


def own_cv_orders(convs: Sequence[Neighbourhood]) -> tuple[list[list[Ranked]], list[float | None]]:
    """Per conversation: the odd questions' orders under ``RERANKER_DESIGN`` with ``own_cv_fit``'s model (the cold
    order when it fitted none), and the penalty it chose."""
    n, kind = RERANKER_DESIGN
    orders, chosen = [], []
    for conv in convs:
        fitted = own_cv_fit(conv, kind)
        model = None if fitted is None else (fitted.weights, fitted.intercept, fitted.mean, fitted.std)
        orders.append(reranker_orders(conv, (fitted.lam if fitted else 1.0, n, kind), model))
        chosen.append(None if fitted is None else fitted.lam)
    return orders, chosen


def reranker_orders(conv: Neighbourhood, params: RerankerParams, model: Reranker | None) -> list[Ranked]:
    """Each odd question's cold top-``N`` re-ranked by the re-ranker's logit (ties keep the cold order); the rest
    of its cold ranking follows in order."""
    _, n, kind = params
    out: list[Ranked] = []
    for asked in conv.odd_ranked:
        cold = [set(c.turns) for c in asked.ranked]
        if model is None or n == 0:
            out.append(cold)
            continue
        w, b, mean, std = model
        logits = ((reranker_features(asked, kind)[:n] - mean) / std) @ w + b
        head = sorted(range(len(logits)), key=lambda r: (-float(logits[r]), r))
        out.append([cold[r] for r in head] + cold[n:])
    return out


def session_factors(conv: Neighbourhood, alpha: float) -> dict[int, float]:
    """Per session of the conversation, the log of its credit factor from the even questions' feedback:
    ``log((alpha + u_s) / (alpha + r * n_s))``, with ``u_s`` its turns' uses, ``n_s`` their exposures (served to an
    even question) and ``r`` the conversation's use rate: above 0 for a session used more than its exposures
    promised, below 0 for one served and left unused."""
    uses: dict[int, int] = {}
    exposures: dict[int, int] = {}
    for served, used in conv.even:
        for counts, dias in ((exposures, served), (uses, used)):
            for dia in dias:
                m = _DIA.fullmatch(dia)
                if m:
                    counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + 1
    rate = sum(uses.values()) / max(sum(exposures.values()), 1)
    return {s: math.log((alpha + uses.get(s, 0)) / (alpha + rate * n)) for s, n in exposures.items()}


def session_orders(conv: Neighbourhood, params: SessionParams) -> list[Ranked]:
    """Each odd question's cold top-``N`` re-ranked by its retrieval score over the best plus ``w`` times its
    session's log credit factor (``session_factors``; 0 for a session never served, or a memory of no single
    turn); the rest of its cold ranking follows in order."""
    w, alpha, n = params
    factor = session_factors(conv, alpha) if w else {}
    out: list[Ranked] = []
    for asked in conv.odd_ranked:
        cold = [set(c.turns) for c in asked.ranked]
        top = asked.ranked[0].score if asked.ranked and asked.ranked[0].score > 0 else 1.0
        keyed = []
        for r, c in enumerate(asked.ranked[:n]):
            place = _place(c.turns)
            bonus = w * factor.get(place[0], 0.0) if place is not None else 0.0
            keyed.append((-(c.score / top + bonus), r))
        out.append([cold[r] for _, r in sorted(keyed)] + cold[n:])
    return out


def session_choices(convs: Sequence[Neighbourhood]) -> tuple[Choice[SessionParams], Choice[SessionParams]]:
    """The session learner's orders and settings, chosen leaving one conversation out (``SESSION_OFF`` when there
    is no other conversation) and tuned on the test."""
    return choose_settings(convs, SESSION_GRID, SESSION_OFF, lambda i, g: session_orders(convs[i], g))


def depth_oracle(asked: Asked, evidence: set[str], n: int) -> Ranked:
    """``asked``'s cold ranking with the members of its first ``n`` that hold an evidence turn moved first (stable):
    the best any re-ranking of the cold top-``n`` can do (it needs the question's answer)."""
    cold = [set(c.turns) for c in asked.ranked]
    return promote(cold[:n], evidence) + cold[n:]


def reranker_choices(
    convs: Sequence[Neighbourhood], *, own: bool = True
) -> tuple[Choice[RerankerParams], Choice[RerankerParams]]:
    """The context re-ranker's orders and settings, chosen leaving one conversation out (``RERANKER_OFF`` when there
    is no other conversation) and tuned on the test, each conversation's models fitted on its own feedback (or,
    not ``own``, on the other conversations' feedback only: what a model shipped from other stores would do)."""
    models = {
        (i, lam, kind): fit_reranker([conv] if own else [c for c in convs if c is not conv], lam, kind)
        for i, conv in enumerate(convs)
        for lam, kind in {(g[0], g[2]) for g in RERANKER_GRID}
    }
    return choose_settings(
        convs, RERANKER_GRID, RERANKER_OFF, lambda i, g: reranker_orders(convs[i], g, models.get((i, g[0], g[2])))
    )


def sample_bound(
    system: System, embedder: Any, turns: list[dict[str, Any]], questions: list[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """Per odd question: recall@k of each ordering but the neighbourhood's and the adapter's (``run`` adds them, once
    every conversation's inputs are in), and where its evidence turns fall in the partition."""
    tops, served, used = transfer_arms(system, embedder, turns, questions, now)
    test = [q for q in questions if q["index"] % 2 == 1]
    unused = served - used
    featured = feature_arm(system, embedder, turns, questions, now)
    rows = []
    for q, cold, learned, feat in zip(test, tops["cold"], tops["learned"], featured, strict=True):
        evidence = set(q["evidence"])
        orders: dict[str, Ranked] = {
            "cold": cold,
            "learned": learned,
            "promote used": promote(cold, used),
            "demote unused": reorder(cold, lambda s: 1 if s & unused and not s & used else 0),
            "promote used, demote unused": reorder(cold, lambda s: 0 if s & used else (2 if s & unused else 1)),
            "oracle: promote used evidence": promote(cold, used & evidence),
            "features (LearnedUtility)": feat,
        }
        recall = {name: recall_at(top, q["evidence"]) for name, top in orders.items()}
        recall["ceiling"] = ceiling(cold, evidence, used)
        rows.append(
            {
                "qa_index": q["index"],
                "category": q["category"],
                "recall": recall,
                "evidence": {
                    "used": len(evidence & used) / len(evidence),
                    "unused": len(evidence & unused) / len(evidence),
                    "unseen": len(evidence - served) / len(evidence),
                },
            }
        )
    return rows


def feature_arm(
    system: System, embedder: Any, turns: list[dict[str, Any]], questions: list[dict[str, Any]], now: datetime
) -> list[Ranked]:
    """The odd questions' top-10 from a ``LearnedUtility`` fitted on the even questions' feedback (the protocol's
    searches and feedback, in a store of its own; feedback with one label only leaves the system's ranking)."""
    with temp_store(system.config, embedder, prefix="remem_bench_") as mem:
        dias = store_turns(mem, turns)
        for q in questions:
            if q["index"] % 2 == 0:
                give_feedback(mem, mem.search(q["question"], k=max(KS), now=now, task=TASK), dias, set(q["evidence"]))
        rows = training_rows(mem)
        if 0 < rows.positives < len(rows):  # feedback of one label only: nothing to fit, the system's ranking stays
            mem.utility = LearnedUtility.fit(rows, cv="kfold", explore="none")
        return [
            [dias.get(h.id, set()) for h in mem.search(q["question"], k=max(KS), now=now, task=TASK).items]
            for q in questions
            if q["index"] % 2 == 1
        ]


def promote(top: Ranked, wanted: set[str]) -> Ranked:
    """``top`` with the members that hold a turn of ``wanted`` first (stable)."""
    return reorder(top, lambda s: 0 if s & wanted else 1)


def reorder(top: Ranked, key: Callable[[set[str]], int]) -> Ranked:
    """``top`` stably sorted by ``key`` (ties keep the cold order)."""
    return sorted(top, key=key)


def ceiling(cold: Ranked, evidence: set[str], used: set[str]) -> dict[str, float]:
    """Recall@k if the cold top-k also held every used turn that is evidence of this question (room ignored)."""
    out = {}
    for k in KS:
        got = set().union(*cold[:k]) if cold[:k] else set()
        out[f"recall@{k}"] = len((got | (used & evidence)) & evidence) / len(evidence)
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per group: each ordering's mean recall@k and its paired difference against cold; evidence shares."""
    out: dict[str, Any] = {}
    for group in ["overall", *(CATEGORIES[c] for c in SCORED)]:
        sel = [r for r in rows if group == "overall" or CATEGORIES[r["category"]] == group]
        cell: dict[str, Any] = {"questions": len(sel)}
        for k in KS:
            m = f"recall@{k}"
            cold = [r["recall"]["cold"][m] for r in sel]
            cell[m] = {
                name: {
                    "mean": estimate([r["recall"][name][m] for r in sel]).to_dict(),
                    "minus_cold": paired(cold, [r["recall"][name][m] for r in sel]).to_dict(),
                }
                for name in ORDERINGS
            }
        cell["evidence_share"] = {
            part: estimate([r["evidence"][part] for r in sel]).to_dict() for part in ("used", "unused", "unseen")
        }
        out[group] = cell
    return out


def run(samples: Sequence[dict[str, Any]], system: System, embedder: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    per_sample: list[list[dict[str, Any]]] = []
    convs: list[Neighbourhood] = []
    for si, sample in enumerate(samples):
        sid = str(sample.get("sample_id", si))
        turns, _ = sample_turns(sample)
        questions, _ = sample_questions(sample, {t["dia"] for t in turns})
        if not turns or not questions:
            continue
        now = max(t["t"] for t in turns) + timedelta(hours=1)
        per_sample.append([{"sample_id": sid, **r} for r in sample_bound(system, embedder, turns, questions, now)])
        convs.append(neighbourhood_inputs(system, embedder, turns, questions, now))
    (orders, chosen), (tuned_orders, tuned_chosen) = neighbourhood_choices(convs)
    (adapted, adapter_chosen), (tuned_adapted, tuned_adapter_chosen) = adapter_choices(convs)
    (reranked, reranker_chosen), (tuned_reranked, tuned_reranker_chosen) = reranker_choices(convs)
    (elsewhere, elsewhere_chosen), _ = reranker_choices(convs, own=False)
    own_cv, own_cv_chosen = own_cv_orders(convs)
    (by_session, session_chosen), (tuned_by_session, tuned_session_chosen) = session_choices(convs)
    learners = {
        NEIGHBOURHOOD: orders,
        ADAPTER: adapted,
        NEIGHBOURHOOD_TUNED: tuned_orders,
        ADAPTER_TUNED: tuned_adapted,
        RERANKER: reranked,
        RERANKER_TUNED: tuned_reranked,
        RERANKER_ELSEWHERE: elsewhere,
        RERANKER_OWN_CV: own_cv,
        SESSION: by_session,
        SESSION_TUNED: tuned_by_session,
    }
    for i, (sample_rows, conv) in enumerate(zip(per_sample, convs, strict=True)):
        for j, (row, evidence) in enumerate(zip(sample_rows, conv.odd_evidence, strict=True)):
            for name, learner_orders in learners.items():
                row["recall"][name] = recall_at(learner_orders[i][j], evidence)
            for n in ORACLE_DEPTHS:
                oracle = depth_oracle(conv.odd_ranked[j], set(evidence), n)
                row["recall"][f"oracle: evidence of the cold top-{n} first"] = recall_at(oracle, evidence)
        rows += sample_rows
    kinds = {
        "neighbourhood": ("a", "b", "tau", "n", "base"),
        "adapter": ("lam", "weight", "n"),
        "reranker": ("lam", "n", "features"),
        "session": ("w", "alpha", "n"),
    }
    settings: dict[str, tuple[Sequence[Sequence[object]], tuple[str, ...]]] = {
        "neighbourhood_chosen": (chosen, kinds["neighbourhood"]),
        "adapter_chosen": (adapter_chosen, kinds["adapter"]),
        "neighbourhood_tuned": (tuned_chosen, kinds["neighbourhood"]),
        "adapter_tuned": (tuned_adapter_chosen, kinds["adapter"]),
        "reranker_chosen": (reranker_chosen, kinds["reranker"]),
        "reranker_tuned": (tuned_reranker_chosen, kinds["reranker"]),
        "reranker_elsewhere_chosen": (elsewhere_chosen, kinds["reranker"]),
        "session_chosen": (session_chosen, kinds["session"]),
        "session_tuned": (tuned_session_chosen, kinds["session"]),
    }
    meta = {
        **{
            key: {
                rows_[0]["sample_id"]: dict(zip(names, params, strict=True))
                for rows_, params in zip(per_sample, picked, strict=True)
                if rows_
            }
            for key, (picked, names) in settings.items()
        },
        "reranker_own_cv_penalty": {
            rows_[0]["sample_id"]: lam for rows_, lam in zip(per_sample, own_cv_chosen, strict=True) if rows_
        },
        "reranker_design": {"n": RERANKER_DESIGN[0], "features": RERANKER_DESIGN[1]},
        "system": system.name,
        "embedder": embedder.name,
        "samples": len(samples),
        "questions": len(rows),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    return {"meta": meta, "summary": summary(rows), "questions": rows}


def _settings_text(meta: dict[str, Any], key: str) -> str:
    """Each conversation's settings under ``meta[key]`` (a neighbourhood's, an adapter's or a re-ranker's), as the
    report spells them."""

    def one(p: dict[str, Any]) -> str:
        if "features" in p:
            return f"lam={p['lam']}, N={p['n']}, {p['features']}"
        if "alpha" in p:
            return f"w={p['w']}, alpha={p['alpha']}, N={p['n']}"
        if "lam" in p:
            return f"lam={p['lam']}, weight={p['weight']}, N={p['n']}"
        return f"a={p['a']}, b={p['b']}, tau={p['tau']}, N={p['n']}, {p['base']}"

    return "; ".join(f"{sid}: {one(p)}" for sid, p in meta.get(key, {}).items())


def markdown(result: dict[str, Any]) -> str:
    meta, overall = result["meta"], result["summary"]["overall"]
    share = overall["evidence_share"]
    lines = [
        f"# LoCoMo learning transfer: what feedback can teach ({meta['system']}, {meta['embedder']})",
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        f"{meta['questions']} odd-index questions. Their evidence turns were, after feedback on the even ones: "
        f"used {100 * share['used']['mean']:.1f}%, served unused {100 * share['unused']['mean']:.1f}%, "
        f"never served {100 * share['unseen']['mean']:.1f}%.",
        "",
        "| ordering | " + " | ".join(f"recall@{k}" for k in KS) + " | recall@5 − cold (95% CI) |",
        "| --- | " + " | ".join("---:" for _ in KS) + " | ---: |",
    ]
    for name in ORDERINGS:
        cells = [f"{100 * overall[f'recall@{k}'][name]['mean']['mean']:.1f}" for k in KS]
        d = overall["recall@5"][name]["minus_cold"]
        diff = "–" if name == "cold" else f"{100 * d['mean']:+.1f} ± {100 * d['ci95']:.1f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {diff} |")
    lines += [
        "",
        "Feedback on the even questions (`used_ids` = the served evidence turns) splits the turns into used, served",
        "unused and never served. `cold` and `learned` are the transfer protocol's two arms; the next three re-order",
        "the cold top-10 by that split, as a learner that carries per-turn verdicts across questions would. The",
        "`oracle` also needs the odd question's own answer, and the `ceiling` further ignores the top-k's room: no",
        "re-ranking by what feedback said about each turn can beat it. Learning that generalises through features",
        "rather than turns is not bounded by it; `features (LearnedUtility)` is such a learner: the library's",
        "logistic utility fitted on the even questions' feedback rows, ranking the odd questions. The",
        "`neighbourhood` learner keeps per-turn verdicts per question neighbourhood: an odd question's cold top-N",
        "(N up to 30) is re-ranked by the verdicts of the even questions whose embeddings are close to its own,",
        "with settings chosen on the other conversations (leave one conversation out): "
        + _settings_text(meta, "neighbourhood_chosen")
        + ".",
        "",
        "The `embedding adapter` generalises through the embedding itself: a logistic model on the elementwise",
        "product of the question's and the turn's embeddings (a diagonal bilinear relevance model), fitted on the",
        "even questions' served turns labelled used or not, and added (times a weight) to the retrieval score of",
        "each odd question's cold top-N. Its settings were chosen leaving one conversation out: "
        + _settings_text(meta, "adapter_chosen")
        + ".",
        "",
        "The `context re-ranker` generalises through what surrounds a turn: a logistic model on each served turn's",
        "retrieval score and its explained parts, its rank and length, whether its speaker is named in the question,",
        "the scores of the turns before and after it in its session, its session's share of the question's top-20",
        "and whether it holds a time expression (alone and for a question asking when), fitted on the even questions'",
        "served turns labelled used or not and re-ranking each odd question's cold top-N. Its settings were chosen",
        "leaving one conversation out: " + _settings_text(meta, "reranker_chosen") + ". The same model fitted on",
        "the other conversations' feedback instead of the conversation's own (`other conversations' feedback`)",
        "shows how much of that is learned from the store's own outcomes rather than carried from elsewhere; its",
        "settings, also chosen leaving one conversation out: "
        + _settings_text(meta, "reranker_elsewhere_chosen")
        + ". With no other conversation to choose on, a store can still fix the design (every feature, the top-20",
        "re-ranked: what each left-out choice picked) and choose the penalty by cross-validation on its own feedback",
        "(five folds by question, lowest out-of-fold log-loss): `fixed design, penalty by own CV`, penalties "
        + "; ".join(f"{sid}: {lam}" for sid, lam in meta.get("reranker_own_cv_penalty", {}).items())
        + ".",
        "",
        "The `tuned on test` rows run the same learners with each conversation's settings chosen on that",
        "conversation's own odd questions, the ones they are scored on. No learner can choose so: the rows bound",
        "what these learner families could show here with the luckiest settings of their grids. Neighbourhood: "
        + _settings_text(meta, "neighbourhood_tuned")
        + ". Adapter: "
        + _settings_text(meta, "adapter_tuned")
        + ". Context re-ranker: "
        + _settings_text(meta, "reranker_tuned")
        + ". Session credit: "
        + _settings_text(meta, "session_tuned")
        + ".",
        "",
        "The `session credit` learner generalises through the conversation's sessions: a session whose turns the",
        "even questions used more than their exposures promised is lifted, one served and left unused is lowered",
        "(its log credit factor, times a weight, added to each odd question's normalised retrieval score over its",
        "cold top-N). Its settings were chosen leaving one conversation out: "
        + _settings_text(meta, "session_chosen")
        + ".",
        "",
        "The `oracle: evidence of the cold top-N first` rows need each odd question's own answer: they move the",
        "members of its cold top-N that hold an evidence turn first. No re-ranking of the cold top-N, whatever it",
        "learned, can beat the row of its depth; the library's store re-ranker re-orders the top 20.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a LoCoMo JSON file (list of samples)")
    ap.add_argument("--system", default="ReMem", help="a ReMem system (evals/harness/systems.yaml or library)")
    ap.add_argument("--embedder", choices=("hash", "minilm"), default="minilm")
    ap.add_argument("--out", default="results/locomo")
    ap.add_argument("--name", default="transfer_bound")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    samples = load_samples(args.data)
    if samples is None:
        return 2
    ((_, system),) = select_systems(args.system)
    if system is None:
        raise SystemExit("--system needs a ReMem system, not BM25")
    result = run(samples, system, make_embedder(args.embedder))
    result["meta"] = {
        "command": command_line("evals.bench.locomo_transfer_bound", sys.argv[1:] if argv is None else argv),
        "data": Path(args.data).name,
        **result["meta"],
    }
    write_outputs(result, markdown(result), Path(args.out) / args.name, quiet=args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
