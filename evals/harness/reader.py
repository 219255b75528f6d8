"""The simulated reader: a deterministic stand-in for the LLM agent in the synthetic benchmark.

It plays the agent's part, so it may know what each served memory says (the world's hidden fact
behind it), exactly as an LLM understands text; it never sees memories that were not served.

Per needed key of a task:

1. **relevant** memories are the served ones asserting a value for that key;
2. ``first`` mode (position-biased) takes the first relevant memory in served order; ``latest`` mode
   (timestamp-aware) takes the most recent one not after the time asked about;
3. **distraction**: with probability ``distraction`` x (number of irrelevant served memories) the reader
   loses the thread and guesses instead (0.05 per irrelevant item by default);
4. with no relevant memory it **guesses** at chance level among the attribute's known values.

It cites the memory it used with probability ``cite_p`` and each other served memory with probability
``false_cite_p`` (noisy self-citation). All randomness comes from a generator seeded by
(world seed, task id), so a run is reproducible and systems face the same coin flips for the same task.

A third mode, ``calibrated``, replaces the hand-set assumptions by parameters fitted to a real model's
traces (:class:`CalibratedParams`, fitted by :mod:`evals.analysis.calibrate_reader`). Its success
probability for a given context is :func:`calibrated_success_p`, the very function the fit maximises the
likelihood of, so the simulator and the fit cannot drift apart. The ``first`` and ``latest`` modes and
the defaults are unchanged (the committed synthetic headline depends on them).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from evals.harness.world import Fact, Task, key_name

ReaderMode = Literal["first", "latest", "calibrated"]
# The hand-configurable modes (``--readers``); ``calibrated`` needs fitted parameters, so it is chosen by
# passing ReaderParams(mode="calibrated", calibrated=...) (evals.analysis.calibrate_reader does).
READER_MODES: tuple[ReaderMode, ...] = ("first", "latest")


def reader_mode(name: str) -> ReaderMode:
    """``name`` as a :data:`ReaderMode` (``first`` or ``latest``); anything else is a ValueError."""
    for mode in READER_MODES:
        if name == mode:
            return mode
    raise ValueError(f"unknown reader mode {name!r}; known: {', '.join(READER_MODES)}")


@dataclass(frozen=True, kw_only=True)
class CalibratedParams:
    """The calibrated reader's parameters, fitted to a real model's traces (not assumptions).

    Per needed key, with R the served memories asserting a value for it (not after the time asked about):

    * the reader *keeps the thread* with probability ``(1 - lapse) * (1 - distraction) ** n_other *
      (1 - entity_distraction) ** n_entity``, where ``n_entity`` counts the irrelevant served memories
      about the same entity (another attribute: the confusable ones) and ``n_other`` the rest;
    * keeping it, it picks one memory of R with softmax weights ``exp(position * (-rank) + recency *
      [latest of R])`` (``rank`` is the served position; position > 0 favours earlier memories,
      recency > 0 the most recent one: sensitivity to stale facts) and answers its value;
    * derailed, it is right with probability ``guess``; with R empty, with probability ``blind_guess``
      (None: chance level among the attribute's known values, the hand-set reader's assumption, used
      when the traces hold too few such contexts to measure it).

    ``cite_p`` / ``false_cite_p`` are the fitted citation rates of the memory used and of every other one.
    """

    lapse: float = 0.0
    distraction: float = 0.05
    entity_distraction: float = 0.05
    position: float = 0.0
    recency: float = 0.0
    guess: float = 0.0
    blind_guess: float | None = None
    cite_p: float = 0.9
    false_cite_p: float = 0.05

    def __post_init__(self) -> None:
        for name in ("lapse", "distraction", "entity_distraction", "guess", "blind_guess", "cite_p", "false_cite_p"):
            v = getattr(self, name)
            if v is None and name == "blind_guess":
                continue
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"CalibratedParams.{name} must be a probability in [0, 1], got {v!r}")
        for name in ("position", "recency"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"CalibratedParams.{name} must be finite")


@dataclass(frozen=True)
class ReaderParams:
    mode: ReaderMode = "first"
    distraction: float = 0.05
    cite_p: float = 0.9
    false_cite_p: float = 0.05
    calibrated: CalibratedParams | None = None  # required by (and only used in) mode "calibrated"

    def __post_init__(self) -> None:
        if self.mode == "calibrated" and self.calibrated is None:
            raise ValueError("the calibrated reader needs fitted CalibratedParams (evals.analysis.calibrate_reader)")


@dataclass(frozen=True, kw_only=True)
class KeyContext:
    """What the calibrated reader sees for one needed key: the relevant memories and the irrelevant counts."""

    relevant_ranks: tuple[int, ...]  # served positions of the memories asserting a value for the key
    relevant_correct: tuple[bool, ...]  # ... whether each asserts the true value
    latest: tuple[bool, ...]  # ... whether each is (one of) the most recent of them
    n_entity: int  # irrelevant served memories about the same entity
    n_other: int  # all other irrelevant served memories
    chance: float  # a uniform guess's probability of being right (1 / number of the attribute's values)


def key_context(
    key: tuple[str, str],
    truth: str | None,
    served: Sequence[Fact],
    asked_at: float,
    *,
    n_values: int,
    needed: Collection[tuple[str, str]] = (),
) -> KeyContext:
    """The :class:`KeyContext` of ``key`` in ``served`` (shared by the simulator and the fit).

    ``n_values``: how many values the attribute's domain holds (a chance-level guess is right 1 in n).
    Irrelevant: every served memory that is not relevant to ``key``, except those asserting another key
    in ``needed`` (the task's other keys: relevant to them, not distractors). A memory of ``key`` from after
    the time asked about (a historical question) is irrelevant and about the same entity.
    """
    rel = [(i, f) for i, f in enumerate(served) if f.key == key and f.t <= asked_at]
    t_max = max((f.t for _, f in rel), default=0.0)
    taken = {i for i, _ in rel}
    others = set(needed) - {key}
    irrelevant = [f for i, f in enumerate(served) if i not in taken and f.key not in others]
    n_entity = sum(f.key is not None and f.key[0] == key[0] for f in irrelevant)
    return KeyContext(
        relevant_ranks=tuple(i for i, _ in rel),
        relevant_correct=tuple(f.value == truth for _, f in rel),
        latest=tuple(f.t == t_max for _, f in rel),
        n_entity=n_entity,
        n_other=len(irrelevant) - n_entity,
        chance=1.0 / max(1, n_values),
    )


def keep_p(ctx: KeyContext, p: CalibratedParams) -> float:
    """Probability the calibrated reader keeps the thread (is not derailed) on this key."""
    return (1 - p.lapse) * (1 - p.distraction) ** ctx.n_other * (1 - p.entity_distraction) ** ctx.n_entity


def pick_weights(ctx: KeyContext, p: CalibratedParams) -> list[float]:
    """Softmax choice probabilities over the relevant memories (empty when there are none)."""
    logits = [-p.position * r + p.recency * lt for r, lt in zip(ctx.relevant_ranks, ctx.latest, strict=True)]
    if not logits:
        return []
    top = max(logits)
    ws = [math.exp(x - top) for x in logits]
    total = sum(ws)
    return [w / total for w in ws]


def calibrated_key_p(ctx: KeyContext, p: CalibratedParams) -> float:
    """Probability the calibrated reader answers this key right."""
    if not ctx.relevant_ranks:
        return ctx.chance if p.blind_guess is None else p.blind_guess
    keep = keep_p(ctx, p)
    right = sum(w for w, ok in zip(pick_weights(ctx, p), ctx.relevant_correct, strict=True) if ok)
    return keep * right + (1 - keep) * p.guess


def calibrated_success_p(contexts: Sequence[KeyContext], p: CalibratedParams) -> float:
    """Probability the calibrated reader answers the whole task right (keys independent)."""
    return math.prod(calibrated_key_p(c, p) for c in contexts)


@dataclass(frozen=True)
class Reading:
    """What the reader did on one task."""

    answer: dict[str, str]
    success: bool
    cited: tuple[str, ...]  # fids
    used: tuple[str, ...]  # fids whose value the answer committed to
    distracted: bool
    guessed: bool
    stale_in_context: bool  # a served memory asserted an outdated value for a needed key
    gold_served: bool  # every needed key had a currently-true memory in context


def _rng(seed: int, tid: str, salt: str) -> random.Random:
    h = hashlib.blake2b(f"{seed}|{tid}|{salt}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(h, "little"))


def _citations(
    served: Sequence[Fact], used: Collection[str], seed: int, tid: str, cite_p: float, false_cite_p: float
) -> tuple[str, ...]:
    """Which served facts the reader cites: a used one with ``cite_p``, any other with ``false_cite_p``.

    Both reader modes draw from the same per-task "cite" stream in served order, so a change of mode
    changes citations only through the parameters.
    """
    rng = _rng(seed, tid, "cite")
    return tuple(
        f.fid
        for f in served
        if (f.fid in used and rng.random() < cite_p) or (f.fid not in used and rng.random() < false_cite_p)
    )


def read(
    task: Task,
    served: Sequence[Fact],
    *,
    seed: int,
    params: ReaderParams,
    domains: Mapping[str, Sequence[str]],
) -> Reading:
    """Answer ``task`` from the ``served`` facts (in the order they were served)."""
    if params.mode == "calibrated":
        assert params.calibrated is not None  # ReaderParams checks it
        return _read_calibrated(task, served, seed=seed, p=params.calibrated, domains=domains)
    asked_at = task.as_of if task.as_of is not None else task.t
    needed = set(task.needs)
    irrelevant = [f for f in served if f.key not in needed]
    answer: dict[str, str] = {}
    used: list[str] = []
    distracted = guessed = stale = False
    gold = True
    for key in task.needs:
        name = key_name(key)
        relevant = [f for f in served if f.key == key and f.t <= asked_at]
        truth = task.truth.get(name)
        if any(f.value != truth for f in relevant):
            stale = True
        if not any(f.value == truth for f in relevant):
            gold = False
        # One coin per (task, key) and purpose: every system faces the same flips for the same task.
        lost = _rng(seed, task.tid, f"lost|{name}").random() < params.distraction * len(irrelevant)
        if lost:
            distracted = True
        if relevant and not lost:
            pick = relevant[0] if params.mode == "first" else max(relevant, key=lambda f: f.t)
            assert pick.value is not None
            answer[name] = pick.value
            used.append(pick.fid)
        else:
            guessed = True
            options = list(domains.get(key[1], ())) or ["unknown"]
            answer[name] = options[_rng(seed, task.tid, f"guess|{name}").randrange(len(options))]
    success = all(answer.get(key_name(k)) == task.truth.get(key_name(k)) for k in task.needs)
    cited = _citations(served, used, seed, task.tid, params.cite_p, params.false_cite_p)
    return Reading(answer, success, cited, tuple(used), distracted, guessed, stale, gold)


def _read_calibrated(
    task: Task, served: Sequence[Fact], *, seed: int, p: CalibratedParams, domains: Mapping[str, Sequence[str]]
) -> Reading:
    """One draw of the calibrated reader; its success rate given ``served`` is :func:`calibrated_success_p`."""
    asked_at = task.as_of if task.as_of is not None else task.t
    answer: dict[str, str] = {}
    used: list[str] = []
    distracted = guessed = stale = False
    gold = True
    for key in task.needs:
        name = key_name(key)
        truth = task.truth.get(name)
        options = list(domains.get(key[1], ()))
        ctx = key_context(key, truth, served, asked_at, n_values=len(options), needed=task.needs)
        relevant = [served[i] for i in ctx.relevant_ranks]
        stale = stale or not all(ctx.relevant_correct)
        gold = gold and any(ctx.relevant_correct)
        # Same salts as the other modes where the purpose is the same: systems face the same flips.
        lost = _rng(seed, task.tid, f"lost|{name}").random() >= keep_p(ctx, p)
        distracted = distracted or (lost and bool(relevant))
        if relevant and not lost:
            u, acc = _rng(seed, task.tid, f"pick|{name}").random(), 0.0
            pick = relevant[-1]
            for f, w in zip(relevant, pick_weights(ctx, p), strict=True):
                acc += w
                if u < acc:
                    pick = f
                    break
            assert pick.value is not None
            answer[name] = pick.value
            used.append(pick.fid)
            continue
        guessed = True
        g = _rng(seed, task.tid, f"guess|{name}")
        if not relevant and p.blind_guess is None:  # chance level, as the hand-set reader guesses
            answer[name] = (options or ["unknown"])[g.randrange(max(1, len(options)))]
            continue
        right_p = p.guess if relevant else p.blind_guess
        assert right_p is not None
        wrong = [v for v in options if v != truth] or ["unknown"]
        answer[name] = truth if truth is not None and g.random() < right_p else wrong[g.randrange(len(wrong))]
    success = all(answer.get(key_name(k)) == task.truth.get(key_name(k)) for k in task.needs)
    cited = _citations(served, used, seed, task.tid, p.cite_p, p.false_cite_p)
    return Reading(answer, success, cited, tuple(used), distracted, guessed, stale, gold)
