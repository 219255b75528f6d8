"""SQLite + numpy flat index vs PostgreSQL + pgvector HNSW, in one run on one machine (a benchmark, not a test).

The run starts its own PostgreSQL 16 with pgvector (the ``pgserver`` package) in a temporary folder,
so both backends share the CPU, the disk and the load of the moment. For each store size it builds
the same synthetic store (``evals.perf.core.make_world``, hash embedder) in both backends and measures:

* batched add throughput (``ReMem.add_many`` in batches of ``--batch``);
* ``ReMem.search`` latency (k=5, default config) over the same queries, the two backends
  interleaved per query with the order alternating, so neither always runs on a warmer machine;
* ``ReMem.feedback`` latency over fresh searches (the same payload, by served position, for both);
* many users on one store (``--user-scopes`` scopes of ``--user-memories`` facts added beside it): search
  latency in one user's scope and whether both backends served the same memories there;
* how approximate the HNSW index is: for every measured query, the exact cosine top-k and
  top-pool of the flat index against the candidates pgvector returns (``pool`` = the over-fetch
  ``ReMem`` ranks, ``max(min_pool, k * pool_factor)``), and the fraction of the ids SQLite's
  ``search`` served that PostgreSQL's ``search`` served for the same query (end to end).

Then the concurrency part: ``--workers`` processes (spawned) each open their own ``ReMem`` on one
PostgreSQL database holding ``--conc-memories`` memories and run ``--cycles`` search + feedback
cycles at the same time. Reported: feedback calls per second overall, latencies under contention,
transaction retries (counted by wrapping each worker's ``store.transact`` so every run of the
transaction body is seen: runs minus calls = retried attempts; PostgreSQL's own rollback counter is
given as a cross-check), "lost updates" (per memory and task class, the workers' receipts summed
against the ledger's statistics: must be 0) and ``verify().ok``.

Usage::

    python -m evals.perf.postgres [--sizes 10000 100000] [--out results/perf/postgres.json]
    python -m evals.perf.postgres --quick      # CI smoke: one small size, few cycles

Latencies are wall time. ``client_cpu_s`` is this process's CPU; ``server_cpu_s`` is the CPU of
the PostgreSQL server's processes over the same interval (the work pgvector does in the server).
Adding to PostgreSQL is dominated by HNSW index maintenance inside the server.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import random
import shutil
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from evals.harness.jsonio import write_json
from evals.perf.core import make_world
from evals.perf.measure import git_commit, git_dirty, latency_ms, loadavg, machine_facts
from remem_agent import MemoryInput, ReMem
from remem_agent.types import ALL_TASKS

BACKENDS = ("sqlite", "postgres")
COUNT_FIELDS = ("retrieved", "shown", "credited", "wasted", "blamed")
SUM_FIELDS = ("credit_sum", "blame_sum")
EF_SEARCH_SWEEP = (40, 100, 200, 400)
TIE_EPS = 1e-5  # cosines this close are ties (pgvector and numpy round float32 differently)
Log = Callable[[str], None]


# -- the private server ------------------------------------------------------------------------
@contextmanager
def private_server(folder: Path) -> Iterator[Any]:
    """A PostgreSQL 16 + pgvector server (pgserver) with its data in ``folder``; stopped on exit."""
    from pgserver.postgres_server import get_server

    server = get_server(folder, cleanup_mode="stop")
    try:
        yield server
    finally:
        server.cleanup()


def create_database(server: Any, name: str, *, exist_ok: bool = False) -> str:
    """Create database ``name`` on ``server`` (with ``exist_ok``, only when missing); returns a URL for it."""
    import psycopg

    admin = str(server.get_uri())
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = exist_ok and conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    before, sep, params = admin.partition("?")
    return before[: before.rfind("/") + 1] + name + sep + params


def server_facts(url: str) -> dict[str, Any]:
    """Server version, pgvector version and the settings that matter for the timings."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:

        def show(name: str) -> Any:
            row = conn.execute(f"SHOW {name}").fetchone()
            return row[0] if row else None

        facts: dict[str, Any] = {"version": show("server_version")}
        row = conn.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()
        facts["pgvector"] = row[0] if row else None
        for name in ("shared_buffers", "work_mem", "maintenance_work_mem", "fsync", "synchronous_commit"):
            facts[name] = show(name)
    return facts


