"""Tenants at scale on PostgreSQL: scope-filtered search over a skewed store, against an exact scan.

The run starts its own PostgreSQL 16 + pgvector (pgserver) and bulk-loads ``--memories`` memories (hash
embedder: embedding a million texts with MiniLM would take hours here) into ``--scopes`` scopes whose sizes
follow a Zipf law (size of the scope of rank r proportional to 1/r**``--zipf``), so a few scopes are large
(at 1M memories, 1,000 scopes and exponent 1: the largest holds ~134k) beside many small ones. Then, per
scope-size bucket, ``--queries`` searches of sampled scopes measure what ``PostgresStore.candidates`` (the
path every search takes: exact for small scopes, HNSW with re-query and exact fallback for large ones)
costs and finds: latency p50/p99, and recall@10 against the exact best 10 of that scope
(an exact scan of the scope's rows). Three paths are timed on the same queries: the exact scan, the ledger's
HNSW index with the scope filter (re-asked wider, then exact, when too few pass), and after
``PostgresStore.index_scopes()`` built an index for each scope that is due (remem_agent/store/pg_search.py), the
store's own choice (``auto``). ``--pgdata DIR`` keeps the loaded server, so a later run measures again without
loading.

Usage::

    python -m evals.perf.tenants [--memories 1000000] [--scopes 1000] [--zipf 1.0] [--queries 50]
                                 [--out results/perf/tenants.json]
    python -m evals.perf.tenants --quick        # 20k memories, 100 scopes: a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
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

LOADED = "public.tenants_loaded"  # what a kept --pgdata folder holds
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
    """Every scope's memories through ``ReMem.add_many`` (the ledger's own write path), with the HNSW index
    dropped after the first batch and built once at the end (as a bulk load into PostgreSQL is done)."""
    import psycopg

    from remem_agent import ReMem

    rng = random.Random(seed)
    t0 = time.perf_counter()
    dropped = False
    with ReMem(url, embedder="hash") as mem:
        for s, size in enumerate(sizes):
            texts = facts(size, rng)
            left = size
            while left:
                n = min(batch, left)
                mem.add_many([{"text": next(texts), "role": "note"} for _ in range(n)], scope=f"tenant:{s}")
                left -= n
                if not dropped:  # the first add typed the vector column and built the index: drop it for the load
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("DROP INDEX remem.memories_embedding_hnsw")
                    dropped = True
            if s % 50 == 0:
                print(json.dumps({"scope": s, "loaded_s": round(time.perf_counter() - t0, 1)}), flush=True)
    added = time.perf_counter() - t0
    t1 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '4GB'")
        conn.execute("SET max_parallel_maintenance_workers = 1")
        conn.execute("CREATE INDEX memories_embedding_hnsw ON remem.memories USING hnsw (embedding vector_cosine_ops)")
        conn.execute("VACUUM ANALYZE remem.memories")
        conn.execute(f"CREATE TABLE {LOADED} (memories bigint, sizes jsonb, seed int)")
        conn.execute(f"INSERT INTO {LOADED} VALUES (%s, %s, %s)", (sum(sizes), json.dumps(sizes), seed))
    return {
        "add_s": round(added, 1),
        "index_build_s": round(time.perf_counter() - t1, 1),
        "memories": sum(sizes),
        "adds_per_s": round(sum(sizes) / added, 1),
    }


def loaded(url: str, sizes: list[int], seed: int) -> bool:
    """Whether the database already holds this very load (``--pgdata`` kept from an earlier run)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        table = conn.execute("SELECT to_regclass(%s)", (LOADED,)).fetchone()
        if table is None or table[0] is None:
            return False
        row = conn.execute(f"SELECT sizes, seed FROM {LOADED}").fetchone()
    if row is None or row[0] != sizes or row[1] != seed:
        raise SystemExit(f"--pgdata holds another load than this one ({LOADED}); give a new folder")
    return True


def _recall(got_sims: np.ndarray, exact_sims: list[float]) -> float:
    """Share of the exact best 10 that a path found, by similarity: a tie at the 10th place counts either way."""
    if not exact_sims:
        return 1.0
    floor = exact_sims[min(K, len(exact_sims)) - 1] - 1e-6
    return min(1.0, float(np.sum(np.asarray(got_sims)[:K] >= floor)) / min(K, len(exact_sims)))


def sample_queries(sizes: list[int], queries: int, seed: int) -> dict[str, list[tuple[int, str]]]:
    """Per size bucket, ``queries`` (scope, query text) pairs, the same for every path."""
    rng = random.Random(seed + 1)
    by_bucket: dict[str, list[int]] = {}
    for s, size in enumerate(sizes):
        by_bucket.setdefault(bucket_of(size), []).append(s)
    return {
        name: [(rng.choice(members), next(facts(1, rng))) for _ in range(queries)]
        for name, members in by_bucket.items()
    }


EXACT_PROBE_SIZES = (1_000, 2_000, 3_000, 5_000, 7_500, 10_000, 20_000)


