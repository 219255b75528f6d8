"""The pre-registered primary analysis of the real-model study (results/llm_study/PLAN.md), exactly as written.

    python -m evals.analysis.llm_study --runs results/llm_study/runs --out results/llm_study/primary.json

Input: the per-run JSON files of ``evals.bench.run_llm_agent`` (one per family, seed and system, each with
per-task ``rows``). Unit of analysis: the (family, seed) cell; per cell d = success_C - success_A over the
same tasks in the same order (rows are paired by task id; a cell whose two runs disagree on the task
sequence is an error, not silently re-paired).

* **Primary**: pooled mean of d over all cells, 95% t-interval, two-sided one-sample t-test of mean d = 0.
* **Secondary**: the same per family, p-values Holm-corrected over the families.
* **Robustness** (reported, not decisive): Wilcoxon signed-rank over the cells; exact McNemar on
  task-level discordant pairs, pooled and per family (it ignores the within-cell dependence: C learns
  from earlier tasks of its world, so tasks are not independent, and the output says so).
* Every cell, significant or not: success of A and C, stale served/cited, answered stale, gold served,
  invalid final answers, latency and tokens per task.

Only complete runs count. Missing cells are listed; with any missing the output says ``complete: false``
(the plan's rule for an incomplete study: report the completed cells, with the reason given elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats as _sp

from evals.harness.stats import estimate, mcnemar_exact, wilcoxon_signed_rank

CELL_METRICS = (
    "success",
    "stale_served",
    "stale_cited",
    "answered_stale",
    "gold_served",
    "invalid_final",
    "latency_ms_mean",
    "prompt_tokens_per_task",
    "completion_tokens_per_task",
)


class StudyDataError(ValueError):
    """The run files cannot be analysed as the plan says (mismatched pairs, duplicate runs, bad rows)."""


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One (family, seed): the paired per-task outcomes of A and C and each run's own summary metrics."""

    family: str
    seed: int
    a: tuple[float, ...]  # per-task success of A, in task order
    c: tuple[float, ...]  # per-task success of C, the same tasks
    metrics_a: Mapping[str, Any]
    metrics_c: Mapping[str, Any]

    @property
    def d(self) -> float:
        return sum(self.c) / len(self.c) - sum(self.a) / len(self.a)

    @property
    def discordant(self) -> tuple[int, int]:
        """(tasks only A solved, tasks only C solved)."""
        only_a = sum(1 for x, y in zip(self.a, self.c, strict=True) if x >= 0.5 > y)
        only_c = sum(1 for x, y in zip(self.a, self.c, strict=True) if y >= 0.5 > x)
        return only_a, only_c


def load_runs(runs_dir: Path) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Complete runs keyed by (family, seed, system); a second complete run of one key is an error."""
    runs: dict[tuple[str, int, str], dict[str, Any]] = {}
    for path in sorted(runs_dir.glob("*.json")):
        res = json.loads(path.read_text())
        if not res.get("complete"):
            continue
        key = (str(res["family"]), int(res["seed"]), str(res["system"]))
        if key in runs:
            raise StudyDataError(f"two complete runs of {key}: {path.name}")
        runs[key] = res
    return runs


def _successes(res: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    rows = res.get("rows")
    if not isinstance(rows, list) or not rows:
        raise StudyDataError(f"{res.get('family')}/{res.get('seed')}/{res.get('system')}: no task rows")
    tids = [str(r["tid"]) for r in rows]
    return tids, [float(bool(r["success"])) for r in rows]


def make_cells(
    runs: Mapping[tuple[str, int, str], Mapping[str, Any]], *, base: str = "A", treatment: str = "C"
) -> list[Cell]:
    """Pair the runs of ``base`` and ``treatment`` per (family, seed) (only cells where both are complete)."""
    cells = []
    for family, seed in sorted({(f, s) for f, s, _ in runs}):
        ra, rc = runs.get((family, seed, base)), runs.get((family, seed, treatment))
        if ra is None or rc is None:
            continue
        tids_a, a = _successes(ra)
        tids_c, c = _successes(rc)
        if tids_a != tids_c:
            raise StudyDataError(f"{family}/{seed}: {base} and {treatment} ran different task sequences")
        cells.append(
            Cell(
                family=family,
                seed=seed,
                a=tuple(a),
                c=tuple(c),
                metrics_a={m: ra.get(m) for m in CELL_METRICS},
                metrics_c={m: rc.get(m) for m in CELL_METRICS},
            )
        )
    return cells


def t_test(ds: Sequence[float]) -> dict[str, float | int]:
    """Mean d with its 95% t-interval and the two-sided one-sample t-test of mean 0 (nan p when undefined)."""
    est = estimate(ds)
    if len(ds) < 2:
        return {**est.to_dict(), "t": math.nan, "p": math.nan}
    if all(x == ds[0] for x in ds):  # no spread: t is undefined (or infinite); say so instead of guessing
        return {**est.to_dict(), "t": math.nan, "p": 1.0 if ds[0] == 0 else 0.0}
    res = _sp.ttest_1samp(list(ds), 0.0)
    return {**est.to_dict(), "t": float(res.statistic), "p": float(res.pvalue)}


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); nan p-values stay nan."""
    finite = sorted(((p, k) for k, p in pvalues.items() if not math.isnan(p)), key=lambda x: x[0])
    m = len(finite)
    out = {k: math.nan for k in pvalues}
    running = 0.0
    for i, (p, k) in enumerate(finite):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