def _proc_cpu_s(pid: int, *, children: bool = False) -> float:
    """CPU seconds of one process from /proc (with ``children``: plus its reaped children's)."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu_s(server: Any) -> float | None:
    """CPU seconds used so far by the PostgreSQL server: the postmaster, its live and exited children."""
    try:
        pid = int(server.get_pid())
    except Exception:  # noqa: BLE001 - no pid, no CPU figure
        return None
    total = _proc_cpu_s(pid, children=True)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text.rsplit(")", 1)[1].split()[1]) == pid:
            total += _proc_cpu_s(int(stat.parent.name))
    return total


# -- one size, both backends -------------------------------------------------------------------
def timed_add(mem: ReMem, items: Sequence[MemoryInput], batch: int, cpu_of_server: Callable[[], float | None]) -> Any:
    """Add ``items`` in batches; returns (the ids in order, the add report)."""
    ids: list[str] = []
    batch_ns: list[int] = []
    gc.collect()
    s0 = cpu_of_server()
    c0 = time.process_time()
    t0 = time.perf_counter_ns()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "also ..." wording warnings are expected on synthetic data
        for start in range(0, len(items), batch):
            tb = time.perf_counter_ns()
            ids += mem.add_many(items[start : start + batch])
            batch_ns.append(time.perf_counter_ns() - tb)
    wall = (time.perf_counter_ns() - t0) / 1e9
    client_cpu = time.process_time() - c0
    s1 = cpu_of_server()
    per_batch = [min(batch, len(items) - j * batch) / (ns / 1e9) for j, ns in enumerate(batch_ns)]
    tenth = max(1, len(per_batch) // 10)
    report = {
        "memories": len(items),
        "batch_size": batch,
        "seconds": round(wall, 3),
        "per_s": round(len(items) / wall, 1),
        "client_cpu_s": round(client_cpu, 3),
        "server_cpu_s": None if s0 is None or s1 is None else round(s1 - s0, 3),
        "batch_per_s_first_10pct": round(float(np.mean(per_batch[:tenth])), 1),
        "batch_per_s_last_10pct": round(float(np.mean(per_batch[-tenth:])), 1),
        "batch_ms": latency_ms(batch_ns),
        "rows_in_ledger": mem.stats().memories,
    }
    return ids, report


def analyze_tables(url: str, schema: str = "remem") -> float:
    """``VACUUM (ANALYZE)`` the ledger's tables after the bulk load; returns the seconds it took.

    Why: right after a load the planner has no statistics for the new rows. It guessed that the default
    scope held 49 of 3,000 memories and ranked a full scope exactly, and the server's autovacuum of the
    fresh HNSW and GIN indexes ran during the searches. The searches measure a store at rest; what
    the load itself cost is ``seconds`` and ``server_cpu_s``, and this step is reported beside them.
    """
    import psycopg

    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("memories", "events", "searches", "stats", "credits"):
            conn.execute(f'VACUUM (ANALYZE) "{schema}".{table}')
    return round(time.perf_counter() - t, 2)


def _overlap(truth: Sequence[str], got: Sequence[str]) -> float:
    return len(set(truth) & set(got)) / len(truth) if truth else 1.0


def bench_size(
    n: int,
    *,
    server: Any,
    root: Path,
    n_queries: int,
    warmup: int,
    batch: int,
    k: int,
    seed: int,
    log: Log,
    user_scopes: int = 0,
    user_memories: int = 200,
    analyze: bool = True,
) -> dict[str, Any]:
    load_start = loadavg()
    t_gen = time.perf_counter()
    world = make_world(n, warmup + 2 * n_queries, seed=seed)
    gen_s = time.perf_counter() - t_gen
    log(f"[{n}] generated {len(world.items)} facts and {len(world.queries)} queries in {gen_s:.1f}s")

    def no_server_cpu() -> float | None:
        return None

    pg_url = create_database(server, f"perf_{n}")
    mems = {"sqlite": ReMem(root / f"sqlite_{n}"), "postgres": ReMem(pg_url)}
    out: dict[str, Any] = {"size": n, "generate_s": round(gen_s, 2), "loadavg_start": load_start}
    ids: dict[str, list[str]] = {}
    try:
        for b in BACKENDS:
            cpu = (lambda: server_cpu_s(server)) if b == "postgres" else no_server_cpu
            ids[b], add = timed_add(mems[b], world.items, batch, cpu)
            if b == "postgres" and analyze:
                add["analyze_s"] = analyze_tables(pg_url)
            out[b] = {"add": add, "index": type(mems[b].index).__name__}
            server_cpu = "" if add["server_cpu_s"] is None else f", server CPU {add['server_cpu_s']}s"
            log(f"[{n}] {b} add: {add['per_s']:.0f}/s ({add['seconds']}s{server_cpu})")
        # The same fact list gives the same memories in both ledgers: map ids by position.
        to_pg: dict[str, str] = {}
        for s_id, p_id in zip(ids["sqlite"], ids["postgres"], strict=True):
            if to_pg.setdefault(s_id, p_id) != p_id:
                raise RuntimeError(f"the two backends stored the facts differently ({s_id} -> {p_id}, {to_pg[s_id]})")
        out["same_memories"] = len(to_pg) == len(set(to_pg.values()))

        queries = world.queries
        warm, measure, fb_queries = (
            queries[:warmup],
            queries[warmup : warmup + n_queries],
            queries[warmup + n_queries :],
        )
        for q, task in warm:
            for b in BACKENDS:
                mems[b].search(q, k=k, task=task)
        out["recall"] = candidate_recall(mems, to_pg, measure, k)
        log(
            f"[{n}] HNSW recall: top-{k} {out['recall']['topk_recall']:.3f}, "
            f"pool of {out['recall']['pool']} {out['recall']['pool_recall']:.3f}, "
            f"exact top-{k} inside the pool {out['recall']['topk_in_pool']:.3f}"
        )
        sweep = ef_search_sweep(mems, to_pg, measure, out["recall"]["pool"], EF_SEARCH_SWEEP)
        out["recall"]["ef_search_sweep"] = sweep
        log(
            f"[{n}] pool recall by hnsw.ef_search: "
            + ", ".join(f"{e['ef_search']}: {e['pool_recall']:.3f} ({e['query_ms']['p50_ms']:.2f} ms)" for e in sweep)
        )
        search, agreement = timed_searches(mems, to_pg, measure, k)
        for b in BACKENDS:
            out[b]["search"] = search[b]
        out["recall"]["served_agreement"] = agreement
        log(
            f"[{n}] search p50/p95 ms: sqlite {search['sqlite']['p50_ms']:.2f}/{search['sqlite']['p95_ms']:.2f}, "
            f"postgres {search['postgres']['p50_ms']:.2f}/{search['postgres']['p95_ms']:.2f}; "
            f"served agreement {agreement['mean']:.3f}"
        )
        feedback = timed_feedback(mems, fb_queries, k, seed)
        for b in BACKENDS:
            out[b]["feedback"] = feedback[b]
        log(
            f"[{n}] feedback p50/p95 ms: sqlite {feedback['sqlite']['p50_ms']:.3f}/"
            f"{feedback['sqlite']['p95_ms']:.3f}, postgres {feedback['postgres']['p50_ms']:.3f}/"
            f"{feedback['postgres']['p95_ms']:.3f}"
        )
        if user_scopes:
            out["user_scopes"] = bench_user_scopes(
                mems, to_pg, users=user_scopes, memories=user_memories, queries=n_queries, k=k, seed=seed
            )
            us = out["user_scopes"]["search"]
            log(
                f"[{n}] search in one of {user_scopes} scopes of {user_memories} memories beside the {n}, p50/p95 ms: "
                f"sqlite {us['sqlite']['p50_ms']:.2f}/{us['sqlite']['p95_ms']:.2f}, "
                f"postgres {us['postgres']['p50_ms']:.2f}/{us['postgres']['p95_ms']:.2f}; "
                f"served agreement {out['user_scopes']['served_agreement']['mean']:.3f}"
            )
    finally:
        for m in mems.values():
            m.close()
    out["loadavg_end"] = loadavg()
    return out


def bench_user_scopes(
    mems: dict[str, ReMem],
    to_pg: dict[str, str],
    *,
    users: int,
    memories: int,
    queries: int,
    k: int,
    seed: int,
) -> dict[str, Any]:
    """Many users on one store: ``users`` scopes of ``memories`` facts each are added beside the size's
    default scope, then searches run in one user's scope at a time (each user's own questions, round robin).

    Why: on PostgreSQL a scope that holds a small share of the ledger is where an HNSW search filtered after
    the index scan returns too few rows; both backends must serve that user's own best memories.
    """
    per_user = max(1, -(-queries // users))
    asked: list[tuple[str, str]] = []
    scopes: list[str] = []
    by_user: list[list[tuple[str, str]]] = []
    for u in range(users):
        world = make_world(memories, per_user, seed=seed + 1 + u)
        scope = f"user:{u:03d}"
        got = {b: mems[b].add_many(world.items, scope=scope) for b in BACKENDS}
        for s_id, p_id in zip(got["sqlite"], got["postgres"], strict=True):
            to_pg.setdefault(s_id, p_id)
        by_user.append(list(world.queries))
    for j in range(per_user):
        for u in range(users):
            if len(asked) < queries:
                asked.append(by_user[u][j])
                scopes.append(f"user:{u:03d}")
    search, agreement = timed_searches(mems, to_pg, asked, k, scopes)
    return {"users": users, "memories_per_user": memories, "search": search, "served_agreement": agreement}


def candidate_recall(
    mems: dict[str, ReMem], to_pg: dict[str, str], queries: Sequence[tuple[str, str]], k: int
) -> dict[str, Any]:
    """The HNSW candidates against the exact flat index's, on the pool ``ReMem`` over-fetches and on the top k."""
    flat, hnsw = mems["sqlite"].index, mems["postgres"].index
    cfg = mems["postgres"].config
    pool = min(len(flat), max(cfg.min_pool, k * cfg.pool_factor))
    topk: list[float] = []
    in_pool: list[float] = []
    pooled: list[float] = []
    topk_ties: list[float] = []
    pooled_ties: list[float] = []
    flat_ns: list[int] = []
    hnsw_ns: list[int] = []
    for q, _task in queries:
        vec = mems["postgres"].embedder.embed([q])[0]
        t = time.perf_counter_ns()
        exact, exact_sims = flat.candidates(vec, pool)
        flat_ns.append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns()
        approx, approx_sims = hnsw.candidates(vec, pool)
        hnsw_ns.append(time.perf_counter_ns() - t)
        exact = [to_pg[i] for i in exact]
        topk.append(_overlap(exact[:k], approx[:k]))
        in_pool.append(_overlap(exact[:k], approx))
        pooled.append(_overlap(exact, approx))
        # Tie-aware: a returned memory as similar as the exact k-th (or pool-th) one counts as found.
        for n_top, out in ((min(k, len(exact)), topk_ties), (len(exact), pooled_ties)):
            if n_top:
                floor = float(exact_sims[n_top - 1]) - TIE_EPS
                out.append(min(n_top, int(np.sum(np.asarray(approx_sims[:n_top]) >= floor))) / n_top)
    return {
        "queries": len(queries),
        "k": k,
        "pool": pool,
        "topk_recall": round(float(np.mean(topk)), 4),
        "topk_in_pool": round(float(np.mean(in_pool)), 4),
        "pool_recall": round(float(np.mean(pooled)), 4),
        "pool_recall_min": round(float(np.min(pooled)), 4),
        "topk_recall_tie_aware": round(float(np.mean(topk_ties)), 4),
        "pool_recall_tie_aware": round(float(np.mean(pooled_ties)), 4),
        "queries_with_pool_recall_below_0_9": int(sum(r < 0.9 for r in pooled)),
        "candidates_ms": {"sqlite_flat": latency_ms(flat_ns), "postgres_hnsw": latency_ms(hnsw_ns)},
    }


