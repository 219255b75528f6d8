"""Replaying a world into a memory store: the one loop every runner shares.

A world is a timeline of steps; each step's facts arrive (their public view only) before its task is
asked. :class:`WorldReplay` walks that timeline over a :class:`~remem_agent.ReMem` store, adds the
facts, keeps the map between memory ids and the hidden facts behind them, and yields each task at the
moment it is asked. What a runner does with a task (search and let the simulated reader answer, ask a
real model through ``MemoryAgent``, rerank with the RMM baseline, probe the scored pool) is its own
business; the replay is the same for all of them, so their stores are filled identically.

:func:`temp_store` gives the throwaway store a run lives in (on ``/dev/shm`` when the machine has it).
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from evals.harness.reader import Reading
from evals.harness.world import Fact, Task, World
from remem_agent import ReMem, RememConfig
from remem_agent.embedders.base import Embedder
from remem_agent.ranking.utility import UtilityModel
from remem_agent.types import FeedbackReceipt, SearchResult
from remem_agent.validate import MemoryInput

_SHM = Path("/dev/shm")


def scratch_dir() -> Path | None:
    """Where throwaway stores go: ``/dev/shm`` when it exists (runs rebuild stores constantly: keep them in
    memory), else None (the system's default temporary folder)."""
    return _SHM if _SHM.is_dir() else None


@contextmanager
def temp_store(
    config: RememConfig,
    embedder: Embedder,
    *,
    prefix: str = "remem-eval-",
    workdir: Path | None = None,
    keep: Path | None = None,
    utility: UtilityModel | None = None,
    store_class: type[ReMem] = ReMem,
) -> Iterator[ReMem]:
    """A fresh store in a temporary folder (under ``workdir``, else :func:`scratch_dir`), closed and removed
    on exit. With ``keep`` the store is created there instead and survives (e.g. to train on its ledger).
    ``store_class`` may be a subclass of ReMem (e.g. one that drops feedback)."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=workdir or scratch_dir(), ignore_cleanup_errors=True) as tmp:
        mem = store_class(keep or Path(tmp) / "store", embedder=embedder, config=config, utility=utility)
        try:
            yield mem
        finally:
            mem.close()


def public_fact(fact: Fact, *, keys: bool) -> MemoryInput:
    """What a system stores of ``fact``: its public view, without the extracted entity/attribute when the
    system does not use keys (``keys: false`` in ``systems.yaml``)."""
    item = fact.public()
    return item if keys else replace(item, entity=None, attribute=None)


class WorldReplay:
    """Replays ``world`` into ``mem`` step by step; iterate :meth:`tasks` to get each task when it is asked.

    ``keys`` passes the extractor's entity/attribute to the store; ``as_of`` passes historical questions'
    ``as_of`` to searches (otherwise only ``now``). ``fact_of`` maps a memory id to the (first) fact behind
    it, ``mid_of`` a fact id to its memory id; both grow as the replay advances.
    """

    def __init__(self, mem: ReMem, world: World, *, keys: bool, as_of: bool = True) -> None:
        self.mem = mem
        self.world = world
        self.keys = keys
        self.use_as_of = as_of
        self.fact_of: dict[str, Fact] = {}
        self.mid_of: dict[str, str] = {}

    def tasks(self) -> Iterator[Task]:
        """Add each step's facts, then yield its task (if any). Stop iterating to stop the replay."""
        for step in self.world.steps:
            if step.facts:
                self.add(step.facts)
            if step.task is not None:
                yield step.task

    def add(self, facts: Sequence[Fact]) -> list[str]:
        """Store ``facts`` (one transaction) and record which memory holds which fact."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # additive-wording warnings are part of the worlds
            ids = self.mem.add_many([public_fact(f, keys=self.keys) for f in facts])
        for mid, f in zip(ids, facts, strict=True):
            self.fact_of.setdefault(mid, f)
            self.mid_of[f.fid] = mid
        return ids

    def as_of(self, task: Task) -> float | None:
        """The ``as_of`` a search for ``task`` passes: the task's, when the system uses validity windows."""
        return task.as_of if self.use_as_of else None

    def search(self, task: Task, *, explain: bool = False) -> SearchResult:
        """Search for ``task`` as the benchmark does: the world's k and token budget, at the task's time."""
        return self.mem.search(
            task.query,
            k=self.world.params.k,
            task=task.task_class,
            now=task.t,
            as_of=self.as_of(task),
            token_budget=self.world.params.token_budget,
            explain=explain,
        )

    def served(self, res: SearchResult) -> list[Fact]:
        """The hidden facts behind a search's served memories, in served order."""
        return [self.fact_of[h.id] for h in res.items]

    def feedback(
        self,
        res: SearchResult,
        reading: Reading,
        *,
        success: bool | None = None,
        replay: Callable[[Sequence[str]], bool] | None = None,
    ) -> FeedbackReceipt:
        """Send the simulated reader's outcome (``success`` overrides it, e.g. label noise) and citations."""
        return self.mem.feedback(
            res.search_id,
            success=reading.success if success is None else success,
            cited_ids=[self.mid_of[fid] for fid in reading.cited],
            answer=reading.answer,
            replay=replay,
        )
