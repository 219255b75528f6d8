"""Tune the RMM-style reranker on dev seeds, then compare it with system A on the test seeds.

    python -m evals.bench.tune_rmm                 # grid on dev seeds 200-201, chosen setting on test seeds 0-14
    python -m evals.bench.tune_rmm --workers 1

Grid: serving mode {greedy, sample} x lr {0.01, 0.03, 0.1, 0.3} x tau {0.3, 1.0} on the core families,
dev seeds 200 and 201, reader "first"; the setting with the best mean success is chosen (ties: first in
grid order). The chosen setting then runs on test seeds 0-14, core families, both readers, beside system
A (``evals.harness.runner.run`` with ``load_systems()["A"]``). Writes ``results/rmm/tuning.json`` and
``results/rmm/test.json``: per family and reader, mean ± 95% t-interval over seeds, and paired RMM - A
over the core families (per seed, the mean over families; then the t-interval over seeds).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from itertools import product
from pathlib import Path
from typing import Any

from evals.bench.rmm import Serve, one_blas_thread, run_rmm
from evals.harness.families import CORE_FAMILIES, make_world
from evals.harness.jsonio import write_json
from evals.harness.reader import ReaderMode, ReaderParams
from evals.harness.runner import run
from evals.harness.stats import estimate, paired
from evals.harness.systems import load_systems

DEV_SEEDS = (200, 201)
TEST_SEEDS = tuple(range(15))
LRS = (0.01, 0.03, 0.1, 0.3)
TAUS = (0.3, 1.0)
SERVES: tuple[Serve, ...] = ("greedy", "sample")
READERS: tuple[ReaderMode, ...] = ("first", "latest")
GRID = tuple(product(SERVES, LRS, TAUS))
METRICS = ("success", "tokens_per_task", "stale_in_context", "gold_never_served")


def _dev_job(args: tuple[str, int]) -> dict[str, Any]:
    family, seed = args
    world = make_world(family, seed)
    reader = ReaderParams(mode="first")
    out: dict[str, Any] = {"family": family, "seed": seed}
    with one_blas_thread():
        out["A"] = run(world, load_systems()["A"], reader).success
        out["grid"] = [run_rmm(world, reader, lr=lr, tau=tau, serve=serve).success for serve, lr, tau in GRID]
    return out


def _test_job(args: tuple[str, int, Serve, float, float]) -> dict[str, Any]:
    family, seed, serve, lr, tau = args
    world = make_world(family, seed)
    runs = []
    with one_blas_thread():
        for mode in READERS:
            reader = ReaderParams(mode=mode)
            for res in (run(world, load_systems()["A"], reader), run_rmm(world, reader, lr=lr, tau=tau, serve=serve)):
                runs.append(
                    {
                        "system": res.system,
                        "reader": mode,
                        "wall_s": res.wall_s,
                        **{m: getattr(res, m) for m in METRICS},
                    }
                )
    return {"family": family, "seed": seed, "runs": runs}


def _map(fn: Any, jobs: list[Any], workers: int) -> list[Any]:
    if workers <= 1:
        return [fn(j) for j in jobs]
    with mp.get_context("fork").Pool(workers) as pool:
        return list(pool.imap_unordered(fn, jobs))


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def tune(workers: int) -> dict[str, Any]:
    jobs = [(f, s) for f in CORE_FAMILIES for s in DEV_SEEDS]
    res = sorted(_map(_dev_job, jobs, workers), key=lambda r: (CORE_FAMILIES.index(r["family"]), r["seed"]))
    grid = []
    for g, (serve, lr, tau) in enumerate(GRID):
        per_family = {f: _mean([r["grid"][g] for r in res if r["family"] == f]) for f in CORE_FAMILIES}
        grid.append(
            {
                "serve": serve,
                "lr": lr,
                "tau": tau,
                "mean_success": _mean([r["grid"][g] for r in res]),
                "per_family": per_family,
            }
        )
    a = {
        "mean_success": _mean([r["A"] for r in res]),
        "per_family": {f: _mean([r["A"] for r in res if r["family"] == f]) for f in CORE_FAMILIES},
    }
    best = max(range(len(grid)), key=lambda i: (grid[i]["mean_success"], -i))
    return {
        "dev_seeds": list(DEV_SEEDS),
        "families": list(CORE_FAMILIES),
        "reader": "first",
        "selection": "best mean success over core families x dev seeds; ties: first in grid order",
        "grid": grid,
        "A": a,
        "chosen": {k: grid[best][k] for k in ("serve", "lr", "tau", "mean_success")},
    }


def test(serve: Serve, lr: float, tau: float, workers: int) -> dict[str, Any]:
    jobs = [(f, s, serve, lr, tau) for f in CORE_FAMILIES for s in TEST_SEEDS]
    res = _map(_test_job, jobs, workers)
    val: dict[tuple[str, str, str, str], dict[int, float]] = {}
    wall = 0.0
    for r in res:
        for run_ in r["runs"]:
            wall += run_["wall_s"]
            for m in METRICS:
                val.setdefault((run_["reader"], r["family"], run_["system"], m), {})[r["seed"]] = run_[m]
    per_family: dict[str, Any] = {}
    headline: dict[str, Any] = {}
    for reader in READERS:
        for f in CORE_FAMILIES:
            cell: dict[str, Any] = {}
            for m in METRICS:
                xa = [val[(reader, f, "A", m)][s] for s in TEST_SEEDS]
                xr = [val[(reader, f, "RMM", m)][s] for s in TEST_SEEDS]
                cell[m] = {
                    "A": estimate(xa).to_dict(),
                    "RMM": estimate(xr).to_dict(),
                    "RMM-A": paired(xa, xr).to_dict(),
                }
            per_family.setdefault(reader, {})[f] = cell
        core = {
            sys_: [_mean([val[(reader, f, sys_, "success")][s] for f in CORE_FAMILIES]) for s in TEST_SEEDS]
            for sys_ in ("A", "RMM")
        }
        h = {sys_: estimate(xs) for sys_, xs in core.items()}
        d = paired(core["A"], core["RMM"])
        rest = [f for f in CORE_FAMILIES if f != "budget_tight"]
        d_rest = paired(
            *(
                [_mean([val[(reader, f, sys_, "success")][s] for f in rest]) for s in TEST_SEEDS]
                for sys_ in ("A", "RMM")
            )
        )
        headline[reader] = {
            "A": {**h["A"].to_dict(), "text": h["A"].fmt()},
            "RMM": {**h["RMM"].to_dict(), "text": h["RMM"].fmt()},
            "RMM-A": {**d.to_dict(), "text": d.fmt()},
            "RMM-A_without_budget_tight": {**d_rest.to_dict(), "text": d_rest.fmt()},
        }
    return {
        "setting": {"serve": serve, "lr": lr, "tau": tau},
        "test_seeds": list(TEST_SEEDS),
        "families": list(CORE_FAMILIES),
        "headline_core_success": headline,
        "per_family": per_family,
        "per_seed_success": {
            reader: {
                f: {sys_: [val[(reader, f, sys_, "success")][s] for s in TEST_SEEDS] for sys_ in ("A", "RMM")}
                for f in CORE_FAMILIES
            }
            for reader in READERS
        },
        "cpu_seconds_all_runs": round(wall, 1),
        "reference": {"RMM": 63.1, "A": 62.6, "note": "reference design §10, success %, core families"},
    }


def _table(tun: dict[str, Any], tst: dict[str, Any]) -> str:
    lines = ["dev grid (reader first, core families, seeds 200-201): mean success %"]
    lines.append(f"  A (similarity): {100 * tun['A']['mean_success']:.1f}")
    for g in tun["grid"]:
        lines.append(f"  serve={g['serve']:<6} lr={g['lr']:<5} tau={g['tau']:<4} {100 * g['mean_success']:.1f}")
    c = tun["chosen"]
    lines.append(f"chosen: serve={c['serve']} lr={c['lr']} tau={c['tau']}")
    lines.append("test seeds 0-14, success % (mean ± 95% CI); RMM-A paired")
    lines.append(f"  {'family':<17} {'reader':<7} {'A':>12} {'RMM':>12} {'RMM-A':>12}")
    for reader, fams in tst["per_family"].items():
        for f, cell in fams.items():
            s = cell["success"]
            a, r, d = (s[x] for x in ("A", "RMM", "RMM-A"))
            lines.append(
                f"  {f:<17} {reader:<7} {100 * a['mean']:5.1f} ± {100 * a['ci95']:4.1f} "
                f"{100 * r['mean']:5.1f} ± {100 * r['ci95']:4.1f} {100 * d['mean']:+5.1f} ± {100 * d['ci95']:4.1f}"
            )
    for reader, h in tst["headline_core_success"].items():
        lines.append(
            f"  core mean ({reader}): A {h['A']['text']}  RMM {h['RMM']['text']}  RMM-A {h['RMM-A']['text']} "
            f"(without budget_tight: {h['RMM-A_without_budget_tight']['text']})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.tune_rmm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    ap.add_argument("--out", default="results/rmm")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tun = tune(args.workers)
    tun["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out / "tuning.json", tun, indent=1)
    c = tun["chosen"]
    t1 = time.perf_counter()
    tst = test(c["serve"], c["lr"], c["tau"], args.workers)
    tst["wall_s"] = round(time.perf_counter() - t1, 1)
    write_json(out / "test.json", tst, indent=1)
    print(_table(tun, tst))
    print(f"wall time: tuning {tun['wall_s']}s, test {tst['wall_s']}s -> {out}/tuning.json, {out}/test.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
