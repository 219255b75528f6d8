"""The abstain gate (``RememConfig(abstain="null")``): does it keep unrelated memories out without losing relevant ones?

Two measurements, with a real embedder (all-MiniLM-L6-v2, ``--embedder``):

1. **A near-empty store.** Eight notes about one team's services (``NOTES``). ``UNRELATED`` questions ask about
   nothing they hold; ``RELATED`` questions each ask about one note (its gold). Every question goes through
   ``MemoryAgent.chat`` in front of a model that only records its request, with the gate off and on, and once
   with no memory at all. Reported: the share of unrelated questions the gate abstains on, the share of related
   ones whose gold note is served, and the prompt tokens (every message of the request the model got,
   ``remem_agent.tokens.count_tokens``) against no memory.
2. **Real conversations (LoCoMo dev, categories 1-4).** Every question has evidence in its conversation, so an
   abstention there loses recall. Per question: evidence recall@5 of the default configuration (gate off), the
   best cosine similarity of its pool and the query's null cosines; recall@5 with the gate is the same recall
   where the best candidate clears the threshold and 0 where it abstains.

The rule that picks ``abstain_quantile`` (declared before the run): among the quantiles of ``QUANTILES`` with
margin 0, the highest (the most abstentions) whose LoCoMo recall@5 loss is at most 0.5 pp and whose
near-empty gold-served rate is at least 95 %; the table lists every quantile, so the choice can be checked.

Usage (LoCoMo is not part of the repository; see its README)::

    python -m evals.bench.abstain_gate --data locomo-dev.json [--embedder minilm]

Writes ``results/abstain/gate.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from evals.bench.run_locomo import recall_at, sample_questions, sample_turns, store_turns
from evals.harness.embedders import make_embedder
from evals.harness.jsonio import write_json
from evals.harness.replay import temp_store
from remem_agent import RememConfig
from remem_agent.adapters.base import ChatRequest
from remem_agent.adapters.fakes import FunctionChatModel
from remem_agent.agent import MemoryAgent
from remem_agent.ranking.gate import NULL_TEXTS
from remem_agent.tokens import count_tokens

QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
MAX_RECALL_LOSS = 0.005
MIN_GOLD_SERVED = 0.95

NOTES = (
    "The billing service runs in eu-west-2.",
    "Deploys to production need two approvals from the platform team.",
    "The on-call rotation changes every Monday at 9:00.",
    "Our staging database is PostgreSQL 16 on db-stage-01.",
    "Customer invoices are sent on the first working day of the month.",
    "The search API has a rate limit of 600 requests per minute per key.",
    "Priya owns the incident runbooks.",
    "Feature flags are managed in LaunchDarkly under the project web-core.",
)
RELATED = (  # (question, index of its gold note)
    ("Which region does billing run in?", 0),
    ("Where is the billing service hosted?", 0),
    ("How many approvals does a production deploy need?", 1),
    ("Who has to approve a deploy to prod?", 1),
    ("When does the on-call rotation change?", 2),
    ("What day does on-call hand over?", 2),
    ("What database does staging use?", 3),
    ("Which host runs the staging database?", 3),
    ("When are customer invoices sent?", 4),
    ("On which day do we send invoices?", 4),
    ("What is the rate limit of the search API?", 5),
    ("How many requests per minute can a key make to search?", 5),
    ("Who owns the incident runbooks?", 6),
    ("Who should I ask about the runbooks for incidents?", 6),
    ("Where are feature flags managed?", 7),
    ("Which LaunchDarkly project holds our flags?", 7),
)
UNRELATED = (
    "What is the capital of Australia?",
    "How do I make a sourdough starter?",
    "Write a haiku about the sea.",
    "Who painted the Mona Lisa?",
    "What is the boiling point of water at high altitude?",
    "Recommend a science fiction novel.",
    "How many legs does a spider have?",
    "What is the difference between weather and climate?",
    "Translate 'good morning' into Spanish.",
    "Why do leaves change colour in autumn?",
    "How long does it take to walk ten kilometres?",
    "What are the rules of tic-tac-toe?",
    "Give me a tip for learning to juggle.",
    "What is photosynthesis?",
    "Who was the first person on the moon?",
    "How do I clean a cast iron pan?",
    "What is a prime number?",
    "Suggest a name for a black kitten.",
    "How do volcanoes form?",
    "What should I cook for dinner tonight?",
    "hi",
    "Tell me a joke.",
    "What is the square root of 144?",
    "How do noise-cancelling headphones work?",
)


def _memory_config(quantile: float | None) -> RememConfig:
    return RememConfig() if quantile is None else RememConfig(abstain="null", abstain_quantile=quantile)


async def _near_empty(embedder: Any, quantile: float | None, *, with_memory: bool = True) -> dict[str, Any]:
    """Every question through MemoryAgent.chat; what the model was sent, and what was served."""
    seen: list[ChatRequest] = []

    def model_fn(req: ChatRequest) -> str:
        seen.append(req)
        return "noted"

    rows = []
    with temp_store(_memory_config(quantile), embedder, prefix="remem_gate_") as mem:
        ids = mem.add_many(list(NOTES)) if with_memory else []
        agent = MemoryAgent(mem, FunctionChatModel(model_fn), trace=False)
        try:
            for kind, items in (("related", RELATED), ("unrelated", [(q, None) for q in UNRELATED])):
                for question, gold in items:
                    reply = await agent.chat([{"role": "user", "content": question}])
                    prompt = sum(count_tokens(m.content) for m in seen[-1].messages)
                    served = [h.id for h in reply.served]
                    rows.append(
                        {
                            "kind": kind,
                            "question": question,
                            "prompt_tokens": prompt,
                            "served": len(served),
                            "abstained": reply.abstained,
                            "gold_served": None if gold is None or not ids else ids[gold] in served,
                        }
                    )
        finally:
            await agent.aclose()
    return _near_empty_summary(rows)


def _near_empty_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("related", "unrelated"):
        part = [r for r in rows if r["kind"] == kind]
        out[kind] = {
            "questions": len(part),
            "abstained": sum(r["abstained"] for r in part) / len(part),
            "mean_served": sum(r["served"] for r in part) / len(part),
            "mean_prompt_tokens": sum(r["prompt_tokens"] for r in part) / len(part),
        }
        if kind == "related":
            out[kind]["gold_served"] = sum(bool(r["gold_served"]) for r in part) / len(part)
    return out


def _locomo(embedder: Any, data: Path) -> list[dict[str, Any]]:
    """Per scored question: recall@5 of the default configuration, its pool's best cosine, its null cosines."""
    samples = json.loads(data.read_text())
    null = np.asarray(embedder.embed(list(NULL_TEXTS)), dtype=np.float64)
    rows: list[dict[str, Any]] = []
    for sample in samples:
        turns, _ = sample_turns(sample)
        questions, _ = sample_questions(sample, {t["dia"] for t in turns})
        if not turns or not questions:
            continue
        now = max(t["t"] for t in turns) + timedelta(hours=1)
        with temp_store(RememConfig(), embedder, prefix="remem_gate_") as mem:
            dias = store_turns(mem, turns)
            for q in questions:
                res = mem.search(q["question"], k=10, now=now)
                ranked = [dias.get(h.id, set()) for h in res.items]
                qvec = np.asarray(embedder.embed([q["question"]]), dtype=np.float32)[0]
                cands = mem.candidates(qvec, k=10, at=now.timestamp(), query=q["question"])
                sims = np.asarray(cands.similarities, dtype=np.float64)
                rows.append(
                    {
                        "sample": sample.get("sample_id"),
                        "recall5": recall_at(ranked, q["evidence"])["recall@5"],
                        "best": float(sims.max()) if sims.size else float("-inf"),
                        "null": (null @ qvec.astype(np.float64)).tolist(),
                    }
                )
    return rows