def ef_search_sweep(
    mems: dict[str, ReMem], to_pg: dict[str, str], queries: Sequence[tuple[str, str]], pool: int, efs: Sequence[int]
) -> list[dict[str, Any]]:
    """Pool recall and HNSW query time at other ``hnsw.ef_search`` values (the library uses ``max(40, pool)``).

    Runs the candidate query directly on the store's database (same ORDER BY, same index), so it shows
    what a larger search list would buy without changing the library.
    """
    vecs = [mems["postgres"].embedder.embed([q])[0] for q, _task in queries]
    exact = [[to_pg[i] for i in mems["sqlite"].index.candidates(v, pool)[0]] for v in vecs]
    out = []
    for ef in efs:
        recall, ns = [], []
        with mems["postgres"].store.read() as tx:
            tx.run(f"SET LOCAL hnsw.ef_search = {int(ef)}")
            for vec, want in zip(vecs, exact, strict=True):
                t = time.perf_counter_ns()
                rows = tx.run("SELECT id FROM memories ORDER BY embedding <=> ? LIMIT ?", (vec, pool)).fetchall()
                ns.append(time.perf_counter_ns() - t)
                recall.append(_overlap(want, [r[0] for r in rows]))
        out.append({"ef_search": int(ef), "pool_recall": round(float(np.mean(recall)), 4), "query_ms": latency_ms(ns)})
    return out


