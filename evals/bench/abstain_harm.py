"""The abstain gate on the synthetic worlds: does it cost answers where memory helps, and what does it save?

Per world (family × seed, reader ``first``) three runs of the same tasks:

* ``none``: no memory at all (the gate forced shut: ``abstain_margin`` 2 exceeds any cosine), so the reader
  answers from nothing: its accuracy is the no-memory baseline;
* ``C``: system C as committed (gate off);
* ``C+gate``: system C with ``RememConfig(abstain="null")`` at its defaults.

Reported per family: the harm rate of ``C+gate`` (among the tasks ``none`` answers correctly, the share
``C+gate`` gets wrong; the count beside it), the same for ``C``, no-memory accuracy, success, gold-served rate,
the share of searches the gate abstained on and prompt tokens per task.

Usage::

    python -m evals.bench.abstain_harm [--seeds 0-14] [--families distractor_norecur,distractor]

Writes ``results/abstain/harm.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from evals.bench.retrieval import command_line
from evals.bench.run_benchmark import parse_seeds
from evals.harness.families import make_world
from evals.harness.jsonio import write_json
from evals.harness.reader import ReaderParams
from evals.harness.runner import run
from evals.harness.systems import System, load_systems

FAMILIES = ("distractor_norecur", "distractor", "useless_frequent", "state_change")


def _systems(name: str = "C") -> dict[str, System]:
    """``name`` (evals/harness/systems.yaml) as "C", beside its no-memory and gated twins."""
    c = replace(load_systems()[name], name="C")
    return {
        "none": replace(c, name="none", config=replace(c.config, abstain="null", abstain_margin=2.0), learn=False),
        "C": c,
        "C+gate": replace(c, name="C+gate", config=replace(c.config, abstain="null")),
    }


def _one(job: tuple[str, int, str]) -> dict[str, Any]:
    family, seed, system_name = job
    world = make_world(family, seed)
    out: dict[str, Any] = {"family": family, "seed": seed, "runs": {}}
    for name, system in _systems(system_name).items():
        res = run(world, system, ReaderParams())
        out["runs"][name] = [
            {"tid": r.tid, "success": r.success, "gold": r.gold_served, "served": r.served, "tokens": r.tokens}
            for r in res.rows
        ]
    return out


def summarise(worlds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in sorted({w["family"] for w in worlds}):
        rows = [w for w in worlds if w["family"] == family]
        none_ok = harmed = harmed_c = tasks = 0
        agg: dict[str, dict[str, float]] = {}
        for w in rows:
            base = {r["tid"]: r["success"] for r in w["runs"]["none"]}
            for name, runs in w["runs"].items():
                a = agg.setdefault(name, {"success": 0.0, "gold": 0.0, "served_nothing": 0.0, "tokens": 0.0})
                for r in runs:
                    a["success"] += r["success"]
                    a["gold"] += r["gold"]
                    a["served_nothing"] += r["served"] == 0
                    a["tokens"] += r["tokens"]
            gated = {r["tid"]: r["success"] for r in w["runs"]["C+gate"]}
            plain = {r["tid"]: r["success"] for r in w["runs"]["C"]}
            for tid, ok in base.items():
                tasks += 1
                if ok:
                    none_ok += 1
                    harmed += not gated[tid]
                    harmed_c += not plain[tid]
        out[family] = {
            "tasks": tasks,
            "no_memory_correct": none_ok,
            "no_memory_accuracy": none_ok / tasks,
            "harmed_gate": harmed,
            "harm_rate_gate": harmed / none_ok if none_ok else None,
            "harmed_C": harmed_c,
            "harm_rate_C": harmed_c / none_ok if none_ok else None,
            **{name: {k: v / tasks for k, v in a.items()} for name, a in agg.items()},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-14")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/abstain/harm.json"))
    ap.add_argument("--system", default="C", help="the memory system measured (evals/harness/systems.yaml)")
    args = ap.parse_args(argv)
    if args.system not in load_systems():
        raise SystemExit(f"unknown system {args.system!r}")
    t0 = time.time()
    jobs = [(f, s, args.system) for f in args.families.split(",") for s in parse_seeds(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        worlds = list(pool.map(_one, jobs))
    summary = summarise(worlds)
    result = {
        "benchmark": "abstain_harm",
        "command": command_line("evals.bench.abstain_harm", sys.argv[1:] if argv is None else argv),
        "system": args.system,
        "reader": "first",
        "seeds": parse_seeds(args.seeds),
        "families": summary,
        "seconds": round(time.time() - t0, 1),
    }
    write_json(args.out, result)
    for family, s in summary.items():
        print(
            f"{family:20s} no-memory acc {s['no_memory_accuracy']:.3f}  harm gate {s['harmed_gate']}/"
            f"{s['no_memory_correct']}  harm C {s['harmed_C']}/{s['no_memory_correct']}  success C "
            f"{s['C']['success']:.3f} C+gate {s['C+gate']['success']:.3f}  "
            f"abstained {s['C+gate']['served_nothing']:.3f}"
        )
    print(json.dumps({"out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
