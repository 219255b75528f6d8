"""Train the LearnedUtility on traces from the train seeds (reference design §3, §9).

    python -m evals.bench.train_utility          # -> results/models/utility.json + results/models/train_report.json

System C (heuristic utility) runs on the core families of train seeds 100-103 with reader ``first``;
every answered search of those ledgers becomes training rows (features at retrieval time, label =
credit >= 0.5 on a successful task: observed, never ground truth). Regularisation is chosen by
leave-one-seed-out cross-validation. The report compares the learned model with the heuristic and with
similarity alone on the same rows (AUC, Brier, ECE).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray

from evals.harness.families import CORE_FAMILIES, make_world
from evals.harness.jsonio import write_json
from evals.harness.reader import ReaderParams
from evals.harness.runner import run
from evals.harness.systems import System, load_systems
from remem_agent.ranking.features import FEATURE_NAMES
from remem_agent.ranking.learned import LearnedUtility, metrics
from remem_agent.ranking.training import TrainingSet, concat, training_rows
from remem_agent.ranking.utility import HeuristicUtility, UtilityModel

TRAIN_SEEDS = (100, 101, 102, 103)
DEV_SEEDS = (200, 201)


class DaggerRound(TypedDict):
    round: int
    rows: int
    dev_success: float


class DaggerReport(TypedDict):
    """``<out>/dagger/report.json``: dev-seed success of the heuristic and of each retraining round."""

    command: str
    dev_seeds: list[int]
    heuristic_dev_success: float
    rounds: list[DaggerRound]


def _system(model_path: str | None) -> System:
    c = load_systems()["C"]
    if model_path is None:
        return c
    return replace(c, name="C_learned", config=replace(c.config, utility="learned", utility_path=model_path))


def _collect(args: tuple[str, int, str, str | None]) -> TrainingSet:
    family, seed, root, model_path = args
    store = Path(root) / f"{family}-{seed}"
    run(make_world(family, seed), _system(model_path), ReaderParams(mode="first"), keep_store=store)
    return training_rows(store, group=str(seed))  # one group per seed: leave-one-seed-out CV


def _dev_success(args: tuple[str, int, str | None]) -> float:
    family, seed, model_path = args
    return run(make_world(family, seed), _system(model_path), ReaderParams(mode="first")).success


def dev_success(model_path: str | None, workers: int) -> float:
    jobs = [(f, s, model_path) for s in DEV_SEEDS for f in CORE_FAMILIES]
    with mp.get_context("fork").Pool(workers) as pool:
        return float(np.mean(pool.map(_dev_success, jobs)))


def dagger(rounds: int, first: TrainingSet, out: Path, workers: int) -> DaggerReport:
    """On-policy retraining: collect traces with the learned model itself, aggregate, refit; compare on dev seeds."""
    out.mkdir(parents=True, exist_ok=True)
    model_path = str(out / "round0.json")
    LearnedUtility.fit(first, explore="none").save(model_path)
    data = first
    rows = [DaggerRound(round=0, rows=len(data), dev_success=dev_success(model_path, workers))]
    for r in range(1, rounds + 1):
        with tempfile.TemporaryDirectory(prefix="remem-dagger-") as root:
            jobs = [(f, s, root, model_path) for s in TRAIN_SEEDS for f in CORE_FAMILIES]
            with mp.get_context("fork").Pool(workers) as pool:
                data = concat([data, *pool.map(_collect, jobs)])
        model_path = str(out / f"round{r}.json")
        LearnedUtility.fit(data, explore="none").save(model_path)
        rows.append(DaggerRound(round=r, rows=len(data), dev_success=dev_success(model_path, workers)))
        print(f"  round {r}: {len(data)} rows, dev success {rows[-1]['dev_success'] * 100:.1f}%", flush=True)
    report = DaggerReport(
        command=f"python -m evals.bench.train_utility --dagger {rounds}",
        dev_seeds=list(DEV_SEEDS),
        heuristic_dev_success=dev_success(None, workers),
        rounds=rows,
    )
    write_json(out / "report.json", report, indent=1)
    return report


def _score(model: UtilityModel, ts: TrainingSet) -> NDArray[np.float64]:
    feats = {name: ts.X[:, j] for j, name in enumerate(FEATURE_NAMES)}
    p, _ = model.score(feats)
    return np.asarray(p, dtype=np.float64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.train_utility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/models")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dagger", type=int, default=0, help="also run N rounds of on-policy retraining (dev seeds)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="remem-train-") as root:
        jobs = [(f, s, root, None) for s in TRAIN_SEEDS for f in CORE_FAMILIES]
        with mp.get_context("fork").Pool(args.workers) as pool:
            sets = pool.map(_collect, jobs)
    ts = concat(sets)
    model = LearnedUtility.fit(ts, explore="none")
    model.save(out / "utility.json")
    y = ts.y.astype(np.int64)
    m = {
        "learned": metrics(y, model.predict(ts.X)),
        "heuristic": metrics(y, _score(HeuristicUtility(explore="none"), ts)),
        "similarity": metrics(y, (1.0 + ts.X[:, FEATURE_NAMES.index("similarity")]) / 2.0),
    }
    wall_s = round(time.perf_counter() - t0, 1)
    report = {
        "command": "python -m evals.bench.train_utility",
        "train_seeds": list(TRAIN_SEEDS),
        "families": list(CORE_FAMILIES),
        "rows": len(ts),
        "positives": int(ts.positives),
        "learned": model.report,
        "on_training_rows": m,
        "wall_time_s": wall_s,
    }
    write_json(out / "train_report.json", report, indent=1, sort_keys=True, default=float)
    print(f"{len(ts)} rows ({ts.positives} positive) from {len(jobs)} worlds; lambda={model.report.get('lambda')}")
    for name in ("learned", "heuristic", "similarity"):
        print(f"  {name:10s} AUC {m[name]['auc']:.3f}  Brier {m[name]['brier']:.3f}  ECE {m[name]['ece']:.3f}")
    print(f"wrote {out / 'utility.json'} and {out / 'train_report.json'} in {wall_s}s")
    if args.dagger:
        d = dagger(args.dagger, ts, out / "dagger", args.workers)
        print(
            f"DAgger on dev seeds: heuristic {d['heuristic_dev_success'] * 100:.1f}%, rounds "
            + ", ".join(f"{r['round']}: {r['dev_success'] * 100:.1f}%" for r in d["rounds"])
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
