"""Soak benchmark: a long run of gateway traffic without feedback, to show that growth is bounded.

``remem serve`` (hash embedder, a store of ``--memories`` facts) runs in front of the fake upstream of
:mod:`evals.perf.gateway` with its growth limits compressed in time, so that a run of minutes goes through
many answer TTLs, retention windows and trace rotations: answers expire after ``--ttl`` seconds, unjudged
searches are pruned after ``--retention`` seconds, each worker sweeps every ``--sweep`` seconds, and the trace
is archived at ``--trace-max-mb`` with archives trimmed to ``--trace-keep-mb``. A load generator sends
``--requests`` chat requests (no feedback, no conversation header: every request leaves a search row and a
waiting answer) in windows of ``--window`` requests at ``--concurrency``. After each window it records the
window's latency, the gateway's resident memory (with its anonymous and file-backed parts), the ledger's bytes
on disk (file and WAL), the trace folder's bytes, and the searches and answers the store holds.

The verdicts written to the JSON:

* ``rows_bounded``: the searches the store holds never exceed what the traffic of one retention window plus
  one sweep interval (and the TTL for answers) can leave, at the highest request rate of any window, x1.25;
* ``ledger_flat``: the ledger's bytes in the last window are at most 1.1x their highest value in the first
  half of the run (freed pages are reused, so the file stops growing once pruning keeps pace);
* ``traces_capped``: the trace folder never exceeds the archive cap plus one live file (two rotations' slack);
* ``rss_flat``: resident memory in the last window within 10 % of the window after warm-up (the second);
* ``latency_flat``: p50 of the last window within 10 % of the first window's.

Usage::

    python -m evals.perf.soak [--requests 100000] [--window 10000] [--concurrency 16] [--memories 1000]
                              [--ttl 20] [--retention 40] [--sweep 10] [--out results/perf/soak.json]
    python -m evals.perf.soak --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.gateway import BENCH_KEY, MODEL, closed_loop, free_port, process
from evals.perf.measure import git_commit, git_dirty, latency_ms, loadavg, machine_facts
from evals.perf.middleware import corpus

MB = 1024 * 1024


async def send(base: str, headers: dict[str, str], n: int, concurrency: int, rng: random.Random) -> dict[str, Any]:
    """``n`` non-streamed chat requests from ``concurrency`` keep-alive clients; latency and statuses."""
    left = [n]

    def more() -> bool:
        left[0] -= 1
        return left[0] >= 0

    lat, statuses, wall = await closed_loop(base, headers, concurrency, rng, more)
    ok = statuses.get("200", 0)
    return {"seconds": round(wall, 2), "ok": ok, "statuses": statuses, "rate": round(ok / wall, 1), **latency_ms(lat)}


def rss_parts(pid: int) -> dict[str, float]:
    """Resident memory of ``pid`` in MiB: the whole (``VmRSS``) and two of its parts, anonymous (``RssAnon``: the
    heaps of Python, SQLite and the allocator) and file-backed (``RssFile``: mapped code and files), as
    ``/proc/PID/status`` gives them."""
    wanted = ("VmRSS", "RssAnon", "RssFile")
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def folder_bytes(folder: Path) -> int:
    total = 0
    for f in folder.glob("*"):
        try:
            total += f.stat().st_size
        except FileNotFoundError:  # rotated or trimmed while listed
            continue
    return total


def held(store: Path) -> dict[str, int]:
    """Searches and waiting answers in the ledger (a read-only connection: the gateway keeps writing)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{store / 'ledger.db'}?mode=ro", uri=True, timeout=30)
    try:
        searches = conn.execute("SELECT COUNT(*) FROM searches").fetchone()[0]
        answers = conn.execute("SELECT COUNT(*) FROM pending_outcomes").fetchone()[0]
        pruned = conn.execute("SELECT COALESCE(SUM(retrieved), 0) FROM retrieval_base WHERE task = '*'").fetchone()[0]
    finally:
        conn.close()
    return {"searches": int(searches), "answers": int(answers), "pruned_retrievals": int(pruned)}


