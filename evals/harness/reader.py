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
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from evals.harness.world import Fact, Task, key_name

ReaderMode = Literal["first", "latest"]
READER_MODES: tuple[ReaderMode, ...] = get_args(ReaderMode)


def reader_mode(name: str) -> ReaderMode:
    """``name`` as a :data:`ReaderMode` (``first`` or ``latest``); anything else is a ValueError."""
    for mode in READER_MODES:
        if name == mode:
            return mode
    raise ValueError(f"unknown reader mode {name!r}; known: {', '.join(READER_MODES)}")


@dataclass(frozen=True)
class ReaderParams:
    mode: ReaderMode = "first"
    distraction: float = 0.05
    cite_p: float = 0.9
    false_cite_p: float = 0.05


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


def read(
    task: Task,
    served: Sequence[Fact],
    *,
    seed: int,
    params: ReaderParams,
    domains: Mapping[str, Sequence[str]],
) -> Reading:
    """Answer ``task`` from the ``served`` facts (in the order they were served)."""
    cite_rng = _rng(seed, task.tid, "cite")
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
    cited = [
        f.fid
        for f in served
        if (f.fid in used and cite_rng.random() < params.cite_p)
        or (f.fid not in used and cite_rng.random() < params.false_cite_p)
    ]
    return Reading(answer, success, tuple(cited), tuple(used), distracted, guessed, stale, gold)
