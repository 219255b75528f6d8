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

``--new REV`` measures that commit instead of the working tree (exported the same way, as ``remem_new``);
``--new-config JSON`` applies ``RememConfig.overriding`` to the new side's configuration, so a change of the
defaults can be told apart from a change of the code (``'{"utility": "heuristic"}'`` ranks as before).
``evals.perf.search_ab_range`` runs this over every commit of a range.

Usage::

    python -m evals.perf.search_ab --base 30c9b12 [--new REV] [--new-config JSON] [--size 10000]
                                   [--queries 600] [--seeds 7,11] [--out results/perf/search_ab.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.core import make_world
from evals.perf.measure import REPO_ROOT, latency_ms, loadavg, provenance

BASE_PACKAGE = "remem_base"
NEW_PACKAGE = "remem_new"


def export_package(rev: str, into: Path, name: str = BASE_PACKAGE) -> None:
    """Write ``remem_agent`` as of ``rev`` into ``into`` as the package ``name`` (every ``remem_agent`` name
    in its sources renamed), for a process that has ``into`` on its path (this one: ``export_base``)."""
    archive = into / f"{name}.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "archive", rev, "remem_agent"], cwd=REPO_ROOT, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (into / "remem_agent").rename(into / name)
    word = re.compile(r"\bremem_agent\b")
    for path in (into / name).rglob("*.py"):
        path.write_text(word.sub(name, path.read_text(encoding="utf-8")), encoding="utf-8")


def export_base(rev: str, into: Path, name: str = BASE_PACKAGE) -> ModuleType:
    """``remem_agent`` as of ``rev``, imported as ``name`` (``export_package``) from ``into``, which is put
    first on ``sys.path``."""
    export_package(rev, into, name)
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


@contextmanager
def base_package(rev: str, name: str = BASE_PACKAGE) -> Iterator[ModuleType]:
    """``export_base(rev, name)`` for the length of the block, then gone again: its folder, its ``sys.path``
    entry and every ``name`` module (a second A/B in the same process must not find the first one's code)."""
    with tempfile.TemporaryDirectory(prefix=f"{name}_ab_") as tmp:
        try:
            yield export_base(rev, Path(tmp), name)
        finally:
            if tmp in sys.path:
                sys.path.remove(tmp)
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[mod]


def configured(pkg: ModuleType, overrides: Mapping[str, Any] | None) -> Any:
    """``pkg``'s default ``RememConfig`` with ``overrides`` applied (``RememConfig.overriding``)."""
    config = pkg.RememConfig()
    return config.overriding(overrides) if overrides else config


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


def _stores(pkg: ModuleType, items: Sequence[Any], folder: Path, config: Any) -> tuple[Any, Any]:
    """(the store with ``config`` and system A on a copy of it) of ``pkg``, filled with ``items`` in batches."""
    own = as_inputs(pkg, items)
    mem = pkg.ReMem(folder, config=config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
        for start in range(0, len(own), 1000):
            mem.add_many(own[start : start + 1000])
    mem.close()
    shutil.copytree(folder, folder.with_name(folder.name + "_a"))
    return (
        pkg.ReMem(folder, config=config),
        pkg.ReMem(folder.with_name(folder.name + "_a"), config=pkg.RememConfig.similarity_only()),
    )


def run_seed(
    base: ModuleType,
    new: ModuleType,
    *,
    size: int,
    queries: int,
    warmup: int,
    seed: int,
    new_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    world = make_world(size, warmup + 2 * queries, seed=seed)
    with tempfile.TemporaryDirectory(prefix="remem_ab_") as tmp:
        sides = {
            "base": _stores(base, world.items, Path(tmp) / "base", configured(base, None)),
            "new": _stores(new, world.items, Path(tmp) / "new", configured(new, new_config)),
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


@contextmanager
def _new_side(rev: str | None) -> Iterator[ModuleType]:
    """The new side: ``rev`` exported as ``remem_new``, or this checkout's ``remem_agent``."""
    if rev is None:
        import remem_agent

        yield remem_agent
    else:
        with base_package(rev, NEW_PACKAGE) as new:
            yield new


def add_world_options(ap: argparse.ArgumentParser) -> None:
    """The options that size one A/B's world and its queries (shared with ``evals.perf.search_ab_range``)."""
    ap.add_argument("--size", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seeds", default="7,11")


def world_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The seeds of :func:`add_world_options`' options, after checking them all (``ap.error`` exits)."""
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.size < 100 or args.queries < 2 or args.warmup < 0 or not seeds:
        ap.error("--size must be >= 100, --queries >= 2, --warmup >= 0, --seeds not empty")
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.search_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--new", default=None, help="the later commit (default: the working tree)")
    ap.add_argument("--new-config", default=None, help="JSON overrides of the new side's RememConfig")
    add_world_options(ap)
    ap.add_argument("--out", default="results/perf/search_ab.json")
    args = ap.parse_args(argv)
    seeds = world_options(ap, args)
    commit = resolve_commit(ap, args.base)
    new_commit = resolve_commit(ap, args.new) if args.new else None
    try:
        new_config = json.loads(args.new_config) if args.new_config else None
    except json.JSONDecodeError as exc:
        ap.error(f"--new-config is not JSON: {exc}")
    if new_config is not None and not isinstance(new_config, dict):
        ap.error("--new-config must be a JSON object")
    t0, load_start = time.perf_counter(), loadavg()
    with base_package(commit) as base, _new_side(new_commit) as new:
        per_seed = [
            run_seed(base, new, size=args.size, queries=args.queries, warmup=args.warmup, seed=s, new_config=new_config)
            for s in seeds
        ]
    result = {
        "benchmark": "perf_search_ab",
        "config": {"size": args.size, "queries": args.queries, "warmup": args.warmup, "seeds": seeds, "k": 5},
        "base_commit": commit,
        "new_commit": new_commit,  # None: the working tree (git_commit and git_dirty below)
        "new_config": new_config,
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