def timed_searches(
    mems: dict[str, ReMem],
    to_pg: dict[str, str],
    queries: Sequence[tuple[str, str]],
    k: int,
    scopes: Sequence[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Search latency per backend (interleaved per query) and how often both served the same ids;
    ``scopes[j]`` is query j's scope (default: the default scope)."""
    ns: dict[str, list[int]] = {b: [] for b in BACKENDS}
    cpu = dict.fromkeys(BACKENDS, 0)
    agree: list[float] = []
    identical = 0
    gc.collect()
    for j, (q, task) in enumerate(queries):
        served: dict[str, list[str]] = {}
        for b in BACKENDS if j % 2 == 0 else BACKENDS[::-1]:
            c = time.process_time_ns()
            t = time.perf_counter_ns()
            res = mems[b].search(q, k=k, task=task, scope=scopes[j] if scopes else None)
            ns[b].append(time.perf_counter_ns() - t)
            cpu[b] += time.process_time_ns() - c
            served[b] = list(res.ids)
        want = [to_pg[i] for i in served["sqlite"]]
        agree.append(_overlap(want, served["postgres"]))
        identical += want == served["postgres"]
    out = {}
    for b in BACKENDS:
        out[b] = latency_ms(ns[b])
        out[b]["client_cpu_mean_ms"] = round(cpu[b] / 1e6 / max(1, len(queries)), 4)
    agreement = {
        "mean": round(float(np.mean(agree)), 4) if agree else 1.0,
        "identical_rankings": identical,
        "queries": len(queries),
    }
    return out, agreement


def _payload(rng: random.Random, n_served: int) -> dict[str, Any]:
    """A feedback verdict as positions in the served list (so both backends get the same one)."""
    used = rng.sample(range(n_served), min(n_served, rng.randint(0, 2)))
    cited = [i for i in range(n_served) if i in used or rng.random() < 0.2]
    return {"success": rng.random() < 0.7, "used": used, "cited": cited}


def timed_feedback(mems: dict[str, ReMem], queries: Sequence[tuple[str, str]], k: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    ns: dict[str, list[int]] = {b: [] for b in BACKENDS}
    gc.collect()
    for j, (q, task) in enumerate(queries):
        results = {b: mems[b].search(q, k=k, task=task) for b in BACKENDS}
        fb = _payload(rng, min(len(r.ids) for r in results.values()))
        for b in BACKENDS if j % 2 == 0 else BACKENDS[::-1]:
            ids = results[b].ids
            t = time.perf_counter_ns()
            mems[b].feedback(
                results[b].search_id,
                success=fb["success"],
                used_ids=[ids[i] for i in fb["used"]],
                cited_ids=[ids[i] for i in fb["cited"]],
            )
            ns[b].append(time.perf_counter_ns() - t)
    return {b: latency_ms(ns[b]) for b in BACKENDS}


# -- concurrency -------------------------------------------------------------------------------
def count_attempts(mem: ReMem) -> dict[str, int]:
    """Wrap ``mem.store.transact`` (on this object only) to count calls and runs of the body.

    A body runs once more for every retry after a serialization conflict, so runs - calls = retries.
    """
    counter = {"learning_calls": 0, "learning_runs": 0, "commutative_calls": 0, "commutative_runs": 0}
    original = mem.store.transact

    def transact(fn: Callable[[Any], Any], *, commutative: bool = False) -> Any:
        kind = "commutative" if commutative else "learning"
        counter[f"{kind}_calls"] += 1

        def body(tx: Any) -> Any:
            counter[f"{kind}_runs"] += 1
            return fn(tx)

        return original(body, commutative=commutative)

    mem.store.transact = transact  # type: ignore[method-assign]  # counting wrapper on this one instance
    return counter


def cycle_worker(
    url: str,
    worker: int,
    cycles: int,
    queries: Sequence[tuple[str, str | None]],
    k: int,
    seed: int,
    barrier: Any,
    out_path: str,
) -> None:
    """One process: ``cycles`` x (search, feedback) on the shared store; writes its receipts as JSON."""
    rec: dict[str, Any] = {"worker": worker, "cycles": [], "errors": [], "search_ns": [], "feedback_ns": []}
    rng = random.Random(seed * 1000 + worker)
    mem = None
    try:
        mem = ReMem(url)
        rec["transactions"] = count_attempts(mem)
        barrier.wait(300)
        rec["t_start"] = time.time()
        for _ in range(cycles):
            q, task = rng.choice(queries)
            t = time.perf_counter_ns()
            res = mem.search(q, k=k, task=task)
            rec["search_ns"].append(time.perf_counter_ns() - t)
            fb = _payload(rng, len(res.ids))
            used, cited = [res.ids[i] for i in fb["used"]], [res.ids[i] for i in fb["cited"]]
            runs = rec["transactions"]["learning_runs"]
            t = time.perf_counter_ns()
            receipt = mem.feedback(res.search_id, success=fb["success"], used_ids=used, cited_ids=cited)
            rec["feedback_ns"].append(time.perf_counter_ns() - t)
            rec["cycles"].append(
                {
                    "search_id": res.search_id,
                    "task": task,
                    "served": list(res.ids),
                    "credit": dict(receipt.credit),
                    "blame": dict(receipt.blame),
                    "repeated": receipt.repeated,
                    "transitions": len(receipt.transitions),
                    "attempts": rec["transactions"]["learning_runs"] - runs,
                }
            )
        rec["t_end"] = time.time()
    except BaseException:  # noqa: BLE001 - reported by the parent
        rec["errors"].append(f"worker {worker}:\n{traceback.format_exc()}")
        barrier.abort()  # nobody waits for a worker that will not come
    finally:
        if mem is not None:
            mem.close()
        write_json(out_path, rec, newline=False)


def run_workers(
    url: str,
    queries: Sequence[tuple[str, str | None]],
    *,
    workers: int,
    cycles: int,
    k: int,
    seed: int,
    folder: Path,
    timeout_s: float = 900.0,
) -> list[dict[str, Any]]:
    """Start ``workers`` spawned processes running ``cycle_worker`` at once; returns their records."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    outs = [folder / f"worker{w}_{uuid.uuid4().hex[:8]}.json" for w in range(workers)]
    procs = [
        ctx.Process(target=cycle_worker, args=(url, w, cycles, list(queries), k, seed, barrier, str(outs[w])))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if any(p.exitcode not in (None, 0) for p in procs):
            barrier.abort()  # a worker died before the start line: do not keep the others waiting
        time.sleep(0.1)
    records = []
    for w, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            p.join()
        if outs[w].exists():
            records.append(json.loads(outs[w].read_text()))
        else:
            records.append({"worker": w, "cycles": [], "errors": [f"worker {w} exited with {p.exitcode}, no record"]})
    return records


def sent_statistics(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """(memory id, task row) -> statistic, summed from the workers' searches and receipts."""
    sent: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: dict.fromkeys(COUNT_FIELDS + SUM_FIELDS, 0))
    for rec in records:
        for c in rec["cycles"]:
            rows = (ALL_TASKS,) if c["task"] is None else (ALL_TASKS, c["task"])
            for mid in c["served"]:
                credit, blame = c["credit"].get(mid), c["blame"].get(mid)
                for row in rows:
                    s = sent[(mid, row)]
                    s["retrieved"] += 1
                    if credit is None:  # a memory the receipt does not mention got no feedback
                        continue
                    s["shown"] += 1
                    s["credited"] += credit > 0
                    s["blamed"] += blame > 0
                    s["wasted"] += credit == 0 and blame == 0
                    s["credit_sum"] += credit
                    s["blame_sum"] += blame
    return sent


def ledger_statistics(mem: ReMem) -> dict[tuple[str, str], dict[str, float]]:
    ids = [m.id for m in mem.list()]
    with mem.store.read() as tx:
        by_memory = tx.stats_all_classes(ids)
    return {
        (mid, row): {f: getattr(ts, f) for f in COUNT_FIELDS + SUM_FIELDS}
        for mid, rows in by_memory.items()
        for row, ts in rows.items()
    }


def compare_statistics(
    sent: dict[tuple[str, str], dict[str, float]], ledger: dict[tuple[str, str], dict[str, float]]
) -> dict[str, Any]:
    """Totals on both sides, lost updates (summed absolute count differences) and differing rows."""
    zero = dict.fromkeys(COUNT_FIELDS + SUM_FIELDS, 0)
    lost = 0
    differing: list[dict[str, Any]] = []
    for key in sorted(set(sent) | set(ledger)):
        s, g = sent.get(key, zero), ledger.get(key, zero)
        lost += sum(abs(int(s[f]) - int(g[f])) for f in COUNT_FIELDS)
        if any(int(s[f]) != int(g[f]) for f in COUNT_FIELDS) or any(abs(s[f] - g[f]) > 1e-6 for f in SUM_FIELDS):
            differing.append({"memory": key[0], "task": key[1], "sent": dict(s), "ledger": dict(g)})
    fields = COUNT_FIELDS + SUM_FIELDS
    return {
        "sent_totals": {f: round(sum(v[f] for v in sent.values()), 4) for f in fields},
        "ledger_totals": {f: round(sum(v[f] for v in ledger.values()), 4) for f in fields},
        "lost_updates": lost,
        "rows_compared": len(set(sent) | set(ledger)),
        "rows_differing": len(differing),
        "differing_examples": differing[:5],
    }


def _db_counters(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return {"xact_commit": int(row[0]), "xact_rollback": int(row[1])} if row else {}


def bench_concurrency(
    *,
    server: Any,
    root: Path,
    memories: int,
    workers: int,
    cycles: int,
    k: int,
    seed: int,
    batch: int,
    log: Log,
) -> dict[str, Any]:
    load_start = loadavg()
    world = make_world(memories, 400, seed=seed + 11)
    url = create_database(server, "perf_concurrency")
    with ReMem(url) as mem, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for start in range(0, memories, batch):
            mem.add_many(world.items[start : start + batch])
    queries = [(q, None if j % 4 == 0 else task) for j, (q, task) in enumerate(world.queries)]
    log(f"[concurrency] {memories} memories; {workers} workers x {cycles} search+feedback cycles ...")
    time.sleep(1.0)  # let the statistics collector settle before the baseline
    before = _db_counters(url)
    cpu0 = server_cpu_s(server)
    records = run_workers(url, queries, workers=workers, cycles=cycles, k=k, seed=seed, folder=root)
    cpu1 = server_cpu_s(server)
    time.sleep(1.0)  # exited backends flush their statistics
    after = _db_counters(url)

    errors = [e for r in records for e in r["errors"]]
    feedbacks = sum(len(r["cycles"]) for r in records)
    finished = [r for r in records if "t_end" in r]
    span = (max(r["t_end"] for r in finished) - min(r["t_start"] for r in finished)) if finished else 0.0
    tx = [r.get("transactions", {}) for r in records]
    calls = sum(t.get("learning_calls", 0) for t in tx)
    runs = sum(t.get("learning_runs", 0) for t in tx)
    attempts = Counter(c["attempts"] for r in records for c in r["cycles"])
    commutative_retries = sum(t.get("commutative_runs", 0) - t.get("commutative_calls", 0) for t in tx)
    with ReMem(url) as mem:
        report = mem.verify()
        comparison = compare_statistics(sent_statistics(records), ledger_statistics(mem))
        by_state = {s: c for s, c in mem.stats().by_state.items() if c}
    out = {
        "memories": memories,
        "workers": workers,
        "cycles_per_worker": cycles,
        "k": k,
        "feedback_calls": feedbacks,
        "repeated_receipts": sum(c["repeated"] for r in records for c in r["cycles"]),
        "lifecycle_transitions": sum(c["transitions"] for r in records for c in r["cycles"]),
        "seconds": round(span, 3),
        "updates_per_s": round(feedbacks / span, 1) if span > 0 else None,
        "search_ms": latency_ms([ns for r in records for ns in r.get("search_ns", [])]),
        "feedback_ms": latency_ms([ns for r in records for ns in r.get("feedback_ns", [])]),
        "server_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 3),
        "retries": {
            "observed_by": "wrapping each worker's store.transact: runs of the transaction body minus calls",
            "learning_transactions": calls,
            "learning_retries": runs - calls,
            "retry_rate": round((runs - calls) / calls, 4) if calls else None,
            "commutative_retries": commutative_retries,
            "per_worker": [t.get("learning_runs", 0) - t.get("learning_calls", 0) for t in tx],
            "feedbacks_by_attempts": {str(a): n for a, n in sorted(attempts.items())},
            "pg_stat_database_delta": {key: after[key] - before.get(key, 0) for key in after},
        },
        **comparison,
        "verify_ok": report.ok,
        "verify_problems": list(report.problems)[:10],
        "by_state_after": by_state,
        "errors": errors[:5],
        "worker_errors": len(errors),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
    }
    log(
        f"[concurrency] {out['updates_per_s']} feedback/s over {span:.1f}s; retries {runs - calls}/{calls}; "
        f"lost updates {out['lost_updates']}; verify ok {report.ok}; worker errors {len(errors)}"
    )
    return out


# -- report ------------------------------------------------------------------------------------
def print_table(result: dict[str, Any]) -> None:
    print()
    hdr = (
        f"{'size':>7} {'backend':>9} {'add/s':>8} {'search p50':>11} {'p95':>7} {'fb p50':>7} {'fb p95':>7} "
        f"{'top-k rec':>9} {'pool rec':>8} {'served agr':>10}"
    )
    print(hdr)
    print("-" * len(hdr))
    for s in result["sizes"]:
        r = s["recall"]
        for b in BACKENDS:
            d = s[b]
            tail = (
                f"{r['topk_recall']:>9.3f} {r['pool_recall']:>8.3f} {r['served_agreement']['mean']:>10.3f}"
                if b == "postgres"
                else ""
            )
            print(
                f"{s['size']:>7} {b:>9} {d['add']['per_s']:>8.0f} {d['search']['p50_ms']:>11.2f} "
                f"{d['search']['p95_ms']:>7.2f} {d['feedback']['p50_ms']:>7.2f} {d['feedback']['p95_ms']:>7.2f} {tail}"
            )
    for s in result["sizes"]:
        u = s.get("user_scopes")
        if u:
            print(
                f"{s['size']:>7} + {u['users']} scopes of {u['memories_per_user']}: search in one scope p50/p95 ms "
                f"sqlite {u['search']['sqlite']['p50_ms']:.2f}/{u['search']['sqlite']['p95_ms']:.2f}, "
                f"postgres {u['search']['postgres']['p50_ms']:.2f}/{u['search']['postgres']['p95_ms']:.2f}, "
                f"served agreement {u['served_agreement']['mean']:.3f}"
            )
    c = result["concurrency"]
    print(
        f"\nconcurrency: {c['workers']} processes x {c['cycles_per_worker']} cycles on {c['memories']} memories: "
        f"{c['updates_per_s']} feedback/s, feedback p50/p95 {c['feedback_ms'].get('p50_ms')}/"
        f"{c['feedback_ms'].get('p95_ms')} ms, retries {c['retries']['learning_retries']} of "
        f"{c['retries']['learning_transactions']} learning transactions, lost updates {c['lost_updates']}, "
        f"verify ok {c['verify_ok']}, worker errors {c['worker_errors']}"
    )
    print(f"wall time {result['wall_time_s']:.1f}s -> {result['out']}")


# -- main --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.postgres", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="store sizes")
    ap.add_argument("--queries", type=int, default=300, help="measured queries per size (and as many feedbacks)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1000, help="add_many batch size")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=4, help="concurrent worker processes")
    ap.add_argument("--cycles", type=int, default=500, help="search+feedback cycles per worker")
    ap.add_argument("--conc-memories", type=int, default=1000, help="memories in the shared store")
    ap.add_argument("--user-scopes", type=int, default=20, help="user scopes added beside each size (0: none)")
    ap.add_argument("--user-memories", type=int, default=200, help="memories per user scope")
    ap.add_argument(
        "--no-analyze", action="store_true", help="search right after the load (no VACUUM ANALYZE in between)"
    )
    ap.add_argument("--out", default="results/perf/postgres.json")
    ap.add_argument("--tmpdir", default=None, help="where the stores and the server's data go")
    ap.add_argument("--quick", action="store_true", help="CI smoke: size 1000, 40 queries, 4 x 15 cycles")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.warmup = [1000], min(args.queries, 40), min(args.warmup, 5)
        args.cycles, args.conc_memories = min(args.cycles, 15), min(args.conc_memories, 300)
        args.user_scopes, args.user_memories = min(args.user_scopes, 3), min(args.user_memories, 50)
    if min(args.sizes) < 100 or args.queries < 1 or args.workers < 1 or args.cycles < 1:
        ap.error("sizes must be >= 100; --queries, --workers and --cycles >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_wall = time.perf_counter()
    load_start = loadavg()
    root = Path(tempfile.mkdtemp(prefix="remem_perf_pg_", dir=args.tmpdir))
    per_size: list[dict[str, Any]] = []
    try:
        with private_server(root / "pgdata") as server:
            postgres = server_facts(server.get_uri())
            log(f"PostgreSQL {postgres['version']} with pgvector {postgres['pgvector']} in {root}")
            for n in args.sizes:
                per_size.append(
                    bench_size(
                        n,
                        server=server,
                        root=root,
                        n_queries=args.queries,
                        warmup=args.warmup,
                        batch=args.batch,
                        k=args.k,
                        seed=args.seed,
                        log=log,
                        user_scopes=args.user_scopes,
                        user_memories=args.user_memories,
                        analyze=not args.no_analyze,
                    )
                )
                shutil.rmtree(root / f"sqlite_{n}", ignore_errors=True)
                gc.collect()
            concurrency = bench_concurrency(
                server=server,
                root=root,
                memories=args.conc_memories,
                workers=args.workers,
                cycles=args.cycles,
                k=args.k,
                seed=args.seed,
                batch=args.batch,
                log=log,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result: dict[str, Any] = {
        "benchmark": "perf_postgres",
        "quick": bool(args.quick),
        "config": {
            "sizes": args.sizes,
            "queries": args.queries,
            "warmup": args.warmup,
            "batch": args.batch,
            "k": args.k,
            "seed": args.seed,
            "workers": args.workers,
            "cycles": args.cycles,
            "conc_memories": args.conc_memories,
            "user_scopes": args.user_scopes,
            "user_memories": args.user_memories,
            "analyze_after_load": not args.no_analyze,
            "remem_config": "default",
            "embedder": "default (hash)",
            "backends": {"sqlite": "SQLite ledger + numpy FlatIndex", "postgres": "PostgreSQL + pgvector HNSW"},
        },
        "machine": {**machine_facts(), "postgres": postgres},
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sizes": per_size,
        "concurrency": concurrency,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "wall_time_s": round(time.perf_counter() - t_wall, 2),
        "out": args.out,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result, indent=2, sort_keys=True)
    print_table(result)
    ok = concurrency["lost_updates"] == 0 and concurrency["verify_ok"] and not concurrency["worker_errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
