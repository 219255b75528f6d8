"""What the store's re-ranker costs (a benchmark, not a test).

Two stores of ``--size`` generated memories (``evals.perf.core.make_world``, that benchmark's default embedder):
one with the default configuration, one with ``rerank="store"``. Each query is asked of both, in alternating
order, and answered with a verdict, so the re-ranking store records re-rank features, fits on its schedule (at 20
answered searches, then each time they grew by half) and re-ranks with what it fitted. Reported: each side's
search p50/p95 and the median per-query ratio rerank / plain (over all searches, and over those made once a model
was in use), each side's feedback latency, and every fit: after how many answered searches, how long
the feedback call that made it took, and whether it produced a model.

Usage::

    python -m evals.perf.rerank [--size 10000] [--searches 3000] [--out results/perf/rerank.json]
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
from remem_agent.learning import rerank_fit

RERANK = RememConfig(rerank="store")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=10_000, help="memories in each store")
    ap.add_argument("--searches", type=int, default=3_000, help="searches with a verdict (each side)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("results/perf/rerank.json"))
    args = ap.parse_args(argv)
    started, load_start = time.perf_counter(), loadavg()
    world = make_world(args.size, args.searches, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="remem-rerank-perf-") as tmp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
            plain, rerank = ReMem(Path(tmp) / "plain"), ReMem(Path(tmp) / "rerank", config=RERANK)
            for mem in (plain, rerank):
                for i in range(0, len(world.items), 1000):
                    mem.add_many(world.items[i : i + 1000])
        times: dict[str, list[int]] = {"plain": [], "rerank": [], "feedback": [], "feedback_plain": []}
        ratios: list[float] = []
        ratios_with_model: list[float] = []
        fits: list[dict[str, Any]] = []
        for n, (query, task) in enumerate(world.queries[: args.searches]):
            pair = [("plain", plain), ("rerank", rerank)]
            if n % 2:
                pair.reverse()
            took: dict[str, int] = {}
            modelled = rerank.reranker.model() is not None
            for name, mem in pair:
                t0 = time.perf_counter_ns()
                res = mem.search(query, k=args.k, task=task)
                took[name] = time.perf_counter_ns() - t0
                before = mem.reranker.state.attempted if name == "rerank" else 0
                t0 = time.perf_counter_ns()
                mem.feedback(res.search_id, success=n % 3 != 0, cited_ids=list(res.ids[:1]))
                spent = time.perf_counter_ns() - t0
                times["feedback" if name == "rerank" else "feedback_plain"].append(spent)
                if name == "rerank":
                    state = mem.reranker.state
                    if state.attempted != before:
                        fits.append(
                            {
                                "answered": state.attempted,
                                "feedback_ms": round(spent / 1e6, 2),
                                "model": state.model is not None,
                                "rows": None if state.model is None else state.model.rows,
                            }
                        )
            for name, ns in took.items():
                times[name].append(ns)
            ratios.append(took["rerank"] / took["plain"])
            if modelled:
                ratios_with_model.append(took["rerank"] / took["plain"])
        plain.close()
        rerank.close()
    report = {
        "command": " ".join(["python -m evals.perf.rerank", *(sys.argv[1:] if argv is None else argv)]),
        "size": args.size,
        "k": args.k,
        "searches": args.searches,
        "max_searches_per_fit": rerank_fit.MAX_SEARCHES,
        "search": {name: latency_ms(times[name]) for name in ("plain", "rerank")},
        "search_ratio_rerank_vs_plain_median": round(statistics.median(ratios), 3),
        "search_ratio_with_model_median": round(statistics.median(ratios_with_model), 3) if ratios_with_model else None,
        "feedback": latency_ms(times["feedback"]),
        "feedback_plain": latency_ms(times["feedback_plain"]),
        "fits": fits,
        **provenance(load_start, started),
    }
    write_json(args.out, report)
    slowest = max((f["feedback_ms"] for f in fits), default=0.0)
    print(
        f"search p50 plain {report['search']['plain']['p50_ms']} ms, rerank {report['search']['rerank']['p50_ms']} ms "
        f"(median ratio {report['search_ratio_rerank_vs_plain_median']}, with a model "
        f"{report['search_ratio_with_model_median']}); feedback p50 {report['feedback']['p50_ms']} ms (plain "
        f"{report['feedback_plain']['p50_ms']} ms); "
        f"{len(fits)} fits, the slowest feedback call {slowest} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
