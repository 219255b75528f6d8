"""What the real embedders cost on this machine, idle and shared, and how often the query cache hits.

Two measurements (a benchmark, not a test):

* **threads under load**: for each engine (``onnx``: :class:`~remem_agent.embedders.onnx.OnnxEmbedder`;
  ``st``: the torch ``SentenceTransformerEmbedder``) and thread count (1, 2), in its own process: the
  latency of one query embedding (``--queries`` queries per block, batch size 1) and batched throughput
  (``--batch-texts`` texts), each also as the process's CPU time, in ``--blocks`` alternating blocks on the
  machine as it is ("idle") and with one competing CPU-bound process that this script starts and stops
  ("loaded": one of the two cores busy); ``tokens`` records the queries' and texts' token counts, since an
  embedding's cost grows with them;
* **query-cache hit rate** of the benchmark harness: the synthetic protocol (``evals.harness.runner.run``,
  system ``C``, every core family, ``--seeds`` seeds) with the query cache on, counting its hits and misses
  over every store the runs open (read-only use of the harness: its ``temp_store`` is wrapped).

Usage::

    python -m evals.perf.embedders [--out results/perf/embedders.json]
    python -m evals.perf.embedders --queries 5 --batch-texts 16 --blocks 2 --seeds 1 --out /tmp/emb.json  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from evals.perf.measure import REPO_ROOT, git_commit, git_dirty, latency_ms, loadavg, machine_facts

ENGINES = ("onnx", "st")
_SPIN = "while True:\n    pass\n"


def _texts(n: int, seed: int) -> list[str]:
    from evals.perf.core import make_world

    return [it.text for it in make_world(n, 1, seed=seed).items]


def _worker(engine: str, threads: int, queries: list[str], texts: list[str], blocks: int) -> list[dict[str, Any]]:
    """Idle and loaded alternate in ``blocks`` blocks inside one process (one model load), so a slow drift
    of the machine's own load falls on both conditions alike."""
    from remem_agent.embedders.onnx import OnnxEmbedder
    from remem_agent.embedders.sentence_transformers import SentenceTransformerEmbedder

    emb: Any = OnnxEmbedder(threads=threads) if engine == "onnx" else SentenceTransformerEmbedder(threads=threads)
    emb.embed(queries[:5])
    samples: dict[str, list[int]] = {"idle": [], "loaded": []}
    rates: dict[str, list[float]] = {"idle": [], "loaded": []}
    # CPU time of this process (every thread of the engine's pool), which a busy machine inflates less than wall time.
    cpu_query: dict[str, list[float]] = {"idle": [], "loaded": []}
    cpu_text: dict[str, list[float]] = {"idle": [], "loaded": []}
    for block in range(blocks):
        condition = ("idle", "loaded")[block % 2]
        with competing_process() if condition == "loaded" else contextlib.nullcontext(0):
            c0 = time.process_time()
            for q in queries:
                t_ns = time.perf_counter_ns()
                emb.embed([q])
                samples[condition].append(time.perf_counter_ns() - t_ns)
            cpu_query[condition].append((time.process_time() - c0) / max(len(queries), 1))
            t0, c0 = time.perf_counter(), time.process_time()
            emb.embed(texts)
            rates[condition].append(len(texts) / (time.perf_counter() - t0))
            cpu_text[condition].append((time.process_time() - c0) / max(len(texts), 1))
    return [
        {
            "condition": c,
            "embedder": emb.name,
            "query": latency_ms(samples[c]),
            "query_cpu_ms": [round(1e3 * x, 3) for x in cpu_query[c]],
            "batched_per_s": [round(r, 1) for r in rates[c]],
            "batched_cpu_ms_per_text": [round(1e3 * x, 3) for x in cpu_text[c]],
        }
        for c in ("idle", "loaded")
    ]


