"""Middleware overhead benchmark: everything ``MemoryAgent.ask`` does except the model call.

A store of N memories (hash embedder) is wrapped by ``MemoryAgent`` around a ``FunctionChatModel``
that answers instantly with a valid cited JSON reply, so the measured time is recall (embed, index,
ledger reads, ranking, selection, search record) + prompt building + schema enforcement + scoring +
learning (feedback transaction) + the trace line write. The model's own time (~0 here) is subtracted
per call from the middleware's own per-stage timings.

Usage::

    python -m evals.perf.middleware [--memories 10000] [--asks 300] [--out results/perf/middleware.json]
    python -m evals.perf.middleware --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from evals.harness.jsonio import write_json
from evals.perf.measure import git_commit, git_dirty
from remem_agent import ReMem
from remem_agent.adapters import ChatRequest, FunctionChatModel
from remem_agent.agent import MemoryAgent, load_traces

TARGET_P50_MS = 5.0
ENTITIES = [f"service-{i}" for i in range(400)]
ATTRS = ["region", "owner", "database", "cache", "oncall", "version", "queue", "budget"]
VALUES = ["west-2", "east-1", "alice", "bob", "postgres", "redis", "kafka", "v3", "v4", "carol", "sqs", "dana"]
FILLER = "the team noted that during the last review this was checked again by the platform group".split()


def corpus(n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        e, a, v = rng.choice(ENTITIES), rng.choice(ATTRS), rng.choice(VALUES)
        extra = " ".join(rng.sample(FILLER, rng.randint(2, 8)))
        if i % 3 == 0:
            out.append({"text": f"The {a} of {e} is {v}; {extra}.", "entity": e, "attribute": a, "timestamp": i})
        else:
            out.append({"text": f"Note {i} about {e} and its {a}: {extra} {v}.", "role": "note", "timestamp": i})
    return out


def percentiles(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs)
    return {f"p{q}_ms": round(float(np.percentile(a, q)), 4) for q in (50, 95, 99)} | {"n": len(xs)}


async def measure(n: int, asks: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="perf-mw-") as tmp:
        mem = ReMem(Path(tmp) / "store", embedder="hash")
        facts = corpus(n, rng)
        for start in range(0, n, 2000):
            mem.add_many(facts[start : start + 2000])

        def reply(req: ChatRequest) -> str:
            assert req.json_schema is not None
            ids = req.json_schema["properties"]["citations"].get("items", {}).get("enum", [])
            return json.dumps({"answer": "west-2", "citations": ids[:1]})

        agent = MemoryAgent(mem, FunctionChatModel(reply), trace=Path(tmp) / "trace.jsonl", max_concurrency=1)
        questions = [f"What is the {rng.choice(ATTRS)} of {rng.choice(ENTITIES)}?" for _ in range(asks + 30)]
        overhead, recall, learn, total = [], [], [], []
        for i, q in enumerate(questions):
            t0 = time.perf_counter()
            await agent.ask(q, task=rng.choice(["ops", "billing", "oncall"]), truth={"answer": "west-2"}, now=n + 1)
            wall = (time.perf_counter() - t0) * 1000
            if i < 30:  # warm-up
                continue
            total.append(wall)
        lines = load_traces(Path(tmp) / "trace.jsonl", kind="ask")[30:]
        for line, wall in zip(lines, total, strict=True):
            lat = line["latency_ms"]
            overhead.append(wall - lat["model"])
            recall.append(lat["recall"])
            learn.append(lat["learn"])
        ok = mem.verify().ok
        mem.close()
    return {
        "memories": n,
        "asks": asks,
        "overhead": percentiles(overhead),
        "recall": percentiles(recall),
        "learn": percentiles(learn),
        "total_including_fake_model": percentiles(total),
        "verify_ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memories", type=int, default=10_000)
    ap.add_argument("--asks", type=int, default=300)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default="results/perf/middleware.json")
    ap.add_argument("--quick", action="store_true", help="small store and few asks (CI smoke)")
    args = ap.parse_args(argv)
    if args.quick:
        args.memories, args.asks = 1000, 40
    t0 = time.perf_counter()
    res = asyncio.run(measure(args.memories, args.asks, args.seed))
    p50 = res["overhead"]["p50_ms"]
    report = {
        "benchmark": "perf_middleware",
        "command": "python -m evals.perf.middleware" + (" --quick" if args.quick else ""),
        "result": res,
        "target": {"overhead_p50_ms": TARGET_P50_MS, "met": p50 <= TARGET_P50_MS},
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "numpy": np.__version__},
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "wall_time_s": round(time.perf_counter() - t0, 2),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, report, indent=2, sort_keys=True)
    o, r, le = res["overhead"], res["recall"], res["learn"]
    print(f"middleware overhead at {res['memories']} memories, {res['asks']} asks:")
    print(f"  overhead p50 {o['p50_ms']:.2f} ms  p95 {o['p95_ms']:.2f} ms  (target p50 <= {TARGET_P50_MS} ms)")
    print(f"  recall   p50 {r['p50_ms']:.2f} ms  learn p50 {le['p50_ms']:.2f} ms")
    print(f"  wrote {out}")
    return 0 if res["verify_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
