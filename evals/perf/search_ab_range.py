"""Paired search A/Bs of every commit of a range against one base commit (a benchmark): which commit moved
search time, and by how much.

Each commit that touched ``remem_agent`` (``git log BASE..TIP -- remem_agent``) is exported as ``remem_new``
and measured against the base exactly as ``evals.perf.search_ab`` measures the working tree: one process,
both stores built from the same world, every query asked of both in alternating order. Both packages are
imported afresh for every commit: a base package kept across commits would keep its module-level caches warm
(measured: every later commit then looked 2-3 % slower than in a pairing of its own). The result lists, per
commit in order, its subject and the median per-query ratio new / base, so a step in the series points at
the commit that made it; the spread between neighbouring commits that change no search code is the noise.
Results are written after every commit and a rerun with the same settings skips the commits already done.

Usage::

    python -m evals.perf.search_ab_range --base 4cf5424 [--tip HEAD] [--size 10000] [--queries 600]
                                         [--seeds 7,11] [--out results/perf/search_ab_range.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.measure import REPO_ROOT, loadavg, provenance
from evals.perf.search_ab import NEW_PACKAGE, add_world_options, base_package, resolve_commit, run_seed, world_options


def commits(base: str, tip: str) -> list[tuple[str, str]]:
    """(full hash, subject) of each commit after ``base`` up to ``tip`` that touched ``remem_agent``, oldest
    first."""
    out = subprocess.run(
        ["git", "log", "--reverse", "--format=%H%x00%s", f"{base}..{tip}", "--", "remem_agent"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(h, s) for h, s in (line.split("\0", 1) for line in out.splitlines() if line)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.search_ab_range", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit every other one is compared with")
    ap.add_argument("--tip", default="HEAD", help="the last commit of the range")
    add_world_options(ap)
    ap.add_argument("--out", default="results/perf/search_ab_range.json")
    args = ap.parse_args(argv)
    seeds = world_options(ap, args)
    base, tip = resolve_commit(ap, args.base), resolve_commit(ap, args.tip)
    settings = {"size": args.size, "queries": args.queries, "warmup": args.warmup, "seeds": seeds, "k": 5}
    out = Path(args.out)
    done: dict[str, dict[str, Any]] = {}
    if out.exists():
        earlier = json.loads(out.read_text(encoding="utf-8"))
        if earlier.get("base_commit") == base and earlier.get("config") == settings:
            done = {c["commit"]: c for c in earlier.get("commits", [])}
    t0, load_start = time.perf_counter(), loadavg()
    rows: list[dict[str, Any]] = []
    for commit, subject in commits(base, tip):
        if commit not in done:
            # both sides freshly imported for each commit: a base reused across commits would keep its
            # module-level caches (the hash embedder's feature memo, the text keys) warm and win every pairing
            with base_package(base) as old, base_package(commit, NEW_PACKAGE) as new:
                per_seed = [
                    run_seed(old, new, size=args.size, queries=args.queries, warmup=args.warmup, seed=s) for s in seeds
                ]
            ratio = round(statistics.median(s["median_ratio_new_over_base"] for s in per_seed), 4)
            done[commit] = {"commit": commit, "subject": subject, "median_ratio_new_over_base": ratio,
                            "seeds": per_seed}  # fmt: skip
            print(f"{commit[:9]} {ratio:.4f} {subject}", file=sys.stderr)
        rows.append(done[commit])
        write_json(out, {"benchmark": "perf_search_ab_range", "config": settings, "base_commit": base,
                         "tip_commit": tip, "commits": rows, **provenance(load_start, t0)})  # fmt: skip
    if not rows:
        write_json(out, {"benchmark": "perf_search_ab_range", "config": settings, "base_commit": base,
                         "tip_commit": tip, "commits": [], **provenance(load_start, t0)})  # fmt: skip
    print(f"-> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