def _locomo_at(rows: list[dict[str, Any]], quantile: float) -> dict[str, Any]:
    kept = [r["best"] > float(np.quantile(r["null"], quantile)) for r in rows]
    base = sum(r["recall5"] for r in rows) / len(rows)
    gated = sum(r["recall5"] for r, k in zip(rows, kept, strict=True) if k) / len(rows)
    return {
        "questions": len(rows),
        "abstained": 1 - sum(kept) / len(rows),
        "recall5_off": base,
        "recall5_gated": gated,
        "recall5_loss": base - gated,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="LoCoMo JSON (e.g. locomo-dev.json)")
    ap.add_argument("--embedder", default="minilm", choices=("minilm", "hash"))
    ap.add_argument("--out", type=Path, default=Path("results/abstain/gate.json"))
    args = ap.parse_args(argv)
    t0 = time.time()
    embedder = make_embedder(args.embedder)
    no_memory = asyncio.run(_near_empty(embedder, None, with_memory=False))
    off = asyncio.run(_near_empty(embedder, None))
    locomo = _locomo(embedder, args.data)
    table: list[dict[str, Any]] = []
    for q in QUANTILES:
        near = asyncio.run(_near_empty(embedder, q))
        table.append({"quantile": q, "margin": 0.0, "near_empty": near, "locomo": _locomo_at(locomo, q)})
        loc, none = table[-1]["locomo"], no_memory["unrelated"]["mean_prompt_tokens"]
        print(
            f"q={q:<5} unrelated abstained {near['unrelated']['abstained']:.2f} "
            f"tokens {near['unrelated']['mean_prompt_tokens']:.1f} (none {none:.1f}) "
            f"related gold {near['related']['gold_served']:.2f} locomo abstained {loc['abstained']:.3f} "
            f"loss {loc['recall5_loss'] * 100:+.2f} pp"
        )
    ok = [
        row
        for row in table
        if row["locomo"]["recall5_loss"] <= MAX_RECALL_LOSS
        and row["near_empty"]["related"]["gold_served"] >= MIN_GOLD_SERVED
    ]
    chosen = max(ok, key=lambda row: row["quantile"]) if ok else None
    result = {
        "benchmark": "abstain_gate",
        "command": "python -m evals.bench.abstain_gate --data locomo-dev.json"
        + (f" --embedder {args.embedder}" if args.embedder != "minilm" else ""),
        "embedder": embedder.name,
        "data": args.data.name,
        "null_texts": len(NULL_TEXTS),
        "rule": (
            f"highest quantile with LoCoMo recall@5 loss <= {MAX_RECALL_LOSS * 100:.1f} pp and near-empty gold served "
            f">= {MIN_GOLD_SERVED:.0%}"
        ),
        "no_memory": no_memory,
        "gate_off": off,
        "table": table,
        "chosen": None if chosen is None else {"quantile": chosen["quantile"], "margin": chosen["margin"]},
        "seconds": round(time.time() - t0, 1),
    }
    write_json(args.out, result)
    print(json.dumps(result["chosen"]), f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
