"""Concurrent writers on one PostgreSQL store: deadlocks, retries, give-ups and wall time per workload.

    python -m evals.perf.pg_contention [--base REV] [--workers 4] [--repeats 2] [--out results/perf/pg_contention.json]

The run starts its own PostgreSQL 16 + pgvector (``pgserver``) in a temporary folder. Each workload gets a fresh
database, a seed written by the package under test, then ``--workers`` processes that start together:

* ``feedback_shared``: 20 facts; every worker runs search + feedback cycles on them (the statistics rows are
  shared, and failed feedback on used keyed facts may retire them).
* ``mixed``: keyed facts superseded by ``add`` while other workers search them and give feedback.
* ``shuffled_batches``: every worker ``add_many``s batches of facts that supersede the same keys, each batch in
  its own shuffled order.

Reported per run: the server's deadlock count for the database (``pg_stat_database.deadlocks``), the learning
transactions and how many reruns they needed, the workers that gave up (their last error), the wall time and
``verify()``. ``--base REV`` runs the same workloads with the package as of commit ``REV`` (exported beside the
working tree and imported as ``remem_base`` by the workers), so a fix can be shown against its parent on one
machine in one run. A benchmark, not a test: the tests in ``tests/store/test_postgres_concurrency.py`` check the
properties; this measures how often contention costs a retry, a deadlock or a give-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.measure import REPO_ROOT, loadavg, provenance
from evals.perf.postgres import create_database, private_server
from evals.perf.search_ab import BASE_PACKAGE, export_package, resolve_commit

WORKLOADS = ("feedback_shared", "mixed", "shuffled_batches")

# One script for the seed, the workers and the final check: argv = url, worker (-1: seed, -2: verify),
# workload, size, package name. It imports only the package under test.
_SCRIPT = r"""
import importlib, json, random, sys, traceback
url, worker, workload, size, pkgname = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
pkg = importlib.import_module(pkgname)
SERVICES = ("billing", "search", "auth", "deploy")
FACTS = [f"The {s} service {w}." for s in SERVICES for w in ("runs on port 8080", "is owned by the payments team",
         "is deployed in eu-west-1", "uses the shared postgres database", "has a monthly budget of 400 dollars")]
QUERIES = ["Which port does the billing service use?", "who owns the auth service", "where is the deploy service",
           "what database does search use", "service budget", "which region does svc1 run in", "svc2 region"]

if worker == -1:  # the seed
    with pkg.ReMem(url) as mem:
        if workload == "feedback_shared":
            mem.add_many(FACTS)
        elif workload == "mixed":
            for k in range(5):
                mem.add(f"The svc{k} service runs in region start-{k}.", entity=f"svc{k}", attribute="region",
                        timestamp=500)
    print(json.dumps({"seeded": True}))
    sys.exit(0)
if worker == -2:  # the check after the run
    with pkg.ReMem(url) as mem:
        report = mem.verify()
        print(json.dumps({"verify_ok": report.ok, "problems": list(report.problems)[:5],
                          "memories": mem.stats().memories}))
    sys.exit(0)

rec = {"worker": worker, "ops": 0, "learning_calls": 0, "learning_runs": 0, "error": None}
rng = random.Random(1000 + worker)
try:
    with pkg.ReMem(url) as mem:
        original = mem.store.transact

        def transact(fn, *, commutative=False):
            if commutative:
                return original(fn, commutative=True)
            rec["learning_calls"] += 1

            def body(tx):
                rec["learning_runs"] += 1
                return fn(tx)

            return original(body, commutative=False)

        mem.store.transact = transact
        for i in range(size):
            if workload == "shuffled_batches":
                keys = list(range(10))
                rng.shuffle(keys)
                mem.add_many([{"text": f"The svc{k} service runs in region r{worker}-{i}.", "entity": f"svc{k}",
                               "attribute": "region", "timestamp": 1000 + i * 8 + worker} for k in keys])
            elif workload == "mixed" and i % 3 == 0:
                key = f"svc{rng.randrange(5)}"
                mem.add(f"The {key} service runs in region r{worker}-{i}.", entity=key, attribute="region",
                        timestamp=1000 + i * 8 + worker)
            else:
                res = mem.search(rng.choice(QUERIES), k=5, task=rng.choice([None, "deploy", "billing"]))
                if res.ids:
                    used = rng.sample(list(res.ids), min(len(res.ids), rng.randint(0, 2)))
                    mem.feedback(res.search_id, success=rng.random() < 0.6, used_ids=used, cited_ids=used[:1])
            rec["ops"] += 1
except BaseException as exc:
    rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    rec["traceback"] = traceback.format_exc()[-1500:]
