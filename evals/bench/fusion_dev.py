"""Choosing the fusion rule on the LoCoMo dev conversations: cold evidence recall of each candidate rule.

    python -m evals.bench.fusion_dev --data locomo-dev.json --embedder minilm
        [--out results/locomo/fusion_dev.json]

The pure fusion step (:func:`remem_agent.ranking.fusion.fuse`) applied to the two channels' lists
(dense: the embedder's cosine top 40; lexical: plain BM25's top 40, evals/bench/bm25.py, a stand-in for the
ledger's FTS5 / tsvector channel) for every scored question of the run_locomo protocol (turns as notes,
categories 1-4). No store and no utility: this isolates the fusion rule, so the rules can be compared
before the full pipeline is measured with ``run_locomo``. The chosen rule is RememConfig's default.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from evals.bench.bm25 import BM25
from evals.bench.retrieval import KS
from evals.bench.run_locomo import CATEGORIES, SCORED, recall_at, sample_questions, sample_turns
from evals.harness.embedders import make_embedder
from evals.harness.jsonio import write_json
from evals.harness.stats import estimate
from remem_agent.config import RememConfig
from remem_agent.ranking.fusion import fuse

POOL = 40


def rules() -> dict[str, RememConfig]:
    """The candidate rules: each channel alone, RRF over offsets and lexical weights, the cosine bonus."""
    base = RememConfig()
    out = {"dense": replace(base, retrieval="dense"), "lexical": replace(base, retrieval="lexical")}
    for c in (1.0, 10.0, 30.0, 60.0):
        for w in (0.5, 1.0, 1.5, 2.0):
            out[f"rrf_k{c:g}_w{w:g}"] = replace(base, fusion="rrf", rrf_k=c, lexical_weight=w)
    for w in (0.1, 0.2, 0.3, 0.5, 1.0):
        out[f"bonus_w{w:g}"] = replace(base, fusion="bonus", lexical_weight=w)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--embedder", choices=("hash", "minilm"), default="minilm")
    ap.add_argument("--out", default="results/locomo/fusion_dev.json")
    args = ap.parse_args(argv)
    samples = json.loads(Path(args.data).read_text(encoding="utf-8"))
    emb = make_embedder(args.embedder)
    configs = rules()
    rows: list[dict[str, Any]] = []
    for sample in samples:
        turns, _ = sample_turns(sample)
        questions, _ = sample_questions(sample, {t["dia"] for t in turns})
        texts = [t["text"] for t in turns]
        mat = emb.embed(texts)
        qmat = emb.embed([q["question"] for q in questions])
        bm = BM25(texts)
        for q, qv in zip(questions, qmat, strict=True):
            sims = mat @ qv
            top = np.argsort(-sims, kind="stable")[:POOL]
            dense = [(str(i), float(sims[i])) for i in top]
            scores = bm.scores(q["question"])
            lex_top = [i for i in bm.top_k(q["question"], POOL) if scores[i] > 0]
            lexical = [(str(i), float(scores[i])) for i in lex_top]
            cosine = {str(i): float(sims[i]) for i in {*top.tolist(), *lex_top}}
            row: dict[str, Any] = {"category": q["category"], "systems": {}}
            for name, cfg in configs.items():
                pool = fuse(dense, lexical, cosine, config=cfg)
                ranked = [{turns[int(mid)]["dia"]} for mid in pool.ids[: max(KS)]]
                row["systems"][name] = recall_at(ranked, q["evidence"])
            rows.append(row)
    metrics: dict[str, Any] = {}
    for name in configs:
        per: dict[str, Any] = {}
        for group in ["overall", *(CATEGORIES[c] for c in SCORED)]:
            sel = [r for r in rows if group == "overall" or CATEGORIES[r["category"]] == group]
            per[group] = {
                m: estimate([r["systems"][name][m] for r in sel]).to_dict()
                for m in ("recall@1", "recall@5", "recall@10")
            }
            per[group]["questions"] = len(sel)
        metrics[name] = per
    best = max(metrics, key=lambda n: metrics[n]["overall"]["recall@5"]["mean"])
    result = {
        "command": f"python -m evals.bench.fusion_dev --data {Path(args.data).name} --embedder {args.embedder}",
        "embedder": emb.name,
        "pool": POOL,
        "questions": len(rows),
        "best_by_recall@5": best,
        "metrics": metrics,
    }
    write_json(Path(args.out), result, indent=1)
    for name in sorted(metrics, key=lambda n: -metrics[n]["overall"]["recall@5"]["mean"]):
        o = metrics[name]["overall"]
        cats = " ".join(f"{100 * metrics[name][CATEGORIES[c]]['recall@5']['mean']:.1f}" for c in SCORED)
        print(
            f"{name:18s} r@1 {100 * o['recall@1']['mean']:.1f} r@5 {100 * o['recall@5']['mean']:.1f} "
            f"r@10 {100 * o['recall@10']['mean']:.1f}  r@5 by category {cats}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