def _robustness(cells: Sequence[Cell]) -> dict[str, Any]:
    a_rates = [sum(c.a) / len(c.a) for c in cells]
    c_rates = [sum(c.c) / len(c.c) for c in cells]
    only_a = sum(c.discordant[0] for c in cells)
    only_c = sum(c.discordant[1] for c in cells)
    return {
        "wilcoxon_cells": wilcoxon_signed_rank(a_rates, c_rates).to_dict() if cells else None,
        "mcnemar_tasks": {
            **mcnemar_exact(only_a, only_c).to_dict(),
            "only_A": only_a,
            "only_C": only_c,
            "note": "task-level; ignores the within-cell dependence (C learns from earlier tasks)",
        },
    }


def analyse(cells: Sequence[Cell], *, expected: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
    """The plan's primary, secondary and robustness analyses, plus every cell."""
    families = sorted({c.family for c in cells})
    per_family: dict[str, dict[str, Any]] = {}
    for fam in families:
        fc = [c for c in cells if c.family == fam]
        per_family[fam] = {
            "cells": len(fc),
            "success_A": estimate([sum(c.a) / len(c.a) for c in fc]).to_dict(),
            "success_C": estimate([sum(c.c) / len(c.c) for c in fc]).to_dict(),
            "d": t_test([c.d for c in fc]),
            **_robustness(fc),
        }
    adjusted = holm({f: float(per_family[f]["d"]["p"]) for f in families})
    for fam in families:
        per_family[fam]["d"]["p_holm"] = adjusted[fam]
    have = {(c.family, c.seed) for c in cells}
    missing = sorted(set(expected) - have)
    return {
        "complete": not missing,
        "missing_cells": [{"family": f, "seed": s} for f, s in missing],
        "n_cells": len(cells),
        "primary": {
            "metric": "pooled mean over cells of d = success_C - success_A; 95% t-interval; two-sided t-test",
            "success_A": estimate([sum(c.a) / len(c.a) for c in cells]).to_dict(),
            "success_C": estimate([sum(c.c) / len(c.c) for c in cells]).to_dict(),
            "d": t_test([c.d for c in cells]),
        },
        "per_family": per_family,
        "robustness": _robustness(cells),
        "cells": [
            {
                "family": c.family,
                "seed": c.seed,
                "tasks": len(c.a),
                "d": c.d,
                "only_A": c.discordant[0],
                "only_C": c.discordant[1],
                "A": dict(c.metrics_a),
                "C": dict(c.metrics_c),
            }
            for c in cells
        ],
    }


def _pct(e: Mapping[str, Any]) -> str:
    mean, hw = float(e["mean"]), float(e["ci95"])
    return f"{mean * 100:+.1f}" if math.isnan(hw) else f"{mean * 100:+.1f} ± {hw * 100:.1f}"


def render_markdown(result: Mapping[str, Any]) -> str:
    """A short table of the analysis (percentage points; intervals are 95% t over cells)."""
    p = result["primary"]
    lines = [
        "# Real-model study: primary analysis (pre-registered, results/llm_study/PLAN.md)",
        "",
        f"Cells: {result['n_cells']}" + ("" if result["complete"] else " (INCOMPLETE: see missing_cells)"),
        "",
        "| | cells | success A | success C | C − A (pp) | p | p (Holm) | McNemar only A / only C, p |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fam, r in result["per_family"].items():
        mc = r["mcnemar_tasks"]
        lines.append(
            f"| {fam} | {r['cells']} | {r['success_A']['mean'] * 100:.1f} | {r['success_C']['mean'] * 100:.1f} "
            f"| {_pct(r['d'])} | {r['d']['p']:.3g} | {r['d']['p_holm']:.3g} "
            f"| {mc['only_A']} / {mc['only_C']}, {mc['p']:.3g} |"
        )
    mc = result["robustness"]["mcnemar_tasks"]
    lines.append(
        f"| **pooled** | {result['n_cells']} | {p['success_A']['mean'] * 100:.1f} | {p['success_C']['mean'] * 100:.1f} "
        f"| **{_pct(p['d'])}** | **{p['d']['p']:.3g}** | – | {mc['only_A']} / {mc['only_C']}, {mc['p']:.3g} |"
    )
    wil = result["robustness"]["wilcoxon_cells"]
    if wil is not None:
        lines += ["", f"Wilcoxon signed-rank over cells: p = {wil['p']:.3g} ({wil['n']} non-zero cells)."]
    lines += ["", "McNemar is task-level and ignores the within-cell dependence (reported, not decisive)."]
    lines += _cell_table(result.get("cells", []))
    return "\n".join(lines) + "\n"


def _cell_table(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every cell, significant or not (the plan's reporting rule): success, stale facts, gold served, latency."""
    if not cells:
        return []
    out = [
        "",
        "## Every cell",
        "",
        "| family | seed | tasks | success A | success C | C − A (pp) | only A / only C | stale served A / C "
        "| answered stale A / C | gold served A / C | invalid A / C | latency s A / C |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def pair(c: Mapping[str, Any], key: str, scale: float = 100.0) -> str:
        a, b = c["A"].get(key), c["C"].get(key)
        return " / ".join("–" if v is None else f"{v * scale:.1f}" for v in (a, b))

    for c in sorted(cells, key=lambda c: (c["family"], c["seed"])):
        out.append(
            f"| {c['family']} | {c['seed']} | {c['tasks']} | {c['A']['success'] * 100:.1f} | "
            f"{c['C']['success'] * 100:.1f} | {c['d'] * 100:+.1f} | {c['only_A']} / {c['only_C']} | "
            f"{pair(c, 'stale_served')} | {pair(c, 'answered_stale')} | {pair(c, 'gold_served')} | "
            f"{pair(c, 'invalid_final')} | {pair(c, 'latency_ms_mean', 0.001)} |"
        )
    out += [
        "",
        "Rates in % of the cell's tasks; latency is the mean wall time per task (machine shared, not a speed claim).",
    ]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=Path("results/llm_study/runs"))
    ap.add_argument("--out", type=Path, default=Path("results/llm_study/primary.json"))
    ap.add_argument("--families", default="contradiction,state_change,distractor")
    ap.add_argument("--seeds", default="0-9", help="expected seeds, e.g. 0-9 or 0,1,2")
    ap.add_argument("--base", default="A")
    ap.add_argument("--treatment", default="C")
    args = ap.parse_args(argv)
    if "-" in args.seeds:
        lo, hi = (int(x) for x in args.seeds.split("-", 1))
        seeds = list(range(lo, hi + 1))
    else:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    expected = [(f, s) for f in args.families.split(",") if f for s in seeds]
    cells = make_cells(load_runs(args.runs), base=args.base, treatment=args.treatment)
    result = analyse(cells, expected=expected)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    md = render_markdown(result)
    args.out.with_suffix(".md").write_text(md)
    print(md, end="")


if __name__ == "__main__":
    main()