def exact_by_size(mem: Any, sizes: list[int], seed: int, repeats: int = 21) -> dict[str, Any]:
    """The exact scan's latency against the scope's size (the scope nearest each probe size, warm: one scan first),
    which decides up to what size a scope is ranked exactly."""
    rng = random.Random(seed + 2)
    search = mem.store.vector_search()
    out: dict[str, Any] = {}
    for probe in EXACT_PROBE_SIZES:
        s = min(range(len(sizes)), key=lambda i: abs(sizes[i] - probe))
        key = frozenset({f"tenant:{s}"})
        q = np.asarray(mem.embedder.embed([next(facts(1, rng))])[0], dtype=np.float32)
        search._exact(q, K, key)
        lat = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            search._exact(q, K, key)
            lat.append(time.perf_counter_ns() - t0)
        out[str(probe)] = {"scope_rows": sizes[s], "latency": latency_ms(lat)}
    return out


def measure(url: str, sizes: list[int], queries: int, seed: int) -> dict[str, Any]:
    """Per bucket: the exact scan (the truth), the ledger's HNSW index with the scope filter (re-query, fallback),
    then, after ``index_scopes()`` built the indexes of the scopes that are due, the product's own path."""
    from remem_agent import ReMem

    plan = sample_queries(sizes, queries, seed)
    out: dict[str, Any] = {}
    with ReMem(url, embedder="hash") as mem:
        store: Any = mem.store
        search = store.vector_search()
        truth: dict[str, list[list[float]]] = {}
        timings: dict[str, dict[str, list[float]]] = {}
        recalls: dict[str, dict[str, list[float]]] = {}
        vectors = {name: mem.embedder.embed([text for _, text in pairs]) for name, pairs in plan.items()}

        def run(path: str, fn: Any) -> None:
            for name, pairs in plan.items():
                for (s, _), q in zip(pairs, vectors[name], strict=True):
                    key = frozenset({f"tenant:{s}"})
                    t0 = time.perf_counter_ns()
                    sims = fn(np.asarray(q, dtype=np.float32), key)
                    timings.setdefault(name, {}).setdefault(path, []).append(time.perf_counter_ns() - t0)
                    if path == "exact":
                        truth.setdefault(name, []).append([float(x) for x in sims])
                    else:
                        got = recalls.setdefault(name, {}).setdefault(path, [])
                        got.append(_recall(np.asarray(sims), truth[name][len(got)]))

        out["_exact_by_scope_size"] = exact_by_size(mem, sizes, seed)
        run("exact", lambda q, key: [float(r[1]) for r in search._exact(q, K, key)])
        run("ledger_index", lambda q, key: [float(r[1]) for r in search._ledger_index_filtered(q, K, key)])
        t0 = time.perf_counter()
        indexed = store.index_scopes()
        build_s = round(time.perf_counter() - t0, 1)
        run("auto", lambda q, key: store.candidates(q, K, scopes=key)[1])
        for name, pairs in plan.items():
            members = sorted({s for s, _ in pairs})
            out[name] = {
                "scopes": sum(1 for size in sizes if bucket_of(size) == name),
                "memories": sum(size for size in sizes if bucket_of(size) == name),
                "queries": len(pairs),
                "sampled_scopes": len(members),
                "paths": {
                    path: {
                        "latency": latency_ms(timings[name][path]),
                        **(
                            {
                                "recall_at_10": round(float(np.mean(recalls[name][path])), 4),
                                "recall_min": round(float(np.min(recalls[name][path])), 4),
                            }
                            if path != "exact"
                            else {}
                        ),
                    }
                    for path in ("exact", "ledger_index", "auto")
                },
            }
        out["_scope_indexes"] = {"built": len(indexed), "build_s": build_s, "largest": indexed[:3]}
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
    ap.add_argument("--pgdata", help="keep the server's data here; a later run with the same settings reuses the load")
    ap.add_argument("--load-only", action="store_true", help="load (into --pgdata) and stop")
    args = ap.parse_args(argv)
    if args.quick:
        args.memories, args.scopes, args.queries = 20_000, 100, 10
    from evals.perf.postgres import create_database, private_server

    sizes = scope_sizes(args.memories, args.scopes, args.zipf)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        folder = Path(args.pgdata) if args.pgdata else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = stack.enter_context(private_server(folder))
        url = create_database(server, "tenants", exist_ok=True)  # a kept --pgdata already holds it
        load_report = {"reused": True} if loaded(url, sizes, args.seed) else load(url, sizes, args.batch, args.seed)
        print(json.dumps({"loaded": load_report}), flush=True)
        if args.load_only:
            return 0
        buckets = measure(url, sizes, args.queries, args.seed)
    out = {
        "benchmark": "scope-filtered search over Zipf-sized scopes on PostgreSQL (hash embedder)",
        "command": "python -m evals.perf.tenants" + (" --quick" if args.quick else ""),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "quick")},
        "largest_scope": sizes[0],
        "smallest_scope": sizes[-1],
        "load": load_report,
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
