"""Choosing search settings on the LoCoMo dev conversations by leave-one-conversation-out.

    python -m evals.bench.locomo_loco --data locomo-dev.json --grid '{"time_weight": [0, 0.1, 0.3]}'
        [--embedder minilm] [--out results/locomo/loco.json]

Every configuration of the grid (the product of the listed ``RememConfig`` values over the defaults) runs the
``run_locomo`` protocol through the whole search pipeline: per conversation one fresh store of its turns,
each scored question searched cold (k 10, ``now`` an hour after the last turn), evidence recall@1/5/10. The
fair lexical baseline (``bm25s`` with Snowball stemming and the ledger's stopword list, the strongest BM25 of
``lexical_channel``) is scored on the same questions, twice: over the turns, and over each turn joined with the
turn before it in its session (``bm25_context``: the context ``turn_context`` gives dense recall).

Leave-one-conversation-out: for each conversation, the configuration with the best recall@5 over the other
conversations (question-weighted; ties go to the grid's earlier configuration) is scored on the held-out
one. The report gives each fold's choice and held-out figures, their mean and spread (min, max), and the
held-out BM25 beside them, overall, per category and on two time subsets: the temporal category's questions
that name a month or a four-digit year, and every question with a time expression the resolver reads.
A rule chosen the same way on every fold is stable; the per-fold spread says how much one conversation
moves the figure. The committed JSON holds numbers and ids only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from evals.bench.lexical_channel import bm25s_ranker
from evals.bench.retrieval import KS, command_line
from evals.bench.run_locomo import CATEGORIES, SCORED, TASK, recall_at, sample_questions, sample_turns, store_turns
from evals.harness.embedders import CachedEmbedder, make_embedder
from evals.harness.jsonio import write_json
from evals.harness.replay import temp_store
from remem_agent import RememConfig
from remem_agent.store import lexical
from remem_agent.temporal import resolve

_MONTH_OR_YEAR = re.compile(
    r"\b(?:january|february|march|april|may|june|july|august|september|october|november|december|1\d{3}|2\d{3})\b",
    re.IGNORECASE,
)
BM25 = "bm25"
BM25_CONTEXT = "bm25_context"  # each turn indexed with the turn before it in its session (as dense recall sees it)
BASELINES = (BM25, BM25_CONTEXT)


def with_previous(turns: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each turn's text after the one before it in the same session: the context ``turn_context`` gives dense
    recall, given to the lexical baseline too so that it is not the weaker for lacking it."""
    return [
        (f"{turns[i - 1]['text']}\n" if i and turns[i - 1]["session"] == t["session"] else "") + str(t["text"])
        for i, t in enumerate(turns)
    ]


def configs(grid: Mapping[str, Sequence[Any]]) -> dict[str, RememConfig]:
    """One configuration per combination of the grid's values (named ``key=value,...``), in grid order."""
    keys = list(grid)
    out: dict[str, RememConfig] = {}
    for values in itertools.product(*(grid[k] for k in keys)):
        name = ",".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)) or "default"
        out[name] = replace(RememConfig(), **dict(zip(keys, values, strict=True)))
    return out


def question_rows(
    samples: Sequence[Mapping[str, Any]], cfgs: Mapping[str, RememConfig], emb: CachedEmbedder
) -> list[dict[str, Any]]:
    """Per scored question: its ids, category, subsets, and recall@k under each configuration and BM25."""
    rows: list[dict[str, Any]] = []
    kmax = max(KS)
    for si, sample in enumerate(samples):
        sid = str(sample.get("sample_id", si))
        turns, _ = sample_turns(dict(sample))
        questions, _ = sample_questions(dict(sample), {t["dia"] for t in turns})
        if not turns or not questions:
            continue
        now = max(t["t"] for t in turns) + timedelta(hours=1)
        per_q = [
            {
                "sample_id": sid,
                "qa_index": q["index"],
                "category": q["category"],
                "month_or_year": q["category"] == 2 and bool(_MONTH_OR_YEAR.search(q["question"])),
                "time_expression": bool(resolve(q["question"], now, past=True)),
                "recall": {},
            }
            for q in questions
        ]
        for base, texts in ((BM25, [str(t["text"]) for t in turns]), (BM25_CONTEXT, with_previous(turns))):
            rank = bm25s_ranker(texts, sorted(lexical.STOPWORDS), k=kmax)
            for r, q in zip(per_q, questions, strict=True):
                r["recall"][base] = recall_at([{turns[int(i)]["dia"]} for i in rank(q["question"])], q["evidence"])
        for name, cfg in cfgs.items():
            with temp_store(cfg, emb, prefix="remem_loco_") as mem:
                dias = store_turns(mem, turns)
                for r, q in zip(per_q, questions, strict=True):
                    res = mem.search(q["question"], k=kmax, now=now, task=TASK)
                    r["recall"][name] = recall_at([dias.get(h.id, set()) for h in res.items], q["evidence"])
        rows += per_q
        print(f"{sid}: {len(per_q)} questions", file=sys.stderr, flush=True)
    return rows


