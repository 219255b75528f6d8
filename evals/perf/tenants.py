"""Tenants at scale on PostgreSQL: scope-filtered search over a skewed store, against an exact scan.

The run starts its own PostgreSQL 16 + pgvector (pgserver) and bulk-loads ``--memories`` memories (hash
embedder: embedding a million texts with MiniLM would take hours here) into ``--scopes`` scopes whose sizes
follow a Zipf law (size of the scope of rank r proportional to 1/r**``--zipf``), so a few scopes are large
(at 1M memories, 1,000 scopes and exponent 1: the largest holds ~134k) beside many small ones. Then, per
scope-size bucket, ``--queries`` searches of sampled scopes measure what ``PostgresStore.candidates`` (the
path every search takes: exact for small scopes, HNSW with re-query and exact fallback for large ones)
costs and finds: latency p50/p99, and recall@10 against the exact best 10 of that scope
(``_exact_candidates``, an exact scan of the scope's rows).

Usage::

    python -m evals.perf.tenants [--memories 1000000] [--scopes 1000] [--zipf 1.0] [--queries 50]
                                 [--out results/perf/tenants.json]
    python -m evals.perf.tenants --quick        # 20k memories, 100 scopes: a smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from evals.harness.jsonio import write_json
from evals.perf.measure import git_commit, git_dirty, latency_ms, loadavg, machine_facts
from evals.perf.middleware import ATTRS, ENTITIES, FILLER, VALUES

BUCKETS = ((1, 100), (100, 1_000), (1_000, 10_000), (10_000, 100_000), (100_000, 10**9))
K = 10


def scope_sizes(memories: int, scopes: int, exponent: float) -> list[int]:
    """Zipf sizes summing to ``memories``, largest first, every scope at least 1."""
    weights = np.array([1.0 / (r**exponent) for r in range(1, scopes + 1)])
    sizes = np.maximum(1, np.floor(weights / weights.sum() * memories)).astype(int)
    sizes[0] += memories - int(sizes.sum())
    return [int(s) for s in sizes]


def facts(n: int, rng: random.Random) -> Iterator[str]:
    for i in range(n):
        words = " ".join(rng.sample(FILLER, rng.randint(3, 8)))
        yield f"Note {i}: the {rng.choice(ATTRS)} of {rng.choice(ENTITIES)} is {rng.choice(VALUES)}; {words}."


def bucket_of(size: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= size < hi:
            return f"{lo}-{hi if hi < 10**9 else 'inf'}"
    return "?"


def load(url: str, sizes: list[int], batch: int, seed: int) -> dict[str, Any]:
    from remem_agent import ReMem

    rng = random.Random(seed)
    t0 = time.perf_counter()
    with ReMem(url, embedder="hash") as mem:
        for s, size in enumerate(sizes):
            texts = facts(size, rng)
            left = size
            while left:
                n = min(batch, left)
                mem.add_many([{"text": next(texts), "role": "note"} for _ in range(n)], scope=f"tenant:{s}")
                left -= n
    return {"seconds": round(time.perf_counter() - t0, 1), "memories": sum(sizes)}


def measure(url: str, sizes: list[int], queries: int, seed: int) -> dict[str, Any]:
    from remem_agent import ReMem

    rng = random.Random(seed + 1)
    by_bucket: dict[str, list[int]] = {}
    for s, size in enumerate(sizes):
        by_bucket.setdefault(bucket_of(size), []).append(s)
    out: dict[str, Any] = {}
    with ReMem(url, embedder="hash") as mem:
        store: Any = mem.store
        for name, members in by_bucket.items():
            lat, recall = [], []
            for _ in range(queries):
                s = rng.choice(members)
                q = mem.embedder.embed([next(facts(1, rng))])[0]
                t0 = time.perf_counter()
                ids, _ = store.candidates(q, K, scopes=[f"tenant:{s}"])
                lat.append((time.perf_counter() - t0) * 1e9)
                exact = [
                    str(r[0]) for r in store._exact_candidates(np.asarray(q, dtype=np.float32), K, [f"tenant:{s}"])
                ]
                want = set(exact[:K])
                recall.append(len(set(ids[:K]) & want) / max(1, len(want)))
            out[name] = {
                "scopes": len(members),
                "memories": sum(sizes[s] for s in members),
                "queries": queries,
                "latency": latency_ms(lat),
                "recall_at_10": round(float(np.mean(recall)), 4),
                "recall_min": round(float(np.min(recall)), 4),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memories", type=int, default=1_000_000)
    ap.add_argument("--scopes", type=int, default=1000)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--quick", action="store_true", help="20k memories in 100 scopes")
    ap.add_argument("--out", default="results/perf/tenants.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.memories, args.scopes, args.queries = 20_000, 100, 10
    from evals.perf.postgres import create_database, private_server

    sizes = scope_sizes(args.memories, args.scopes, args.zipf)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="remem-tenants-") as folder, private_server(Path(folder)) as server:
        url = create_database(server, "tenants")
        loaded = load(url, sizes, args.batch, args.seed)
        print(json.dumps({"loaded": loaded}), flush=True)
        buckets = measure(url, sizes, args.queries, args.seed)
    out = {
        "benchmark": "scope-filtered search over Zipf-sized scopes on PostgreSQL (hash embedder)",
        "command": "python -m evals.perf.tenants" + (" --quick" if args.quick else ""),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "quick")},
        "largest_scope": sizes[0],
        "smallest_scope": sizes[-1],
        "load": loaded,
        "buckets": buckets,
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": machine_facts(),
        "loadavg_end": loadavg(),
        "commit": git_commit(),
        "dirty": git_dirty(),
    }
    write_json(args.out, out)
    print(json.dumps(buckets, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