print(json.dumps(rec))
"""


def _run_script(
    url: str, worker: int, workload: str, size: int, pkg: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, url, str(worker), workload, str(size), pkg],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _last_json(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"script exited {proc.returncode}: {err[-2000:]}")
    return dict(json.loads(lines[-1]))


def _deadlocks(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def run_workload(
    server: Any, name: str, workload: str, *, workers: int, size: int, pkg: str, env: dict[str, str]
) -> dict[str, Any]:
    """One workload on a fresh database: seed, ``workers`` processes at once, then verify."""
    url = create_database(server, name)
    _last_json(_run_script(url, -1, workload, size, pkg, env), 300)
    before = _deadlocks(url)
    start = time.perf_counter()
    procs = [_run_script(url, w, workload, size, pkg, env) for w in range(workers)]
    recs = [_last_json(p, 900) for p in procs]
    seconds = time.perf_counter() - start
    time.sleep(0.5)  # backends flush their statistics when they end; give the last ones a moment
    deadlocks = _deadlocks(url) - before
    check = _last_json(_run_script(url, -2, workload, size, pkg, env), 300)
    calls = sum(r["learning_calls"] for r in recs)
    runs = sum(r["learning_runs"] for r in recs)
    errors = [r["error"] for r in recs if r["error"]]
    return {
        "workload": workload,
        "workers": workers,
        "size": size,
        "seconds": round(seconds, 2),
        "deadlocks": deadlocks,
        "workers_given_up": len(errors),
        "errors": errors,
        "operations": sum(r["ops"] for r in recs),
        "learning_transactions": calls,
        "learning_reruns": runs - calls,
        "verify_ok": check["verify_ok"],
        "verify_problems": check["problems"],
    }


def _sizes(quick: bool) -> dict[str, int]:
    """Per worker: cycles (feedback_shared, mixed) or batches of 10 keyed facts (shuffled_batches)."""
    return (
        {"feedback_shared": 10, "mixed": 15, "shuffled_batches": 3}
        if quick
        else {
            "feedback_shared": 60,
            "mixed": 90,
            "shuffled_batches": 30,
        }
    )


def run_all(
    server: Any,
    *,
    label: str,
    pkg: str,
    env: dict[str, str],
    workers: int,
    repeats: int,
    quick: bool,
    log: Callable[[str], None],
) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {w: [] for w in WORKLOADS}
    sizes = _sizes(quick)
    for r in range(repeats):
        for workload in WORKLOADS:
            res = run_workload(
                server, f"{label}_{workload}_{r}", workload, workers=workers, size=sizes[workload], pkg=pkg, env=env
            )
            out[workload].append(res)
            log(
                f"{label:>4} {workload:<17} run {r}: {res['seconds']:6.1f} s, {res['deadlocks']:3d} deadlocks, "
                f"{res['learning_reruns']:4d} reruns of {res['learning_transactions']}, "
                f"{res['workers_given_up']} gave up, verify {'ok' if res['verify_ok'] else 'FAILED'}"
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.perf.pg_contention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="also run the workloads with the package as of this commit")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="runs of every workload (per package)")
    ap.add_argument("--quick", action="store_true", help="tiny workloads (a smoke test of the script)")
    ap.add_argument("--out", default="results/perf/pg_contention.json")
    ap.add_argument("--tmpdir", help="where the private server's data folder goes")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.repeats < 1:
        ap.error("--workers and --repeats must be at least 1")
    base = resolve_commit(ap, args.base) if args.base else None
    log = print
    t0, load_start = time.perf_counter(), loadavg()
    report: dict[str, Any] = {
        "benchmark": "pg_contention",
        "command": "python -m evals.perf.pg_contention " + " ".join(argv if argv is not None else sys.argv[1:]),
        "quick": args.quick,
        "workers": args.workers,
        "repeats": args.repeats,
        "sizes": _sizes(args.quick),
    }
    with (
        tempfile.TemporaryDirectory(prefix="remem_pgc_", dir=args.tmpdir) as tmp,
        private_server(Path(tmp) / "pg") as server,
    ):
        env = dict(os.environ)
        report["head"] = run_all(
            server,
            label="head",
            pkg="remem_agent",
            env=env,
            workers=args.workers,
            repeats=args.repeats,
            quick=args.quick,
            log=log,
        )
        if base is not None:
            folder = Path(tmp) / "base"
            folder.mkdir()
            export_package(base, folder)  # the workers import it, through PYTHONPATH
            env_base = {
                **env,
                "PYTHONPATH": os.pathsep.join([str(folder), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            }
            report["base_commit"] = base
            report["base"] = run_all(
                server,
                label="base",
                pkg=BASE_PACKAGE,
                env=env_base,
                workers=args.workers,
                repeats=args.repeats,
                quick=args.quick,
                log=log,
            )
    report.update(provenance(load_start, t0))  # commit, uncommitted files, machine, load, wall time
    write_json(args.out, report)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
