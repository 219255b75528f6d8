"""Choose the contribution utility's settings on dev seeds, never on the test seeds.

Runs system C with ``utility="contribution"`` and each setting of a small grid (``--grid``: JSON of
RememConfig fields to lists of values; the product is tried) on the dev seeds of every family, with the
reader ``first``, beside A and C as committed. A setting is scored by the mean task success over the core
families; the report also lists, per setting, budget_tight's success and C - A on distractor,
useless_frequent and the control family. Seeds are split in two folds: a setting is chosen on each fold and
scored on the other, so the reported figure of a rule was not fitted on the seeds it is scored on.

With ``--locomo FILE`` (LoCoMo dev conversations, never committed) each setting and C are also run on LoCoMo's
learning-transfer protocol (``evals.bench.run_locomo --transfer``: feedback on the even-index questions, recall@5
on the odd ones, MiniLM): a setting whose recall@5 learned − cold falls more than ``--locomo-margin`` points below
C's is not eligible for the choice, so a rule that learns the synthetic worlds by forgetting real conversations
is never chosen.

Usage::

    python -m evals.bench.tune_contribution [--seeds 200-205] [--grid '{"item_cost": [0, 0.1]}']
        [--locomo locomo-dev.json] [--locomo-margin 1.0] [--base '{"guard_top": 0}']

Writes ``results/benchmark/tuning/contribution_dev.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from evals.bench.run_benchmark import ALL_FAMILIES, DEV_SEEDS, parse_seeds
from evals.harness.families import CONTROL_FAMILIES, CORE_FAMILIES, make_world
from evals.harness.jsonio import write_json
from evals.harness.reader import ReaderParams
from evals.harness.runner import run
from evals.harness.systems import System, load_systems

DEFAULT_GRID: dict[str, list[Any]] = {
    "contribution_kappa": [1.0, 2.0, 4.0],
    "item_cost": [0.0, 0.1, 0.2],
    "p_floor": [0.15, 0.25, 0.35],
}
BASE: dict[str, Any] = {"utility": "contribution"}


def _system(setting: dict[str, Any], base: dict[str, Any] | None = None) -> System:
    c = load_systems()["C"]
    fields: dict[str, Any] = {**BASE, **(base or {}), **setting}
    return replace(c, name="C*", config=c.config.overriding(fields))


def _one(job: tuple[str, int, str, dict[str, Any], dict[str, Any]]) -> tuple[str, int, str, float]:
    family, seed, label, setting, base = job
    world = make_world(family, seed)
    system = load_systems()[label] if label in ("A", "C") else _system(setting, base)
    return family, seed, label, run(world, system, ReaderParams()).success


def locomo_transfer(samples: list[dict[str, Any]], system: System, embedder: Any) -> float:
    """Mean recall@5 learned − cold over the odd-index questions of LoCoMo's transfer protocol
    (``evals.bench.run_locomo.run`` with ``transfer=system`` and no other system)."""
    from evals.bench.run_locomo import run as run_locomo

    summary = run_locomo(samples, [], embedder, transfer=system)["transfer"]["summary"]
    return float(summary["overall"]["recall@5"]["learned_minus_cold"]["mean"])


def summarise(rates: dict[tuple[str, int], float], base: dict[str, dict[tuple[str, int], float]]) -> dict[str, Any]:
    fams = sorted({f for f, _ in rates})
    per = {f: sum(v for (g, _), v in rates.items() if g == f) / sum(1 for g, _ in rates if g == f) for f in fams}
    a = {f: sum(v for (g, _), v in base["A"].items() if g == f) / sum(1 for g, _ in base["A"] if g == f) for f in fams}
    core = [f for f in fams if f in CORE_FAMILIES]
    return {
        "core_mean": sum(per[f] for f in core) / len(core),
        "per_family": per,
        "minus_A": {f: per[f] - a[f] for f in fams},
        "control_minus_A": {f: per[f] - a[f] for f in fams if f in CONTROL_FAMILIES},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.tune_contribution", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default=",".join(map(str, DEV_SEEDS)))
    ap.add_argument("--grid", default=json.dumps(DEFAULT_GRID))
    ap.add_argument("--families", default=",".join(ALL_FAMILIES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="results/benchmark/tuning/contribution_dev.json")
    ap.add_argument("--locomo", type=Path, help="LoCoMo dev conversations: also run the transfer protocol")
    ap.add_argument("--locomo-margin", type=float, default=1.0, help="points below C's transfer a choice may fall")
    ap.add_argument("--base", default="{}", help="JSON of RememConfig fields every setting shares")
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if any(s < 100 for s in seeds):
        ap.error("tune on dev seeds (>= 100), never on the test seeds 0-14")
    grid: dict[str, list[Any]] = json.loads(args.grid)
    families = [f for f in args.families.split(",") if f]
    settings = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    base: dict[str, Any] = json.loads(args.base)
    jobs: list[tuple[str, int, str, dict[str, Any], dict[str, Any]]] = [
        (f, s, label, {}, base) for label in ("A", "C") for f in families for s in seeds
    ]
    jobs += [(f, s, f"set{i}", st, base) for i, st in enumerate(settings) for f in families for s in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(_one, jobs, chunksize=4))
    by_label: dict[str, dict[tuple[str, int], float]] = {}
    for family, seed, label, rate in done:
        by_label.setdefault(label, {})[(family, seed)] = rate
    folds = [seeds[0::2], seeds[1::2]]
    rows = []
    for label, rates in by_label.items():
        row: dict[str, Any] = {
            "label": label,
            "setting": settings[int(label[3:])] if label.startswith("set") else label,
            "all": summarise(rates, by_label),
        }
        row["folds"] = [
            summarise({k: v for k, v in rates.items() if k[1] in fold}, {"A": by_label["A"]})["core_mean"]
            for fold in folds
        ]
        rows.append(row)
    if args.locomo is not None:
        from evals.bench.run_locomo import load_samples
        from evals.harness.embedders import make_embedder

        samples = load_samples(args.locomo)
        if samples is None:
            return 2
        embedder = make_embedder("minilm")  # one cache of the turns' vectors for every setting
        for r in rows:
            if r["label"] != "A":
                system = load_systems()["C"] if r["label"] == "C" else _system(r["setting"], base)
                r["locomo_transfer"] = locomo_transfer(samples, system, embedder)
        floor = next(r for r in rows if r["label"] == "C")["locomo_transfer"] - args.locomo_margin / 100
    # cross-fitted choice: best core mean on one fold, scored on the other
    chosen = []
    for i in (0, 1):
        cands = [r for r in rows if r["label"].startswith("set")]
        if args.locomo is not None:
            cands = [r for r in cands if r["locomo_transfer"] >= floor] or cands
        best = max(cands, key=lambda r: r["folds"][i])
        chosen.append({"chosen_on_fold": i, "setting": best["setting"], "scored_on_other": best["folds"][1 - i]})
    result = {
        "benchmark": "tune_contribution",
        "seeds": seeds,
        "families": families,
        "grid": grid,
        "base": base,
        "locomo": None if args.locomo is None else {"data": args.locomo.name, "margin_points": args.locomo_margin},
        "rows": rows,
        "cross_fitted": chosen,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(Path(args.out), result, indent=2, sort_keys=True)
    for r in sorted(rows, key=lambda r: -r["all"]["core_mean"])[:12]:
        fam = r["all"]["per_family"]
        print(
            f"{str(r['setting'])[:70]:<70} core {r['all']['core_mean']:.3f} "
            f"bt {fam.get('budget_tight', 0):.3f} dis-A {r['all']['minus_A'].get('distractor', 0):+.3f} "
            f"uf-A {r['all']['minus_A'].get('useless_frequent', 0):+.3f} "
            f"ctl-A {r['all']['minus_A'].get('distractor_norecur', 0):+.3f}"
            + (f" locomo {100 * r['locomo_transfer']:+.1f}" if "locomo_transfer" in r else "")
        )
    print(json.dumps(chosen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
