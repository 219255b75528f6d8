"""Where one ``ReMem.search`` spends its time, stage by stage (a benchmark, not a test).

Builds the perf_core world (``evals.perf.core.make_world``) at ``--size`` memories, then times each stage
of the full search on queries it has not seen, interleaved with system A on a copy of the ledger and the
budgeted search, each of those on queries of its own (so caches are as contended as in
``evals.perf.core``, and no other path has asked the timed query first), after ``--warmup`` queries of
their own. The stages are the methods the search calls, wrapped with a timer for the measurement only:

* ``flat``: the dense scan (``FlatIndex.scan``);
* ``lexical``: the lexical channel (``SQLiteTx.lexical_candidates``: word counts, postings, bm25, filter);
* ``rows``: the pool's memory rows (``SQLiteTx.memories`` from the gather stage);
* ``stats`` / ``attributes``: the ledger's evidence about the pool;
* ``fuse``: hybrid fusion; ``rank``: features, utility, selection (``rank_and_select``);
* ``record``: the search record's write transaction;
* ``total``: the whole ``ReMem.search``.

With ``--embedder onnx`` the memories and queries are embedded by the ONNX MiniLM (plain texts, k = 10,
no task: the peers benchmark's setting) and query vectors come from the query cache, so ``total`` is the
search without its embedding. Usage::

    python -m evals.perf.search_stages [--size 10000] [--embedder hash|onnx] [--out results/perf/search_stages.json]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.core import make_world
from evals.perf.measure import latency_ms, loadavg, provenance
from remem_agent import ReMem, RememConfig
from remem_agent import gather as gather_module
from remem_agent import memory as memory_module
from remem_agent.index.flat import FlatIndex
from remem_agent.store.sqlite import SQLiteStore
from remem_agent.store.sqlite_tx import SQLiteTx

STAGES: tuple[tuple[Any, str, str], ...] = (
    (FlatIndex, "scan", "flat"),
    (SQLiteTx, "lexical_candidates", "lexical"),
    (SQLiteTx, "memories", "rows"),
    (SQLiteTx, "stats", "stats"),
    (SQLiteTx, "attributes", "attributes"),
    (gather_module, "fuse", "fuse"),
    (memory_module, "rank_and_select", "rank"),
    (SQLiteStore, "transact", "record"),
)


class StageClock:
    """Accumulates the time spent in wrapped callables while ``on``; one sample per stage per search."""

    def __init__(self) -> None:
        self.on = False
        self.current: dict[str, int] = defaultdict(int)
        self.samples: dict[str, list[int]] = defaultdict(list)

    def wrap(self, owner: Any, name: str, label: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return original(*args, **kwargs)
            t = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                self.current[label] += time.perf_counter_ns() - t

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    @contextmanager
    def search(self) -> Iterator[None]:
        self.current.clear()
        self.on = True
        t = time.perf_counter_ns()
        try:
            yield
        finally:
            total = time.perf_counter_ns() - t
            self.on = False
            for _, _, label in STAGES:
                self.samples[label].append(self.current.get(label, 0))
            self.samples["total"].append(total)


def _build(args: argparse.Namespace, root: Path) -> tuple[ReMem, ReMem, list[tuple[str, str | None]], int]:
    world = make_world(args.size, args.warmup + 3 * args.queries, seed=args.seed)
    if args.embedder == "onnx":
        from remem_agent.embedders.onnx import OnnxEmbedder

        def make(folder: Path, config: RememConfig | None = None) -> ReMem:
            return ReMem(folder, embedder=OnnxEmbedder(), config=config or RememConfig())

        items: Sequence[Any] = [it.text for it in world.items]
        queries: list[tuple[str, str | None]] = [(q, None) for q, _ in world.queries]
        k, batch = 10, 64
    else:

        def make(folder: Path, config: RememConfig | None = None) -> ReMem:
            return ReMem(folder, config=config or RememConfig())

        items, queries, k, batch = world.items, list(world.queries), 5, 1000
    mem = make(root / "store")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
        for start in range(0, len(items), batch):
            mem.add_many(items[start : start + batch])
    mem.close()
    shutil.copytree(root / "store", root / "store_a")
    mem, mem_a = make(root / "store"), make(root / "store_a", RememConfig.similarity_only())
    if args.embedder == "onnx":  # the search without its embedding: every query vector cached first
        from remem_agent.embedders.cache import QueryCache

        for m in (mem, mem_a):
            m.query_cache = QueryCache(len(queries) + 1)
            for q, _ in queries:
                m.query_cache.vector(m.embedder, q)
    return mem, mem_a, queries, k


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.search_stages", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--embedder", choices=("hash", "onnx"), default="hash")
    ap.add_argument("--out", default="results/perf/search_stages.json")
    args = ap.parse_args(argv)
    if args.size < 100 or args.queries < 1 or args.warmup < 0:
        ap.error("--size must be >= 100, --queries >= 1, --warmup >= 0")
    t0 = time.perf_counter()
    load_start = loadavg()
    with tempfile.TemporaryDirectory(prefix="remem_stages_") as tmp:
        mem, mem_a, queries, k = _build(args, Path(tmp))
        warm = queries[: args.warmup]
        n, start = args.queries, args.warmup
        # the timed full search, the budgeted search and system A: one slice of new queries each
        measure, budgeted, system_a = (queries[start + i * n : start + (i + 1) * n] for i in range(3))
        for q, task in warm:
            mem_a.search(q, k=k, task=task)
            mem.search(q, k=k, task=task, token_budget=60)
            mem.search(q, k=k, task=task)
        clock = StageClock()
        restore = [clock.wrap(owner, name, label) for owner, name, label in STAGES]
        try:
            for (q, task), (qb, tb), (qa, ta) in zip(measure, budgeted, system_a, strict=True):
                mem_a.search(qa, k=k, task=ta)
                mem.search(qb, k=k, task=tb, token_budget=60)
                with clock.search():
                    mem.search(q, k=k, task=task)
        finally:
            for undo in restore:
                undo()
        mem.close()
        mem_a.close()
    stages = {label: latency_ms(clock.samples[label]) for label in [*(s[2] for s in STAGES), "total"]}
    result = {
        "benchmark": "perf_search_stages",
        "config": {
            "size": args.size,
            "queries": args.queries,
            "warmup": args.warmup,
            "k": k,
            "seed": args.seed,
            "queries_per_path": "one slice of new queries each for the timed search, the budgeted one and A",
        },
        "embedder": args.embedder,
        "stages": stages,
        "note": "stage times nest inside total (rows/stats/attributes also inside the gather stage); "
        "the timers' own cost is included",
        **provenance(load_start, t0),
    }
    write_json(args.out, result)
    for label, s in stages.items():
        print(f"{label:>11} p50 {s['p50_ms']:.3f} ms  mean {s['mean_ms']:.3f} ms", file=sys.stderr)
    print(f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
