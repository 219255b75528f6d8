"""Run the synthetic benchmark: families x seeds x systems x readers, resumable, in parallel.

    python -m evals.bench.run_benchmark           # full protocol: test seeds 0-14, all families, A/B/C, both readers
    python -m evals.bench.run_benchmark --quick   # smoke run (< 1 minute)
    python -m evals.bench.run_benchmark --families contradiction,state_change --seeds 0-4 --workers 2

Each (family, seed) world is one job; its per-run summaries and per-task rows are written to
``<out>/runs/<family>/<seed>.json`` as soon as it finishes, so an interrupted run resumes where it
stopped (``--fresh`` starts over). The aggregate goes to ``<out>/benchmark.json`` and the tables to
``<out>/RESULTS.md`` (see :mod:`evals.analysis.report`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evals.harness.families import CONTROL_FAMILIES, CORE_FAMILIES, FAMILIES, WORLDS_VERSION, make_world
from evals.harness.jsonio import write_json
from evals.harness.reader import ReaderMode, ReaderParams, reader_mode
from evals.harness.runner import run
from evals.harness.systems import load_systems
from evals.harness.world import WorldParams

TEST_SEEDS = tuple(range(15))
DEV_SEEDS = (200, 201)
TRAIN_SEEDS = (100, 101, 102, 103)
ALL_FAMILIES = (*CORE_FAMILIES, "budget_medium", "budget_lookalike", *CONTROL_FAMILIES)


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += list(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


Job = tuple[str, int, tuple[str, ...], tuple[ReaderMode, ...], WorldParams, float, str]
"""One world: family, seed, systems, reader modes, world knobs, reader distraction, output folder."""


def _job(args: Job) -> dict[str, Any]:
    """Run every system and reader on one world; write ``<out>/runs/<family>/<seed>.json``."""
    family, seed, systems, readers, params, distraction, out = args
    specs = load_systems()
    world = make_world(family, seed, params)
    runs = []
    for reader in readers:
        for name in systems:
            res = run(world, specs[name], ReaderParams(mode=reader, distraction=distraction))
            d = res.summary()
            d["rows"] = [asdict(r) for r in res.rows]
            runs.append(d)
    record = {"family": family, "seed": seed, "worlds": WORLDS_VERSION, "runs": runs}
    path = Path(out) / "runs" / family / f"{seed}.json"
    write_json(path, record, newline=False, atomic=True)  # atomic: a killed run never leaves a half-written result
    return {"family": family, "seed": seed, "wall_s": sum(r["wall_s"] for r in runs)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.run_benchmark", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 families, 2 seeds, 120 tasks: a smoke run")
    ap.add_argument("--families", help=f"comma list (default: all: {','.join(ALL_FAMILIES)})")
    ap.add_argument("--seeds", help="e.g. 0-14 or 0,1,2 (default: test seeds 0-14)")
    ap.add_argument("--systems", default="A,B,C")
    ap.add_argument("--readers", default="first,latest")
    ap.add_argument("--tasks", type=int, help="tasks per world (default 300)")
    ap.add_argument("--distraction", type=float, default=0.05, help="reader distraction per irrelevant item")
    ap.add_argument(
        "--embedder",
        choices=["hash", "minilm"],
        default="hash",
        help="hash (default) or all-MiniLM-L6-v2 from the offline package (extra: embeddings)",
    )
    ap.add_argument("--drop-keys", type=float, default=0.0, help="fraction of facts whose extracted key is lost")
    ap.add_argument("--no-wording", action="store_true", help="updates carry no explicit update wording")
    ap.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    ap.add_argument("--out", default="results/benchmark")
    ap.add_argument("--fresh", action="store_true", help="ignore finished worlds in --out and run everything")
    ap.add_argument(
        "--study", help="run a study of evals/harness/studies.py (ablation, credit, explore, retention, ...)"
    )
    args = ap.parse_args(argv)
    if args.study:
        return _run_study(args, argv)

    if args.embedder == "minilm":
        os.environ["REMEM_EVAL_EMBEDDER"] = "minilm"  # read by evals.harness.runner.embedder_for in every worker
        if args.out == "results/benchmark":
            args.out = "results/real_embeddings"
    if args.quick:
        families = ["distractor", "contradiction", "state_change"]
        seeds = [0, 1]
        n_tasks: int | None = args.tasks or 120
        out = Path(args.out if args.out != "results/benchmark" else "results/quick")
    else:
        families = args.families.split(",") if args.families else list(ALL_FAMILIES)
        seeds = parse_seeds(args.seeds) if args.seeds else list(TEST_SEEDS)
        n_tasks = args.tasks
        out = Path(args.out)
    systems = tuple(s for s in args.systems.split(",") if s)
    try:
        readers = tuple(reader_mode(r) for r in args.readers.split(",") if r)
    except ValueError as exc:
        ap.error(str(exc))
    unknown = [f for f in families if f not in FAMILIES and f not in ALL_FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}")
    specs = load_systems()
    if missing := [s for s in systems if s not in specs]:
        ap.error(f"unknown systems {missing}; defined in evals/harness/systems.yaml: {sorted(specs)}")

    out.mkdir(parents=True, exist_ok=True)
    params = WorldParams(drop_keys=args.drop_keys, wording=not args.no_wording)
    if n_tasks is not None:
        params = replace(params, n_tasks=n_tasks)
    jobs: list[Job] = []
    for family in families:
        for seed in seeds:
            done = out / "runs" / family / f"{seed}.json"
            if done.exists() and not args.fresh:
                prev = json.loads(done.read_text())
                have = {(r["system"], r["reader"]) for r in prev["runs"]}
                # A world of another generation is a different world: run it again (records without the
                # field predate version 2).
                if prev.get("worlds", 1) == WORLDS_VERSION and all((s, r) in have for s in systems for r in readers):
                    continue
            jobs.append((family, seed, systems, readers, params, args.distraction, str(out)))
    total = len(families) * len(seeds)
    print(
        f"{total} worlds ({len(jobs)} to run, {total - len(jobs)} already done) x systems {','.join(systems)} "
        f"x readers {','.join(readers)}; {args.workers} worker(s) -> {out}",
        flush=True,
    )
    t0 = time.perf_counter()
    if jobs:
        ctx = mp.get_context("fork")
        # tqdm redraws one line on a terminal; to a log file it writes a line at most every 30 s.
        tty = sys.stderr.isatty()
        with (
            ctx.Pool(args.workers) as pool,
            tqdm(total=len(jobs), unit="world", mininterval=0.1 if tty else 30.0, dynamic_ncols=tty) as bar,
        ):
            for res in pool.imap_unordered(_job, jobs):
                bar.set_postfix_str(f"{res['family']}/{res['seed']}", refresh=False)
                bar.update()
    wall = time.perf_counter() - t0

    from evals.analysis.report import aggregate, write_report

    bench = aggregate(out, families, seeds, systems, readers)
    bench["wall_time_s_this_invocation"] = round(wall, 1)
    bench["command"] = "python -m evals.bench.run_benchmark " + " ".join(argv if argv is not None else sys.argv[1:])
    bench["params"] = {
        "tasks_per_world": params.n_tasks,
        "distraction": args.distraction,
        "drop_keys": params.drop_keys,
        "embedder": args.embedder,
        "wording": params.wording,
        "workers": args.workers,
        "worlds": WORLDS_VERSION,
    }
    write_json(out / "benchmark.json", bench, indent=1, sort_keys=True)
    write_report(bench, out / "RESULTS.md")
    h = bench["headline"]
    for reader in readers:
        if reader in h and "C-A" in h[reader]:
            print(
                f"reader {reader}: C-A = {h[reader]['C-A']['text']} pp over core families "
                f"(A {h[reader]['A']['text']}, C {h[reader]['C']['text']})"
            )
    print(f"wall time {wall:.0f}s -> {out / 'benchmark.json'}, {out / 'RESULTS.md'}")
    return 0


def _run_study(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    from evals.harness.studies import STUDIES, study_table

    if args.study not in STUDIES:
        raise SystemExit(f"unknown study {args.study!r}; known: {sorted(STUDIES)}")
    study = STUDIES[args.study]
    out = Path(args.out if args.out != "results/benchmark" else f"results/studies/{study.name}")
    families = list(study.families or CORE_FAMILIES)
    seeds = parse_seeds(args.seeds) if args.seeds else list(TEST_SEEDS)
    sub = [
        *study.extra_args,
        "--families",
        ",".join(families),
        "--seeds",
        ",".join(map(str, seeds)),
        "--systems",
        ",".join(study.systems),
        "--readers",
        ",".join(study.readers),
        "--distraction",
        str(study.distraction),
        "--out",
        str(out),
        "--workers",
        str(args.workers),
    ]
    if args.tasks:
        sub += ["--tasks", str(args.tasks)]
    if args.fresh:
        sub.append("--fresh")
    main(sub)
    table = study_table(study, out)
    (out / "STUDY.md").write_text(
        f"# Study: {study.name}\n\n"
        f"Generated by `python -m evals.bench.run_benchmark --study {study.name}`.\n\n{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
