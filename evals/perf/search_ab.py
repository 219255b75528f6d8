"""Paired A/B of ``ReMem.search`` between an earlier commit and the working tree, in one process (a benchmark).

Why: on this machine the same ``evals.perf.core`` run at 10k gave a search p50 of 2.67, 2.17 and 1.80 ms minutes
apart (b7b5a96: ``results/perf/history/core_repeat1.json``, ``perf/history/core_repeat2.json`` and the
perf/core.json of that commit; the bare index lookup moved as much), so two runs cannot
tell a 10% change from the machine's drift. Here both versions run in the same process at the same time: the
earlier commit's ``remem_agent`` is exported with ``git archive`` into a temporary folder under another
package name (``remem_base``; its imports renamed), both build a store from the same generated world
(``evals.perf.core.make_world``), and every measured query is asked of both, in alternating order, each search
preceded by a system-A search on a copy of its store (the interleaving ``evals.perf.core`` uses, so caches are
as contended). Reported per seed: each side's p50 and the median of the per-query ratios new / base.

Usage::

    python -m evals.perf.search_ab --base 30c9b12 [--size 10000] [--queries 600] [--seeds 7,11]
                                   [--out results/perf/search_ab.json]
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.core import make_world
from evals.perf.measure import REPO_ROOT, latency_ms, loadavg, provenance

BASE_PACKAGE = "remem_base"


def export_package(rev: str, into: Path) -> None:
    """Write ``remem_agent`` as of ``rev`` into ``into`` as the package ``remem_base`` (every ``remem_agent`` name
    in its sources renamed), for a process that has ``into`` on its path (this one: ``export_base``)."""
    archive = into / "base.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "archive", rev, "remem_agent"], cwd=REPO_ROOT, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (into / "remem_agent").rename(into / BASE_PACKAGE)
    word = re.compile(r"\bremem_agent\b")
    for path in (into / BASE_PACKAGE).rglob("*.py"):
        path.write_text(word.sub(BASE_PACKAGE, path.read_text(encoding="utf-8")), encoding="utf-8")


def export_base(rev: str, into: Path) -> ModuleType:
    """``remem_agent`` as of ``rev``, imported as ``remem_base`` (``export_package``) from ``into``, which is put
    first on ``sys.path``."""
    export_package(rev, into)
    sys.path.insert(0, str(into))
    return importlib.import_module(BASE_PACKAGE)


@contextmanager
def base_package(rev: str) -> Iterator[ModuleType]:
    """``export_base(rev)`` for the length of the block, then gone again: its folder, its ``sys.path`` entry and
    every ``remem_base`` module (a second A/B in the same process must not find the first one's code)."""
    with tempfile.TemporaryDirectory(prefix="remem_ab_base_") as tmp:
        try:
            yield export_base(rev, Path(tmp))
        finally:
            if tmp in sys.path:
                sys.path.remove(tmp)
            for name in [m for m in sys.modules if m == BASE_PACKAGE or m.startswith(BASE_PACKAGE + ".")]:
                del sys.modules[name]


def resolve_commit(ap: argparse.ArgumentParser, rev: str) -> str:
    """The full hash of the commit ``rev`` names, or a usage error (``ap.error`` exits)."""
    out = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        ap.error(f"--base {rev!r} is not a commit of this repository")
    return out.stdout.strip()


def as_inputs(pkg: ModuleType, items: Sequence[Any]) -> list[Any]:
    """``items`` (this package's ``MemoryInput``) as ``pkg``'s own ``MemoryInput`` objects (the fields it has)."""
    cls = pkg.MemoryInput
    names = [f.name for f in fields(cls)]
    return [cls(**{n: getattr(it, n) for n in names if hasattr(it, n)}) for it in items]


def _stores(pkg: ModuleType, items: Sequence[Any], folder: Path) -> tuple[Any, Any]:
    """(the default-config store, system A on a copy of it) of ``pkg``, filled with ``items`` in batches."""
    own = as_inputs(pkg, items)
    mem = pkg.ReMem(folder, config=pkg.RememConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
        for start in range(0, len(own), 1000):
            mem.add_many(own[start : start + 1000])
    mem.close()
    shutil.copytree(folder, folder.with_name(folder.name + "_a"))
    return (
        pkg.ReMem(folder, config=pkg.RememConfig()),
        pkg.ReMem(folder.with_name(folder.name + "_a"), config=pkg.RememConfig.similarity_only()),
    )


def run_seed(base: ModuleType, new: ModuleType, *, size: int, queries: int, warmup: int, seed: int) -> dict[str, Any]:
    world = make_world(size, warmup + 2 * queries, seed=seed)
    with tempfile.TemporaryDirectory(prefix="remem_ab_") as tmp:
        sides = {
            "base": _stores(base, world.items, Path(tmp) / "base"),
            "new": _stores(new, world.items, Path(tmp) / "new"),
        }
        for q, task in world.queries[:warmup]:
            for mem, mem_a in sides.values():
                mem_a.search(q, k=5, task=task)
                mem.search(q, k=5, task=task)
        timed: dict[str, list[int]] = {"base": [], "new": []}
        measured = world.queries[warmup : warmup + queries]
        for_a = world.queries[warmup + queries :]
        for i, ((q, task), (qa, ta)) in enumerate(zip(measured, for_a, strict=True)):
            order = ("base", "new") if i % 2 == 0 else ("new", "base")
            for name in order:
                mem, mem_a = sides[name]
                mem_a.search(qa, k=5, task=ta)
                t = time.perf_counter_ns()
                mem.search(q, k=5, task=task)
                timed[name].append(time.perf_counter_ns() - t)
        for mem, mem_a in sides.values():
            mem.close()
            mem_a.close()
    ratios = [n / b for n, b in zip(timed["new"], timed["base"], strict=True)]
    return {
        "seed": seed,
        "base": latency_ms(timed["base"]),
        "new": latency_ms(timed["new"]),
        "median_ratio_new_over_base": round(statistics.median(ratios), 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.search_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--size", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seeds", default="7,11")
    ap.add_argument("--out", default="results/perf/search_ab.json")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.size < 100 or args.queries < 2 or args.warmup < 0 or not seeds:
        ap.error("--size must be >= 100, --queries >= 2, --warmup >= 0, --seeds not empty")
    commit = resolve_commit(ap, args.base)
    t0, load_start = time.perf_counter(), loadavg()
    import remem_agent

    with base_package(commit) as base:
        per_seed = [
            run_seed(base, remem_agent, size=args.size, queries=args.queries, warmup=args.warmup, seed=s) for s in seeds
        ]
    result = {
        "benchmark": "perf_search_ab",
        "config": {"size": args.size, "queries": args.queries, "warmup": args.warmup, "seeds": seeds, "k": 5},
        "base_commit": commit,
        "seeds": per_seed,
        "median_ratio_new_over_base": round(statistics.median(s["median_ratio_new_over_base"] for s in per_seed), 4),
        **provenance(load_start, t0),
    }
    write_json(args.out, result)
    for s in per_seed:
        print(
            f"seed {s['seed']}: base p50 {s['base']['p50_ms']:.3f} ms, new {s['new']['p50_ms']:.3f} ms, "
            f"median ratio new/base {s['median_ratio_new_over_base']:.3f}",
            file=sys.stderr,
        )
    print(f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
