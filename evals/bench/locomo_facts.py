"""What fact notes beside the turns add to LoCoMo's evidence recall, per category (no model, minutes).

    python -m evals.bench.locomo_facts --data locomo-dev.json [--embedder minilm]
        [--out results/locomo/facts_recall.json]

Per conversation two fresh stores with the default configuration: one of its turns (as ``run_locomo`` stores them),
one of its turns and the facts LoCoMo ships for each session (``evals/bench/session_facts.observation_facts``:
short sentences a large model wrote per speaker, each citing its turns; stamped with the session's time). Each
scored question is searched cold (k 10, ``now`` an hour after the last turn); a served fact stands for the turns it
cites. Reported per category and overall: recall@1/5/10 of both stores, the paired per-question recall@5
difference with its 95 % t-interval, and the share of the top 5 that are facts. Nothing is tuned: both stores use
the defaults. The committed JSON holds numbers and ids only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from evals.bench.retrieval import KS, command_line
from evals.bench.run_locomo import CATEGORIES, SCORED, TASK, recall_at, sample_questions, sample_turns, store_turns
from evals.bench.session_facts import observation_facts, store_facts
from evals.harness.embedders import CachedEmbedder, make_embedder
from evals.harness.jsonio import write_json
from evals.harness.replay import temp_store
from evals.harness.stats import estimate, paired
from remem_agent import RememConfig

STORES = ("turns", "turns_facts")
KMAX = max(KS)


def rank_conversation(sample: Mapping[str, Any], embedder: CachedEmbedder, *, facts: bool) -> list[dict[str, Any]]:
    """Per scored question: its category, evidence and the top-10 as (dia ids, is a fact) pairs."""
    turns, _ = sample_turns(dict(sample))
    questions, _ = sample_questions(dict(sample), {t["dia"] for t in turns})
    now = max(t["t"] for t in turns) + timedelta(hours=1)
    rows = []
    with temp_store(RememConfig(), embedder, prefix="remem_facts_") as mem:
        dias = store_turns(mem, turns)
        fact_ids = store_facts(mem, observation_facts(sample, turns), dias) if facts else set()
        for q in questions:
            res = mem.search(q["question"], k=KMAX, now=now, task=TASK)
            rows.append(
                {
                    "sample_id": str(sample.get("sample_id", "")),
                    "qa_index": q["index"],
                    "category": q["category"],
                    "evidence": q["evidence"],
                    "ranked": [sorted(dias.get(h.id, set())) for h in res.items],
                    "facts": [h.id in fact_ids for h in res.items],
                }
            )
    return rows


def summarise(by_store: Mapping[str, Sequence[Mapping[str, Any]]], meta: Mapping[str, Any]) -> dict[str, Any]:
    scored = {
        store: [{**recall_at([set(r) for r in row["ranked"]], row["evidence"]), **row} for row in rows]
        for store, rows in by_store.items()
    }

    def block(pick: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for store, rows in scored.items():
            sub = [r for r in rows if pick(r)]
            out[store] = {f"recall@{k}": round(estimate([r[f"recall@{k}"] for r in sub]).mean, 4) for k in KS}
            out[store]["n"] = len(sub)
            out[store]["facts_in_top5"] = round(estimate([sum(r["facts"][:5]) / 5 for r in sub]).mean, 4)
        a = [r["recall@5"] for r in scored["turns"] if pick(r)]
        b = [r["recall@5"] for r in scored["turns_facts"] if pick(r)]
        out["recall@5_diff"] = paired(a, b).to_dict()
        return out

    return {
        "meta": dict(meta),
        "overall": block(lambda r: True),
        "by_category": {CATEGORIES[c]: block(lambda r, c=c: r["category"] == c) for c in SCORED},
        "questions": [
            {
                "sample_id": r["sample_id"],
                "qa_index": r["qa_index"],
                "recall@5": {store: scored[store][i]["recall@5"] for store in scored},
            }
            for i, r in enumerate(scored["turns"])
        ],
    }


def markdown(summary: Mapping[str, Any]) -> str:
    meta = summary["meta"]
    lines = [
        f"# LoCoMo evidence recall with fact notes beside the turns ({meta['embedder']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        "| questions | n | recall@5 turns | recall@5 turns + facts | difference (95 % CI) | facts in top 5 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, blk in [("all", summary["overall"]), *summary["by_category"].items()]:
        d = blk["recall@5_diff"]
        lines.append(
            f"| {name} | {blk['turns']['n']} | {blk['turns']['recall@5']:.3f} | {blk['turns_facts']['recall@5']:.3f} | "
            f"{d['mean']:+.3f} ± {d['ci95']:.3f} | {100 * blk['turns_facts']['facts_in_top5']:.0f} % |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="LoCoMo JSON (a list of samples)")
    ap.add_argument("--embedder", default="minilm", choices=("hash", "minilm", "onnx"))
    ap.add_argument("--out", default="results/locomo/facts_recall.json")
    args = ap.parse_args(argv)
    samples = json.loads(Path(args.data).read_text(encoding="utf-8"))
    samples = [samples] if isinstance(samples, dict) else samples
    embedder = make_embedder(args.embedder)
    by_store: dict[str, list[dict[str, Any]]] = {store: [] for store in STORES}
    for sample in samples:
        for store in STORES:
            by_store[store] += rank_conversation(sample, embedder, facts=store == "turns_facts")
        print(f"{sample.get('sample_id')}: ranked", file=sys.stderr, flush=True)
    meta = {
        "command": command_line("evals.bench.locomo_facts", argv if argv is not None else sys.argv[1:]),
        "embedder": embedder.name,
        "data": Path(args.data).name,
        "facts": "LoCoMo's observation field (a large model's per-session facts, each citing its turns)",
        "k": KMAX,
    }
    summary = summarise(by_store, meta)
    out = Path(args.out)
    write_json(out, summary)
    out.with_suffix(".md").write_text(markdown(summary), encoding="utf-8")
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
