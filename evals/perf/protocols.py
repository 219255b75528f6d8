"""Gateway overhead per wire protocol: the same question through every chat route of ``remem serve``.

One ``remem serve`` (hash embedder, ``--memories`` memories, its default trace) in front of the fake
OpenAI-compatible upstream of :mod:`evals.perf.gateway`, each in its own process on loopback. Sequential,
non-streamed calls, interleaved round-robin over the routes so machine load hits each alike: chat completions
(the reference), Responses, Anthropic Messages, legacy completions, Ollama chat and Ollama generate, plus the
upstream called directly. Reported per route: p50/p99 latency, the gateway's overhead (p50 minus the direct
p50) and the route's difference from chat completions (target: within 1 ms).

    python -m evals.perf.protocols [--memories 1000] [--requests 300]   # -> results/perf/protocols.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.perf.gateway import BENCH_KEY, MODEL, free_port, process
from evals.perf.measure import git_commit, git_dirty, latency_ms, loadavg, machine_facts
from evals.perf.middleware import ATTRS, ENTITIES, corpus
from evals.perf.rawhttp import RawConnection

ROUTES = ("chat_completions", "responses", "messages", "completions", "ollama_chat", "ollama_generate")


def request(route: str, question: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of one non-streamed call of ``route`` asking ``question``."""
    user = [{"role": "user", "content": question}]
    if route == "chat_completions":
        return "/v1/chat/completions", {"model": MODEL, "messages": user}
    if route == "responses":
        return "/v1/responses", {"model": MODEL, "input": question, "store": True}
    if route == "messages":
        return "/v1/messages", {"model": MODEL, "max_tokens": 64, "messages": user}
    if route == "completions":
        return "/v1/completions", {"model": MODEL, "prompt": question}
    if route == "ollama_chat":
        return "/api/chat", {"model": MODEL, "messages": user, "stream": False}
    if route == "ollama_generate":
        return "/api/generate", {"model": MODEL, "prompt": question, "stream": False}
    raise ValueError(route)


async def run(gateway_port: int, upstream_port: int, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    auth = {"authorization": f"Bearer {BENCH_KEY}", "content-type": "application/json"}
    gw = RawConnection("127.0.0.1", gateway_port)
    direct = RawConnection("127.0.0.1", upstream_port)
    times: dict[str, list[float]] = {r: [] for r in (*ROUTES, "direct")}
    errors: dict[str, int] = dict.fromkeys(times, 0)
    try:
        for i in range(n + 20):
            question = f"What is the {rng.choice(ATTRS)} of {rng.choice(ENTITIES)}? (request {i})"
            calls = [(r, *request(r, question)) for r in ROUTES]
            calls.append(
                (
                    "direct",
                    "/v1/chat/completions",
                    {"model": MODEL, "messages": [{"role": "user", "content": question}]},
                )
            )
            rng.shuffle(calls)  # no route always runs first (or last) in a round
            for name, path, body in calls:
                conn = direct if name == "direct" else gw
                data = json.dumps(body).encode()
                t0 = time.perf_counter()
                r = await conn.request(
                    "POST", path, data, auth if name != "direct" else {"content-type": "application/json"}
                )
                took = time.perf_counter() - t0
                if i < 20:  # warm-up
                    continue
                if r.status != 200:
                    errors[name] += 1
                    continue
                times[name].append(took * 1e9)
    finally:
        await gw.close()
        await direct.close()
    out: dict[str, Any] = {}
    base = latency_ms(times["direct"])["p50_ms"]
    ref = latency_ms(times["chat_completions"])["p50_ms"]
    for name, samples in times.items():
        lat = latency_ms(samples)
        out[name] = {"latency": lat, "errors": errors[name]}
        if name != "direct":
            out[name]["overhead_p50_ms"] = round(lat["p50_ms"] - base, 3)
            out[name]["vs_chat_completions_p50_ms"] = round(lat["p50_ms"] - ref, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memories", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--out", default="results/perf/protocols.json")
    args = ap.parse_args(argv)
    from remem_agent import ReMem

    t_start, load_start = time.perf_counter(), loadavg()
    with tempfile.TemporaryDirectory(prefix="perf-proto-") as tmp, ExitStack() as stack:
        store = Path(tmp) / "store"
        mem = ReMem(store, embedder="hash")  # named: every figure says its embedder
        mem.add_many(corpus(args.memories, random.Random(args.seed)))
        mem.close()
        up_port, gw_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        py = sys.executable
        stack.enter_context(
            process([py, "-m", "evals.perf.gateway", "--fake-upstream-port", str(up_port)], f"{upstream}/models")
        )
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps({BENCH_KEY: ["*"]}))
        cmd = [py, "-m", "remem_agent.cli", "serve", "--store", str(store), "--upstream", upstream, "--models", MODEL]
        cmd += ["--port", str(gw_port), "--api-keys", str(keys)]
        stack.enter_context(process(cmd, f"http://127.0.0.1:{gw_port}/healthz"))
        routes = asyncio.run(run(gw_port, up_port, args.requests, args.seed))
    worst = max(abs(v["vs_chat_completions_p50_ms"]) for k, v in routes.items() if k != "direct")
    report = {
        "benchmark": "gateway overhead per wire protocol",
        "command": " ".join(["python -m evals.perf.protocols", *(argv if argv is not None else sys.argv[1:])]),
        "embedder": "hash",
        "memories": args.memories,
        "requests_per_route": args.requests,
        "summary": {
            "overhead_p50_ms": {k: v["overhead_p50_ms"] for k, v in routes.items() if k != "direct"},
            "largest_difference_from_chat_completions_p50_ms": worst,
            "within_1_ms": worst <= 1.0,
        },
        "routes": routes,
        "provenance": {
            "git_commit": git_commit(),
            "git_dirty": git_dirty(),
            "machine": machine_facts(),
            "loadavg_start": load_start,
            "loadavg_end": loadavg(),
            "wall_time_s": round(time.perf_counter() - t_start, 1),
        },
    }
    write_json(Path(args.out), report)
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