def verdicts(windows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    peak_rate = max(w["rate"] for w in windows)
    row_bound = 1.25 * peak_rate * (args.retention + args.sweep)
    half = windows[: max(1, len(windows) // 2)]
    ledger_peak = max(w["ledger_bytes"] for w in half)
    trace_cap = (args.trace_keep_mb + 2 * args.trace_max_mb) * MB
    warm = windows[1] if len(windows) > 1 else windows[0]
    last, first = windows[-1], windows[0]
    return {
        "row_bound": round(row_bound),
        "rows_bounded": all(w["held"]["searches"] <= row_bound for w in windows),
        "ledger_flat": last["ledger_bytes"] <= 1.1 * ledger_peak,
        "trace_cap_bytes": trace_cap,
        "traces_capped": all(w["trace_bytes"] <= trace_cap for w in windows),
        "rss_flat": abs(last["rss_mb"] - warm["rss_mb"]) <= 0.1 * warm["rss_mb"],
        "rss_change": round(last["rss_mb"] / warm["rss_mb"] - 1, 4),
        "latency_flat": abs(last["p50_ms"] - first["p50_ms"]) <= 0.1 * first["p50_ms"],
        "p50_change": round(last["p50_ms"] / first["p50_ms"] - 1, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--memories", type=int, default=1000)
    ap.add_argument("--ttl", type=float, default=20.0, help="answer TTL, seconds")
    ap.add_argument("--retention", type=float, default=40.0, help="retention of unjudged traffic, seconds")
    ap.add_argument("--sweep", type=float, default=10.0, help="sweep interval, seconds")
    ap.add_argument("--trace-max-mb", type=float, default=4.0)
    ap.add_argument("--trace-keep-mb", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", default="results/perf/soak.json")
    ap.add_argument("--quick", action="store_true", help="4k requests in windows of 1k (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.window = 4000, 1000
    day = 86_400.0
    t_start = time.perf_counter()
    from remem_agent import ReMem

    with tempfile.TemporaryDirectory(prefix="perf-soak-") as tmp, ExitStack() as stack:
        store = Path(tmp) / "store"
        mem = ReMem(store, embedder="hash")
        mem.add_many(corpus(args.memories, random.Random(args.seed)))
        mem.close()
        py = sys.executable
        up_port, gw_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        stack.enter_context(
            process([py, "-m", "evals.perf.gateway", "--fake-upstream-port", str(up_port)], f"{upstream}/models")
        )
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps({BENCH_KEY: ["*"]}))
        cmd = [py, "-m", "remem_agent.cli", "serve", "--store", str(store), "--upstream", upstream]
        cmd += ["--models", MODEL, "--port", str(gw_port), "--api-keys", str(keys)]
        cmd += ["--max-concurrency", "64", "--max-queue", "256"]
        cmd += ["--answer-ttl-days", repr(args.ttl / day), "--retention-days", repr(args.retention / day)]
        cmd += ["--sweep-minutes", repr(args.sweep / 60.0)]
        cmd += ["--trace-max-mb", repr(args.trace_max_mb), "--trace-keep-mb", repr(args.trace_keep_mb)]
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        gw = stack.enter_context(process(cmd, f"http://127.0.0.1:{gw_port}/healthz", env=env))
        base, auth = f"http://127.0.0.1:{gw_port}/v1", {"authorization": f"Bearer {BENCH_KEY}"}
        rng = random.Random(args.seed)
        windows = []
        sent = 0
        while sent < args.requests:
            n = min(args.window, args.requests - sent)
            w = asyncio.run(send(base, auth, n, args.concurrency, rng))
            sent += n
            ledger = sum(f.stat().st_size for f in store.glob("ledger.db*"))
            parts = rss_parts(gw.pid)
            w.update(
                sent=sent,
                rss_mb=parts.get("VmRSS", float("nan")),
                rss_anon_mb=parts.get("RssAnon", float("nan")),
                rss_file_mb=parts.get("RssFile", float("nan")),
                ledger_bytes=ledger,
                trace_bytes=folder_bytes(store / "traces"),
                trace_files=len(list((store / "traces").glob("*"))),
                held=held(store),
            )
            windows.append(w)
            print(json.dumps(w), flush=True)
        stack.close()
        with ReMem(store, embedder="hash") as mem:
            ok = mem.verify().ok
            kept = mem.stats().kept
    out = {
        "benchmark": "gateway soak without feedback (growth limits compressed in time)",
        "command": " ".join(["python -m evals.perf.soak", *(sys.argv[1:] if argv is None else argv)]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "quick")},
        "embedder": "hash",
        "windows": windows,
        "verdicts": verdicts(windows, args),
        "verify_ok": ok,
        "kept_at_end": kept,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "machine": machine_facts(),
        "loadavg_end": loadavg(),
        "commit": git_commit(),
        "dirty": git_dirty(),
    }
    write_json(args.out, out)
    print(json.dumps(out["verdicts"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
