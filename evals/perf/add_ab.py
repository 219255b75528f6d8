"""Paired A/B of ``ReMem.add_many`` between an earlier commit and the working tree, in one process (a benchmark).

Why: on this machine ``evals.perf.core`` measured 4,200-7,100 adds/s at 10k memories in separate runs, so two runs
cannot tell a few percent apart. Here both versions run in the same process: the earlier commit's ``remem_agent``
is exported as ``remem_base`` (``search_ab.export_base``), each version fills a fresh store of its own from the
same generated world (``evals.perf.core.make_world``) in batches, and the two stores take each batch in turn, the
order alternating from batch to batch, so both see the same machine at the same time and the same store sizes.
Reported: each side's adds/s over every batch, and the median and quartiles of the per-batch ratios new / base
(wall time; the thread's CPU time too). ``--rounds`` repeats it with fresh stores (more batches, same sizes).

Usage::

    python -m evals.perf.add_ab --base c16f9a7 [--size 10000] [--rounds 3] [--batch 1000] [--seed 7]
                                [--out results/perf/add_ab.json]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.core import make_world
from evals.perf.measure import loadavg, provenance
from evals.perf.search_ab import as_inputs, base_package, resolve_commit

SIDES = ("base", "new")


def _quartiles(ratios: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"median": round(q[1], 4), "q1": round(q[0], 4), "q3": round(q[2], 4)}


def run(pkgs: dict[str, ModuleType], *, size: int, rounds: int, batch: int, seed: int) -> dict[str, Any]:
    """Every round: fresh stores, the world's batches alternately added to each; per-batch wall and CPU ns."""
    world = make_world(size, 0, seed=seed)
    items = {side: as_inputs(pkg, world.items) for side, pkg in pkgs.items()}
    wall: dict[str, list[int]] = {side: [] for side in SIDES}
    cpu: dict[str, list[int]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="remem_add_ab_") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
        for r in range(rounds):
            mems = {side: pkg.ReMem(Path(tmp) / f"{side}_{r}") for side, pkg in pkgs.items()}
            gc.collect()
            for i, start in enumerate(range(0, size, batch)):
                for side in SIDES if (i + r) % 2 == 0 else SIDES[::-1]:
                    c, t = time.thread_time_ns(), time.perf_counter_ns()
                    mems[side].add_many(items[side][start : start + batch])
                    wall[side].append(time.perf_counter_ns() - t)
                    cpu[side].append(time.thread_time_ns() - c)
            for mem in mems.values():
                mem.close()
    n = size * rounds
    return {
        "batches": len(wall["new"]),
        "adds_per_s": {side: round(n / (sum(wall[side]) / 1e9), 1) for side in SIDES},
        "ratio_new_over_base": _quartiles([a / b for a, b in zip(wall["new"], wall["base"], strict=True)]),
        "cpu_ratio_new_over_base": _quartiles([a / b for a, b in zip(cpu["new"], cpu["base"], strict=True)]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.add_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--size", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="results/perf/add_ab.json")
    args = ap.parse_args(argv)
    if args.size < args.batch or args.batch < 1 or args.rounds < 1:
        ap.error("--batch must be >= 1, --size >= --batch, --rounds >= 1")
    commit = resolve_commit(ap, args.base)
    t0, load_start = time.perf_counter(), loadavg()
    import remem_agent

    with base_package(commit) as base:
        measured = run(
            {"base": base, "new": remem_agent}, size=args.size, rounds=args.rounds, batch=args.batch, seed=args.seed
        )
    result = {
        "benchmark": "perf_add_ab",
        "config": {"size": args.size, "rounds": args.rounds, "batch": args.batch, "seed": args.seed},
        "base_commit": commit,
        **measured,
        **provenance(load_start, t0),
    }
    write_json(args.out, result)
    ratio = measured["ratio_new_over_base"]
    print(
        f"{measured['batches']} batch pairs: base {measured['adds_per_s']['base']:.0f}/s, new "
        f"{measured['adds_per_s']['new']:.0f}/s; ratio new/base median {ratio['median']:.3f} "
        f"(quartiles {ratio['q1']:.3f}-{ratio['q3']:.3f})",
        file=sys.stderr,
    )
    print(f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
