"""Run one system on one world with one reader, task by task, and measure what happened.

The runner is the only place that holds both views of the world. It gives the memory system the public
view (facts as an extractor would emit them, the task's query, class and time) and gives the reader
the hidden facts behind the *served* memories. Systems never see truth.

Shared candidate pool: every system's store is filled with the same facts in the same order and
embedded by the same deterministic embedder, and ``FlatIndex`` is exact, so each query's over-fetched
pool is identical across systems (``tests/test_eval_harness.py`` checks it); systems differ only in
ranking, selection and lifecycle.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from evals.reader import ReaderParams, Reading, read
from evals.systems import System
from evals.world import DAY, Fact, Task, World
from remem_agent import ReMem, State
from remem_agent.embedders.base import Embedder, Vectors, check_vectors
from remem_agent.embedders.hashing import DEFAULT_CONCEPT_GROUPS, ConceptHashEmbedder
from remem_agent.learning.lifecycle import LifecycleEvent
from remem_agent.types import ALL_TASKS

_SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


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


class CachedEmbedder:
    """Wraps an embedder with a text -> vector cache (same name and dim, so stores accept it).

    Every question rebuilds its store, and a benchmark's haystacks share many turns: each distinct text
    is embedded once per run.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self._cache: dict[str, np.ndarray] = {}
        self.seconds = 0.0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        texts = list(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            t0 = time.perf_counter()
            vecs = check_vectors(self.inner.embed(missing), len(missing), self.inner.dim, source=self.inner.name)
            self.seconds += time.perf_counter() - t0
            for t, v in zip(missing, vecs, strict=True):
                self._cache[t] = v
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts]).astype(np.float32)


_MINILM: CachedEmbedder | None = None


def embedder_for(world: World) -> Any:
    """The world's embedder: the concept-hash embedder with the world's lexicon, or all-MiniLM-L6-v2 when
    ``REMEM_EVAL_EMBEDDER=minilm`` (``run_benchmark --embedder minilm``)."""
    global _MINILM
    if os.environ.get("REMEM_EVAL_EMBEDDER", "hash") == "minilm":
        if _MINILM is None:
            from remem_agent.embedders.sentence_transformers import SentenceTransformerEmbedder

            _MINILM = CachedEmbedder(SentenceTransformerEmbedder())
        return _MINILM
    return ConceptHashEmbedder(concepts=[*DEFAULT_CONCEPT_GROUPS, *world.lexicon])


def _public(f: Fact, keys: bool) -> Any:
    item = f.public()
    return item if keys else replace(item, entity=None, attribute=None)


def run(
    world: World, system: System, reader: ReaderParams, *, workdir: Path | None = None, keep_store: Path | None = None
) -> RunResult:
    """Run ``system`` on ``world``; the store lives in a temporary folder unless ``keep_store`` names one."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="remem-eval-", dir=workdir or _SCRATCH) as tmp:
        mem = ReMem(keep_store or Path(tmp) / "store", embedder=embedder_for(world), config=system.config)
        try:
            rows, states, false_inv, missed, counters = _run(mem, world, system, reader)
        finally:
            mem.close()

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


def _run(
    mem: ReMem, world: World, system: System, reader: ReaderParams
) -> tuple[list[TaskRow], dict[str, int], int, int, dict[str, int]]:
    counters = {"replays": 0, "pruned": 0}
    fact_of: dict[str, Fact] = {}  # memory id -> the (first) fact behind it
    mid_of: dict[str, str] = {}
    rows: list[TaskRow] = []
    k, budget = world.params.k, world.params.token_budget
    for step in world.steps:
        if step.facts:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # additive-wording warnings are part of the worlds
                ids = mem.add_many([_public(f, system.keys) for f in step.facts])
            for mid, f in zip(ids, step.facts, strict=True):
                fact_of.setdefault(mid, f)
                mid_of[f.fid] = mid
        task = step.task
        if task is None:
            continue
        ts = time.perf_counter()
        res = mem.search(
            task.query,
            k=k,
            task=task.task_class,
            now=task.t,
            as_of=task.as_of if system.as_of else None,
            token_budget=budget,
        )
        search_ms = (time.perf_counter() - ts) * 1000
        served = [fact_of[h.id] for h in res.items]
        reading = read(task, served, seed=world.seed, params=reader, domains=world.domains)
        if system.learn:
            success = reading.success
            if system.label_noise and _coin(world.seed, task.tid, "noise") < system.label_noise:
                success = not success  # outcome-label noise study
            replay = None
            if system.loo_replay:

                def replay(ids: Sequence[str], task: Task = task) -> bool:
                    counters["replays"] += 1
                    return read(
                        task, [fact_of[i] for i in ids], seed=world.seed, params=reader, domains=world.domains
                    ).success

            mem.feedback(
                res.search_id,
                success=success,
                cited_ids=[mid_of[fid] for fid in reading.cited],
                answer=reading.answer,
                replay=replay,
            )
        if system.prune == "frequency" and len(rows) % PRUNE_EVERY == PRUNE_EVERY - 1:
            counters["pruned"] += frequency_prune(mem, protect_after=task.t - PRUNE_EVERY * DAY / 8)
        rows.append(TaskRow.of(task, reading, served, tokens=res.tokens, search_ms=search_ms))
    false_inv, missed = _invalidation_errors(mem, world, fact_of)
    return rows, lifecycle_states(mem), false_inv, missed, counters


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


def _invalidation_errors(mem: ReMem, world: World, fact_of: dict[str, Fact]) -> tuple[int, int]:
    """False invalidations: facts invalidated while still true (current value, or multi-valued).
    Missed: single-valued facts replaced in truth but still not invalidated at the end."""
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