def _mean(rows: Sequence[Mapping[str, Any]], name: str, k: int = 5) -> float | None:
    vals = [r["recall"][name][f"recall@{k}"] for r in rows]
    return round(sum(vals) / len(vals), 4) if vals else None


def subsets(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {"all": list(rows)}
    for c in SCORED:
        out[CATEGORIES[c]] = [r for r in rows if r["category"] == c]
    out["temporal_month_or_year"] = [r for r in rows if r["month_or_year"]]
    out["time_expression"] = [r for r in rows if r["time_expression"]]
    return out


def loco(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Each held-out conversation scored under the configuration chosen on the others."""
    convs = list(dict.fromkeys(r["sample_id"] for r in rows))
    folds = []
    for held in convs:
        train = [r for r in rows if r["sample_id"] != held]
        test = [r for r in rows if r["sample_id"] == held]
        scores = {n: _mean(train, n) or 0.0 for n in names}
        chosen = max(names, key=lambda n: (scores[n], -names.index(n)))
        folds.append(
            {
                "held_out": held,
                "chosen": chosen,
                "train_recall@5": scores[chosen],
                "questions": len(test),
                "recall": {
                    sub: {
                        "n": len(part),
                        "chosen": {f"recall@{k}": _mean(part, chosen, k) for k in KS} if part else None,
                        **{b: {f"recall@{k}": _mean(part, b, k) for k in KS} if part else None for b in BASELINES},
                    }
                    for sub, part in subsets(test).items()
                },
            }
        )
    summary: dict[str, Any] = {}
    for sub in subsets(rows):
        held = [(f["recall"][sub]["n"], f["recall"][sub]["chosen"]) for f in folds if f["recall"][sub]["n"]]
        bases = {
            b: [(f["recall"][sub]["n"], f["recall"][sub][b]) for f in folds if f["recall"][sub]["n"]] for b in BASELINES
        }
        if not held:
            continue
        n = sum(w for w, _ in held)
        summary[sub] = {
            "n": n,
            "recall@5": round(sum(w * v["recall@5"] for w, v in held) / n, 4),
            "recall@5_per_fold": [v["recall@5"] for _, v in held],
            "spread": [min(v["recall@5"] for _, v in held), max(v["recall@5"] for _, v in held)],
            **{f"{b}_recall@5": round(sum(w * v["recall@5"] for w, v in base) / n, 4) for b, base in bases.items()},
        }
    return {"folds": folds, "summary": summary, "choices": [f["chosen"] for f in folds]}


def per_config(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Every configuration on every conversation (and BM25): recall@5 per subset, for inspection."""
    convs = list(dict.fromkeys(r["sample_id"] for r in rows))
    out: dict[str, Any] = {}
    for name in [*names, *BASELINES]:
        out[name] = {
            sub: {c: _mean([r for r in part if r["sample_id"] == c], name) for c in convs} | {"all": _mean(part, name)}
            for sub, part in subsets(rows).items()
            if part
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument(
        "--grid", default="{}", help='JSON: RememConfig field -> list of values, e.g. {"time_weight": [0, 0.3]}'
    )
    ap.add_argument("--embedder", default="minilm", choices=("hash", "minilm", "onnx"))
    ap.add_argument("--out", default="results/locomo/loco.json")
    args = ap.parse_args(argv)
    grid = json.loads(args.grid)
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        ap.error("--grid must be a JSON object of non-empty lists")
    cfgs = configs(grid)
    samples = json.loads(Path(args.data).read_text(encoding="utf-8"))
    samples = [samples] if isinstance(samples, dict) else samples
    emb = make_embedder(args.embedder)
    rows = question_rows(samples, cfgs, emb)
    names = list(cfgs)
    chosen = loco(rows, names)
    result: dict[str, Any] = {
        "meta": {
            "command": command_line("evals.bench.locomo_loco", argv if argv is not None else sys.argv[1:]),
            "data": Path(args.data).name,
            "embedder": emb.name,
            "grid": grid,
            "questions": len(rows),
        },
        "loco": chosen,
        "per_config": per_config(rows, names),
        "questions": rows,
    }
    write_json(Path(args.out), result, indent=1)
    print(json.dumps({"choices": chosen["choices"], "summary": chosen["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