def token_stats(queries: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
    """Mean and max tokens of the queries and texts (all-MiniLM-L6-v2's tokenizer, [CLS] and [SEP] included):
    an embedder's cost grows with tokens, so a rate means little without them. Empty without ``tokenizers``."""
    from importlib.util import find_spec

    if find_spec("tokenizers") is None:
        return {}
    from remem_agent.embedders.onnx import OnnxEmbedder

    emb = OnnxEmbedder()
    out: dict[str, Any] = {}
    for key, items in (("queries", queries), ("texts", texts)):
        counts = emb.token_counts(items)
        if counts:
            out[key] = {"n": len(counts), "mean": round(sum(counts) / len(counts), 1), "max": max(counts)}
    return out


@contextlib.contextmanager
def competing_process() -> Iterator[int]:
    """One CPU-bound process (a Python busy loop) for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", _SPIN])
    try:
        time.sleep(0.5)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def bench_data(n_queries: int, n_texts: int) -> dict[str, list[str]]:
    texts = _texts(max(n_texts, n_queries), seed=11)
    return {"queries": [" ".join(t.split()[:8]) + "?" for t in texts[:n_queries]], "texts": texts[:n_texts]}


def threads_under_load(n_queries: int, n_texts: int, blocks: int, timeout: float) -> list[dict[str, Any]]:
    data = bench_data(n_queries, n_texts)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    rows: list[dict[str, Any]] = []
    for engine in ENGINES:
        for threads in (1, 2):
            cmd = [sys.executable, "-m", "evals.perf.embedders", "--worker", engine, "--threads", str(threads)]
            cmd += ["--blocks", str(blocks)]
            proc = subprocess.run(
                cmd, input=json.dumps(data), env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
            )
            if proc.returncode != 0:
                rows.append({"engine": engine, "threads": threads, "error": proc.stderr.strip().splitlines()[-3:]})
                continue
            for row in json.loads(proc.stdout.strip().splitlines()[-1]):
                rows.append({"engine": engine, "threads": threads, **row})
                print(f"[embedders] {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def cache_hit_rate(seeds: int) -> dict[str, Any]:
    """Hits of ReMem's query cache over the synthetic protocol (system C, core families, seeds 0..seeds-1)."""
    from evals.harness import runner
    from evals.harness.families import CORE_FAMILIES, make_world
    from evals.harness.reader import ReaderParams
    from evals.harness.systems import load_systems

    counts = {"hits": 0, "misses": 0, "stores": 0}
    # runner.run opens its stores through the module-level temp_store: wrap it for the duration, restore it after.
    inner = vars(runner)["temp_store"]

    @contextlib.contextmanager
    def counting(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with inner(*args, **kwargs) as mem:
            yield mem
            st = mem.query_cache.stats()
            counts["hits"] += st.hits
            counts["misses"] += st.misses
            counts["stores"] += 1

    system = load_systems()["C"]
    per_family: dict[str, float] = {}
    vars(runner)["temp_store"] = counting
    try:
        for family in CORE_FAMILIES:
            before = dict(counts)
            for seed in range(seeds):
                runner.run(make_world(family, seed), system, ReaderParams())
            h, m = counts["hits"] - before["hits"], counts["misses"] - before["misses"]
            per_family[family] = round(h / (h + m), 4) if h + m else 0.0
    finally:
        vars(runner)["temp_store"] = inner
    total = counts["hits"] + counts["misses"]
    return {
        "system": "C",
        "families": list(CORE_FAMILIES),
        "seeds": seeds,
        **counts,
        "hit_rate": round(counts["hits"] / total, 4) if total else 0.0,
        "hit_rate_by_family": per_family,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=25, help="queries per block")
    ap.add_argument("--batch-texts", type=int, default=128, help="texts embedded in one call per block")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=4, help="alternating idle/loaded blocks per engine and threads")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default="results/perf/embedders.json")
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        data = json.loads(sys.stdin.read())
        print(json.dumps(_worker(args.worker, args.threads, data["queries"], data["texts"], args.blocks)))
        return 0

    from evals.harness.jsonio import write_json

    load = {"start": loadavg()}
    rows = threads_under_load(args.queries, args.batch_texts, args.blocks, args.timeout)
    load["after_threads"] = loadavg()
    cache = cache_hit_rate(args.seeds)
    load["end"] = loadavg()
    doc = {
        "benchmark": "evals.perf.embedders",
        "command": "python -m evals.perf.embedders " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "machine": machine_facts(),
        "loadavg": load,
        "tokens": token_stats(**bench_data(args.queries, args.batch_texts)),
        "threads_under_load": rows,
        "query_cache": cache,
    }
    write_json(args.out, doc, indent=2)
    for r in rows:
        q = r.get("query", {})
        print(
            f"{r['engine']:>4} threads={r['threads']} {r.get('condition', 'error'):>6}: query p50 {q.get('p50_ms')} ms "
            f"p99 {q.get('p99_ms')} ms (CPU {r.get('query_cpu_ms')}), batched {r.get('batched_per_s')}/s "
            f"(CPU per text {r.get('batched_cpu_ms_per_text')} ms)"
        )
    print(f"tokens: {doc['tokens']}")
    print(f"query cache: {cache['hits']} hits / {cache['hits'] + cache['misses']} = {cache['hit_rate']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
