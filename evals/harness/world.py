"""Synthetic worlds: a seeded timeline of facts arriving and tasks being asked, with hidden truth.

A world is what happens to one agent over time: facts arrive (some replace earlier ones), tasks ask
about them. Two views exist of every fact and task:

* the **public view** (:meth:`Fact.public`, :meth:`Task.public`) is all a memory system may see: the
  text, and the entity / attribute / role an LLM extractor would emit (which the imperfect-extraction
  knob may drop), the time, and the task's query and class;
* the **hidden truth** (the true key, the value asserted, whether the fact is still true, the task's
  answer) stays with the world and the simulated reader. The runner never passes it to a system, and
  a test checks that scrambling it changes no system decision.

This module is the data model only; the task families that build worlds, their registry and
:func:`~evals.harness.families.make_world` live in :mod:`evals.harness.families`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from remem_agent.validate import MemoryInput

Role = Literal["state", "preference", "note"]
FactKind = Literal["gold", "update", "trap", "distractor", "noise", "critical", "multi"]

DAY = 86_400.0
T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z: worlds start here so timestamps look real


@dataclass(frozen=True)
class Fact:
    """One memory as it arrives. Public: fid, text, entity, attribute, role, t. Hidden: the rest."""

    fid: str
    text: str
    entity: str | None
    attribute: str | None
    role: Role
    t: float
    # -- hidden --
    key: tuple[str, str] | None  # the true (entity, attribute) this fact asserts a value for
    value: str | None  # the value it asserts (appears verbatim in ``text``)
    kind: FactKind = "gold"
    multi_valued: bool = False  # the attribute holds several values at once (never supersedes)

    def public(self) -> MemoryInput:
        """What a memory system may store: the extractor's view of the fact."""
        return MemoryInput(
            text=self.text, entity=self.entity, attribute=self.attribute, role=self.role, timestamp=self.t
        )


@dataclass(frozen=True)
class Task:
    """One question. Public: tid, t, task_class, query, as_of. Hidden: needs and truth."""

    tid: str
    t: float
    task_class: str
    query: str
    as_of: float | None = None
    # -- hidden --
    needs: tuple[tuple[str, str], ...] = ()  # keys the answer needs, in answer order
    truth: Mapping[str, str] = field(default_factory=dict)  # "entity.attribute" -> value valid at the time asked
    critical: bool = False  # a rarely needed, indispensable fact (rare_critical)

    def public(self) -> dict[str, Any]:
        return {"tid": self.tid, "t": self.t, "task_class": self.task_class, "query": self.query, "as_of": self.as_of}


def key_name(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}"


@dataclass(frozen=True)
class Step:
    """One timeline step: facts that arrive, then (optionally) a task asked right after."""

    facts: tuple[Fact, ...] = ()
    task: Task | None = None


@dataclass(frozen=True)
class WorldParams:
    """Knobs shared by every family."""

    n_tasks: int = 300
    token_budget: int | None = None
    k: int = 5
    drop_keys: float = 0.0  # fraction of facts whose entity/attribute the "extractor" loses
    wording: bool = True  # updates carry explicit update wording ("moved to", "no longer", ...)


@dataclass(frozen=True)
class World:
    family: str
    seed: int
    params: WorldParams
    steps: tuple[Step, ...]
    domains: Mapping[str, tuple[str, ...]]  # attribute -> the values a chance-level guess draws from
    lexicon: tuple[tuple[str, ...], ...] = ()  # synonym groups of the world's vocabulary (hash embedder)

    def facts(self) -> Iterator[Fact]:
        for s in self.steps:
            yield from s.facts

    def tasks(self) -> Iterator[Task]:
        for s in self.steps:
            if s.task is not None:
                yield s.task

    def fact_index(self) -> dict[str, Fact]:
        return {f.fid: f for f in self.facts()}


def drop_keys(world: World, fraction: float, seed: int) -> World:
    """Imperfect extraction: the entity/attribute of ``fraction`` of the facts are lost (public view only)."""
    if fraction <= 0:
        return world
    rng = random.Random(seed * 7919 + 17)
    steps = []
    for s in world.steps:
        facts = tuple(
            replace(f, entity=None, attribute=None) if f.entity is not None and rng.random() < fraction else f
            for f in s.facts
        )
        steps.append(replace(s, facts=facts))
    return replace(world, steps=tuple(steps), params=replace(world.params, drop_keys=fraction))


def truth_at(facts: Sequence[Fact], key: tuple[str, str], t: float) -> str | None:
    """The value of single-valued ``key`` at time ``t``: the latest fact for it with time <= t."""
    best: Fact | None = None
    for f in facts:
        if f.key == key and f.t <= t and (best is None or f.t >= best.t):
            best = f
    return best.value if best else None
