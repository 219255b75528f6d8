"""Run one system on one world with one reader, task by task, and measure what happened.

The runner is the only place that holds both views of the world. It gives the memory system the public
view (facts as an extractor would emit them, the task's query, class and time) and gives the reader
the hidden facts behind the *served* memories. Systems never see truth.

Shared candidate pool: every system's store is filled with the same facts in the same order and
embedded by the same deterministic embedder, and ``FlatIndex`` is exact, so each query's over-fetched
pool is identical across systems (``tests/evals/test_eval_harness.py`` checks it); systems differ only in
ranking, selection and lifecycle.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evals.harness.embedders import embedder_for
from evals.harness.reader import ReaderParams, Reading, read
from evals.harness.replay import WorldReplay, temp_store
from evals.harness.systems import System
from evals.harness.world import DAY, Fact, Task, World
from remem_agent import ReMem, State
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.types import ALL_TASKS


@dataclass
class TaskRow:
    tid: str
    task_class: str
    success: bool
    tokens: int
    served: int
    stale_in_context: bool
    gold_served: bool
    distracted: bool
    guessed: bool
    historical: bool
    critical: bool
    search_ms: float
    served_fids: tuple[str, ...] = ()

    @classmethod
    def of(cls, task: Task, reading: Reading, served: Sequence[Fact], *, tokens: int, search_ms: float) -> TaskRow:
        """The row of one answered task (shared by every runner, e.g. the RMM baseline)."""
        return cls(
            tid=task.tid,
            task_class=task.task_class,
            success=reading.success,
            tokens=tokens,
            served=len(served),
            stale_in_context=reading.stale_in_context,
            gold_served=reading.gold_served,
            distracted=reading.distracted,
            guessed=reading.guessed,
            historical=task.as_of is not None,
            critical=task.critical,
            search_ms=round(search_ms, 4),
            served_fids=tuple(f.fid for f in served),
        )


def lifecycle_states(mem: ReMem) -> dict[str, int]:
    """How many memories are in each (non-empty) lifecycle state."""
    return {s.value: n for s, n in ((s, len(mem.list(s))) for s in State) if n}


@dataclass
class RunResult:
    family: str
    seed: int
    system: str
    reader: str
    n_tasks: int
    success: float
    tokens_per_task: float
    stale_in_context: float
    gold_never_served: float
    historical_success: float | None
    critical_success: float | None
    false_invalidations: int
    missed_invalidations: int
    states: dict[str, int]
    search_ms_p50: float
    wall_s: float
    replays_per_task: float = 0.0  # extra agent calls for leave-one-out credit
    pruned: int = 0  # memories archived by the frequency-prune control
    rows: list[TaskRow] = field(default_factory=list)

    @classmethod
    def from_rows(
        cls,
        world: World,
        system: str,
        reader: str,
        rows: list[TaskRow],
        *,
        states: dict[str, int],
        false_invalidations: int,
        missed_invalidations: int,
        wall_s: float,
        replays: int = 0,
        pruned: int = 0,
    ) -> RunResult:
        """Aggregate per-task rows into the run's metrics (shared by every runner, e.g. the RMM baseline)."""

        def rate(xs: list[bool]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        n = len(rows)
        return cls(
            family=world.family,
            seed=world.seed,
            system=system,
            reader=reader,
            n_tasks=n,
            success=sum(r.success for r in rows) / n,
            tokens_per_task=sum(r.tokens for r in rows) / n,
            stale_in_context=sum(r.stale_in_context for r in rows) / n,
            gold_never_served=sum(not r.gold_served for r in rows) / n,
            historical_success=rate([r.success for r in rows if r.historical]),
            critical_success=rate([r.success for r in rows if r.critical]),
            false_invalidations=false_invalidations,
            missed_invalidations=missed_invalidations,
            states=states,
            search_ms_p50=statistics.median(r.search_ms for r in rows),
            wall_s=round(wall_s, 3),
            replays_per_task=replays / max(1, n),
            pruned=pruned,
            rows=rows,
        )

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("rows")
        return d


def run(
    world: World,
    system: System,
    reader: ReaderParams,
    *,
    workdir: Path | None = None,
    keep_store: Path | None = None,
    after: Callable[[ReMem], None] | None = None,
) -> RunResult:
    """Run ``system`` on ``world``; the store lives in a temporary folder unless ``keep_store`` names one.
    ``after`` is called with the store once every task is answered, before it closes (to read its ledger)."""
    t0 = time.perf_counter()
    with temp_store(system.config, embedder_for(world), workdir=workdir, keep=keep_store) as mem:
        replay = WorldReplay(mem, world, keys=system.keys, as_of=system.as_of)
        rows, counters = _answer_tasks(replay, system, reader)
        false_inv, missed = invalidation_errors(mem, world, replay.fact_of)
        states = lifecycle_states(mem)
        if after is not None:
            after(mem)
    return RunResult.from_rows(
        world,
        system.name,
        reader.mode,
        rows,
        states=states,
        false_invalidations=false_inv,
        missed_invalidations=missed,
        wall_s=time.perf_counter() - t0,
        replays=counters["replays"],
        pruned=counters["pruned"],
    )


def _answer_tasks(replay: WorldReplay, system: System, reader: ReaderParams) -> tuple[list[TaskRow], dict[str, int]]:
    """Every task of the replay: search, let the reader answer, learn from it (if the system learns)."""
    world, mem = replay.world, replay.mem
    counters = {"replays": 0, "pruned": 0}
    rows: list[TaskRow] = []
    for task in replay.tasks():
        ts = time.perf_counter()
        res = replay.search(task)
        search_ms = (time.perf_counter() - ts) * 1000
        served = replay.served(res)
        reading = read(task, served, seed=world.seed, params=reader, domains=world.domains)
        if system.learn:
            success = reading.success
            if system.label_noise and _coin(world.seed, task.tid, "noise") < system.label_noise:
                success = not success  # outcome-label noise study
            loo: Callable[[Sequence[str]], bool] | None = None
            if system.loo_replay:

                def loo(ids: Sequence[str], task: Task = task) -> bool:
                    counters["replays"] += 1
                    facts = [replay.fact_of[i] for i in ids]
                    return read(task, facts, seed=world.seed, params=reader, domains=world.domains).success

            replay.feedback(res, reading, success=success, replay=loo)
        if system.prune == "frequency" and len(rows) % PRUNE_EVERY == PRUNE_EVERY - 1:
            counters["pruned"] += frequency_prune(mem, protect_after=task.t - PRUNE_EVERY * DAY / 8)
        rows.append(TaskRow.of(task, reading, served, tokens=res.tokens, search_ms=search_ms))
    return rows, counters


PRUNE_EVERY = 50  # tasks between two passes of the frequency-prune control
PRUNE_FRACTION = 0.6  # ... which keeps this share of all (non-invalidated) memories archived


def frequency_prune(mem: ReMem, *, protect_after: float) -> int:
    """The retention control the reference warns about: archive the least *retrieved* memories.

    It ignores outcomes, so rarely needed but critical memories go first. Memories younger than
    ``protect_after`` are spared (they had no chance to be retrieved yet). Returns how many were archived.
    """
    kept = [m for m in mem.list() if m.state is not State.INVALIDATED]
    archived = sum(m.state is State.ARCHIVED for m in kept)
    target = int(len(kept) * PRUNE_FRACTION) - archived
    live = [m for m in kept if m.state is not State.ARCHIVED and m.valid_from < protect_after]
    if not live or target <= 0:
        return 0
    with mem.store.read() as tx:
        stats = tx.stats([m.id for m in live])
    live.sort(key=lambda m: (s.retrieved if (s := stats.get((m.id, ALL_TASKS))) else 0, m.valid_from))
    victims = live[:target]
    path = {
        State.ACTIVE: (LifecycleEvent.DEMOTE, LifecycleEvent.COMPRESS, LifecycleEvent.ARCHIVE),
        State.LOW_VALUE: (LifecycleEvent.COMPRESS, LifecycleEvent.ARCHIVE),
        State.COMPRESSED: (LifecycleEvent.ARCHIVE,),
    }
    with mem.store.write() as tx:
        for m in victims:
            for ev in path[m.state]:
                tx.transition(m.id, ev, reason="frequency-prune control: rarely retrieved", at=protect_after)
    return len(victims)


def _coin(seed: int, tid: str, salt: str) -> float:
    h = hashlib.blake2b(f"{seed}|{tid}|{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64


def invalidation_errors(mem: ReMem, world: World, fact_of: dict[str, Fact]) -> tuple[int, int]:
    """(false, missed) invalidations at the end of a run, from the hidden truth of ``fact_of``'s facts.

    False: facts invalidated while still true (current value, or multi-valued). Missed: single-valued
    facts replaced in truth but still not invalidated at the end."""
    latest: dict[tuple[str, str], Fact] = {}
    for f in world.facts():
        if f.key is not None and not f.multi_valued and (f.key not in latest or f.t >= latest[f.key].t):
            latest[f.key] = f
    false_inv = missed = 0
    for mid, f in fact_of.items():
        if f.key is None:
            continue
        invalidated = mem.get(mid).state is State.INVALIDATED
        still_true = (
            f.multi_valued
            or latest.get(f.key) is f
            or (latest.get(f.key) is not None and latest[f.key].value == f.value)
        )
        if (invalidated and still_true and f.multi_valued) or (invalidated and still_true and latest.get(f.key) is f):
            false_inv += 1
        elif not invalidated and not still_true:
            missed += 1
    return false_inv, missed
