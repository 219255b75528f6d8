"""What exploratory serving and off-policy evaluation cost (a benchmark, not a test).

One store of ``--size`` generated memories (``evals.perf.core.make_world``, the default embedder of that
benchmark), two handles on it: the default configuration and the same with exploratory serving. Each query is
asked of both, in alternating order, and answered with a verdict (the searches then hold the ledger's
evidence as a served store does). Reported: each side's search p50/p95, the per-query ratio explore / plain,
the feedback p50 of the exploring side, the bytes a stored decision takes, and the time
``evaluate_policy`` takes over all the logged searches (three targets).

Usage::

    python -m evals.perf.ope [--size 10000] [--searches 10000] [--out results/perf/ope.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.core import make_world
from evals.perf.measure import latency_ms, loadavg, provenance
from remem_agent import ReMem, RememConfig
from remem_agent.learning.ope import evaluate_policies, evaluate_policy, read_decisions

EXPLORE = RememConfig(explore_serving=0.3, explore_width=2)
TARGETS: dict[str, dict[str, Any]] = {
    "p_floor_0.5": {"p_floor": 0.5},
    "guard_top_0": {"guard_top": 0},
    "item_cost_0.1": {"item_cost": 0.1},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=10_000, help="memories in the store")
    ap.add_argument("--searches", type=int, default=10_000, help="logged searches (each side)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("results/perf/ope.json"))
    args = ap.parse_args(argv)
    started, load_start = time.perf_counter(), loadavg()
    world = make_world(args.size, args.searches, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="remem-ope-perf-") as tmp:
        plain_path, explore_path = Path(tmp) / "plain", Path(tmp) / "explore"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
            plain, explore = ReMem(plain_path), ReMem(explore_path, config=EXPLORE)
            for mem in (plain, explore):
                for i in range(0, len(world.items), 1000):
                    mem.add_many(world.items[i : i + 1000])
        times: dict[str, list[int]] = {"plain": [], "explore": [], "feedback": []}
        ratios: list[float] = []
        for n, (query, task) in enumerate(world.queries[: args.searches]):
            pair = [("plain", plain), ("explore", explore)]
            if n % 2:
                pair.reverse()
            took: dict[str, int] = {}
            for name, mem in pair:
                t0 = time.perf_counter_ns()
                res = mem.search(query, k=args.k, task=task)
                took[name] = time.perf_counter_ns() - t0
                t0 = time.perf_counter_ns()
                mem.feedback(res.search_id, success=n % 3 != 0, cited_ids=list(res.ids[:1]))
                if name == "explore":
                    times["feedback"].append(time.perf_counter_ns() - t0)
            for name, ns in took.items():
                times[name].append(ns)
            ratios.append(took["explore"] / took["plain"])
        with explore.store.read() as tx:
            sizes = [len(text) for (text,) in tx.run("SELECT decision FROM search_decisions")]
        start = time.perf_counter()
        decisions, _ = read_decisions(explore.store)
        read_s = time.perf_counter() - start
        ope: dict[str, Any] = {"searches": len(decisions), "read_s": round(read_s, 3), "targets": {}}
        for name, over in TARGETS.items():
            start = time.perf_counter()
            est = evaluate_policy(explore.store, EXPLORE.overriding(over))  # each one reads the decisions again
            ope["targets"][name] = {"seconds": round(time.perf_counter() - start, 3), "dr": est.dr.value}
        start = time.perf_counter()
        evaluate_policies(explore.store, {name: EXPLORE.overriding(over) for name, over in TARGETS.items()})
        ope["all_targets_one_read_s"] = round(time.perf_counter() - start, 3)
        disk = {"plain": plain.store.disk_bytes(), "explore": explore.store.disk_bytes()}
        plain.close()
        explore.close()
    worst = max(t["seconds"] for t in ope["targets"].values())
    report = {
        "command": " ".join(["python -m evals.perf.ope", *(sys.argv[1:] if argv is None else argv)]),
        "size": args.size,
        "k": args.k,
        "explore": {"explore_serving": EXPLORE.explore_serving, "explore_width": EXPLORE.explore_width},
        "search": {name: latency_ms(times[name]) for name in ("plain", "explore")},
        "search_ratio_explore_vs_plain_median": round(statistics.median(ratios), 3),
        "feedback": latency_ms(times["feedback"]),
        "decision_bytes": {"mean": round(statistics.mean(sizes)), "max": max(sizes)},
        "disk_bytes": disk,
        "ope": ope,
        "targets": {
            "feedback_p50_at_most_1ms": latency_ms(times["feedback"])["p50_ms"] <= 1.0,
            "ope_over_logged_searches_at_most_10s": worst <= 10.0,
        },
        **provenance(load_start, started),
    }
    write_json(args.out, report)
    s = report["search"]
    print(
        f"search p50 plain {s['plain']['p50_ms']} ms, explore {s['explore']['p50_ms']} ms "
        f"(median ratio {report['search_ratio_explore_vs_plain_median']}); feedback p50 "
        f"{report['feedback']['p50_ms']} ms; decision {report['decision_bytes']['mean']} B; "
        f"OPE over {len(decisions)} searches: {worst:.2f} s per target"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
