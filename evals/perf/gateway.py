"""Gateway overhead benchmark: ``remem serve`` (and, as a reference, LiteLLM's proxy) in front of a fake upstream.

Everything runs on loopback on this machine, each server in its own process:

* a fake OpenAI-compatible upstream (a bare ASGI app on uvicorn) answering at once, streamed or not;
* ``remem serve`` on a store of N memories (hash embedder) with its default trace, pointed at the fake;
* LiteLLM's proxy (no memory) pointed at the same fake, when a ``litellm`` executable is found
  (``--litellm PATH``; it is installed in its own virtualenv, not in the project's environment).

Measured, interleaved so machine load hits every system alike: the latency of sequential non-streaming calls
(gateway overhead = p50 through the gateway - p50 calling the fake directly), the time to the first content
chunk of streamed calls (added TTFT), the same overhead for a conversation's second user turn (its opening
turn sent first, unmeasured: the gateway then settles the first answer before recalling), then for each
proxy ``--seconds`` of load at ``--concurrency`` with requests/s, p50/p99 and errors, and ``/v1/verify`` of
the store afterwards. The load generator shares the two cores with the servers, so these are numbers of the
whole system on one machine, not of the gateway alone.

Usage::

    python -m evals.perf.gateway [--memories 10000] [--requests 300] [--concurrency 32] [--seconds 60]
                                 [--blas-threads 1] [--litellm /tmp/litellm-venv/bin/litellm]
                                 [--out results/perf/gateway.json]
    python -m evals.perf.gateway --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from evals.harness.jsonio import write_json
from evals.perf.measure import git_commit, git_dirty, latency_ms, loadavg, machine_facts
from evals.perf.middleware import ATTRS, ENTITIES, corpus
from evals.perf.rawhttp import RawConnection, RawHTTPError

REPLY = "It is in west-2 [M1]."
BENCH_KEY = "sk-bench-0123456789abcdef0123456789abcdef"  # both proxies authenticate every request
Target = tuple[str, dict[str, str]]  # base URL, headers
Timed = tuple[int, float, float | None]  # status, total s, first content chunk s (streams)
PIECES = ["It ", "is ", "in ", "west-2 ", "[M1]."]
MODEL = "fake"

# ------------------------------------------------------------------------------------ fake upstream
_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
).encode()


def _sse() -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(body)}\n\n"

    parts = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in PIECES]
    return ("".join(parts) + chunk({}, "stop") + "data: [DONE]\n\n").encode()


_STREAM = _sse()
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0}]}).encode()


async def fake_upstream(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
    """A bare ASGI OpenAI-compatible upstream: /v1/models and /v1/chat/completions (streamed or not)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"].endswith("/models"):
        payload, ctype = _MODELS, b"application/json"
    else:
        stream = b'"stream": true' in body or b'"stream":true' in body
        payload, ctype = (_STREAM, b"text/event-stream") if stream else (_COMPLETION, b"application/json")
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", ctype), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


# ---------------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def process(
    cmd: list[str], ready_url: str, *, env: dict[str, str] | None = None, timeout: float = 120
) -> Iterator[subprocess.Popen[bytes]]:
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    full_env = {k: v for k, v in (env or os.environ).items() if "proxy" not in k.lower()}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}: {log.read().decode()[-2000:]}")
            try:
                if httpx.get(ready_url, timeout=2, trust_env=False).status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} did not start in {timeout} s")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and every live descendant (uvicorn's workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        parent[int(d.name)] = int(fields[1])
        cpu[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, todo = {pid}, [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        todo += kids
    return sum(cpu.get(p, 0.0) for p in tree)


def cpu_split(pids: dict[str, int], run: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``run()``'s result and the CPU seconds each named process tree (and this load generator) spent on it."""
    before = {name: tree_cpu_s(pid) for name, pid in pids.items()}
    self0 = time.process_time()
    out = run()
    split = {name: round(tree_cpu_s(pid) - before[name], 2) for name, pid in pids.items()}
    split["load_generator"] = round(time.process_time() - self0, 2)
    return out, split


def litellm_version(exe: str) -> str | None:
    pip = Path(exe).with_name("pip")
    try:
        out = subprocess.run([str(pip), "show", "litellm"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in out.stdout.splitlines() if ln.startswith("Version:")), None)


# ------------------------------------------------------------------------------------- measurements
def _question(rng: random.Random, n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is the {rng.choice(ATTRS)} of {rng.choice(ENTITIES)}? (request {n})"}]


def _endpoint(base: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of a ``http://host:port/prefix`` base URL."""
    rest = base.removeprefix("http://")
    hostport, _, prefix = rest.partition("/")
    host, _, port = hostport.partition(":")
    return host, int(port or 80), "/" + prefix if prefix else ""


async def _call(conn: RawConnection, prefix: str, body: dict[str, Any], headers: dict[str, str]) -> Timed:
    """(status, total seconds, seconds to the first content chunk for a stream)."""
    data = json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **headers}
    t0 = time.perf_counter()
    if not body.get("stream"):
        r = await conn.request("POST", f"{prefix}/chat/completions", data, hdrs)
        return r.status, time.perf_counter() - t0, None
    first: float | None = None
    status, pieces = await conn.stream("POST", f"{prefix}/chat/completions", data, hdrs)
    buf = b""
    async for piece in pieces:
        if first is not None:
            continue
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if first is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices")
                if choices and choices[0].get("delta", {}).get("content"):
                    first = time.perf_counter() - t0
    return status, time.perf_counter() - t0, first


def _follow_up(rng: random.Random, opening: list[dict[str, str]]) -> list[dict[str, str]]:
    """The second user turn of the conversation ``opening`` began (after the fake's reply)."""
    question = f"And what is the {rng.choice(ATTRS)} of {rng.choice(ENTITIES)}, by the way?"
    return [*opening, {"role": "assistant", "content": REPLY}, {"role": "user", "content": question}]


async def sequential(
    targets: dict[str, Target], n: int, stream: bool, seed: int, *, follow_up: bool = False
) -> dict[str, Any]:
    """Sequential calls, interleaved over the targets; with ``follow_up`` each conversation's opening turn is sent
    first (not measured) and the measured call is its second user turn (the gateway settles the first answer)."""
    rng = random.Random(seed)
    totals: dict[str, list[float]] = {k: [] for k in targets}
    firsts: dict[str, list[float]] = {k: [] for k in targets}
    errors = dict.fromkeys(targets, 0)
    refused: dict[str, dict[str, int]] = {k: {} for k in targets}  # status -> count of the failed calls
    conns = {name: (RawConnection(*_endpoint(base)[:2]), _endpoint(base)[2]) for name, (base, _) in targets.items()}
    try:
        for i in range(n + 20):
            msgs = _question(rng, i)
            opening = msgs
            if follow_up:
                msgs = _follow_up(rng, opening)
            for name, (_, headers) in targets.items():
                conn, prefix = conns[name]
                if follow_up:
                    status, _, _ = await _call(conn, prefix, {"model": MODEL, "messages": opening}, headers)
                    if status != 200:
                        errors[name] += 1
                        refused[name][str(status)] = refused[name].get(str(status), 0) + 1
                        continue
                body = {"model": MODEL, "messages": msgs, "stream": stream}
                status, total, first = await _call(conn, prefix, body, headers)
                if i < 20:  # warm-up
                    continue
                if status != 200:
                    errors[name] += 1
                    refused[name][str(status)] = refused[name].get(str(status), 0) + 1
                    continue
                totals[name].append(total * 1e9)
                if first is not None:
                    firsts[name].append(first * 1e9)
    finally:
        for conn, _ in conns.values():
            await conn.close()
    out: dict[str, Any] = {}
    for name in targets:
        out[name] = {"total": latency_ms(totals[name]), "errors": errors[name], "error_statuses": refused[name]}
        if stream:
            out[name]["first_token"] = latency_ms(firsts[name])
    return out


async def closed_loop(
    base: str, headers: dict[str, str], concurrency: int, rng: random.Random, more: Callable[[], bool]
) -> tuple[list[float], dict[str, int], float]:
    """``concurrency`` clients, each on its own keep-alive connection, sending chat requests back to back while
    ``more()`` says so; (latencies in ns of the 200s, count per status or error kind, wall seconds)."""
    host, port, prefix = _endpoint(base)
    lat: list[float] = []
    statuses: dict[str, int] = {}
    counter = [0]

    async def worker() -> None:
        conn = RawConnection(host, port)
        try:
            while more():
                counter[0] += 1
                body = {"model": MODEL, "messages": _question(rng, counter[0])}
                try:
                    status, total, _ = await _call(conn, prefix, body, headers)
                except (RawHTTPError, OSError) as exc:
                    statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
                    await conn.close()
                    continue
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status == 200:
                    lat.append(total * 1e9)
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, statuses, time.perf_counter() - t0


async def load(target: Target, concurrency: int, seconds: float, seed: int) -> dict[str, Any]:
    """``concurrency`` clients, each on its own keep-alive connection, sending back to back for ``seconds``."""
    base, headers = target
    deadline = time.perf_counter() + seconds
    lat, statuses, wall = await closed_loop(
        base, headers, concurrency, random.Random(seed), lambda: time.perf_counter() < deadline
    )
    ok = statuses.get("200", 0)
    return {
        "concurrency": concurrency,
        "seconds": round(wall, 2),
        "requests": sum(statuses.values()),
        "ok": ok,
        "errors": sum(statuses.values()) - ok,
        "statuses": statuses,
        "requests_per_s": round(ok / wall, 2),
        "latency": latency_ms(lat),
    }


def run_load(target: Target, concurrency: int, seconds: float, seed: int) -> dict[str, Any]:
    return asyncio.run(load(target, concurrency, seconds, seed))


def diff(a: dict[str, Any], b: dict[str, Any], key: str) -> float:
    return round(float(a[key]["p50_ms"]) - float(b[key]["p50_ms"]), 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memories", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--litellm", default=shutil.which("litellm") or "/tmp/litellm-venv/bin/litellm")
    ap.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of the gateway process (default 1: requests run in parallel, not one matvec; on a "
        "loaded box two-thread BLAS waits for descheduled threads); 0 leaves the library default",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="after the single-process runs, restart the gateway with this many workers (remem serve --workers) "
        "and measure its overhead and load again; 1 skips that phase",
    )
    ap.add_argument("--out", default="results/perf/gateway.json")
    ap.add_argument("--quick", action="store_true", help="1k memories, 40 requests, 5 s of load (CI smoke)")
    ap.add_argument("--fake-upstream-port", type=int, help=argparse.SUPPRESS)  # internal: run the fake upstream
    args = ap.parse_args(argv)
    if args.fake_upstream_port:
        import uvicorn

        uvicorn.run(
            fake_upstream, host="127.0.0.1", port=args.fake_upstream_port, log_level="warning", access_log=False
        )
        return 0
    if args.quick:
        args.memories, args.requests, args.seconds = 1000, 40, 5.0
    t_start = time.perf_counter()
    from remem_agent import ReMem

    with tempfile.TemporaryDirectory(prefix="perf-gw-") as tmp, ExitStack() as stack:
        store = Path(tmp) / "store"
        mem = ReMem(store, embedder="hash")  # named: every figure says its embedder
        facts = corpus(args.memories, random.Random(args.seed))
        for start in range(0, len(facts), 2000):
            mem.add_many(facts[start : start + 2000])
        mem.close()
        py = sys.executable
        up_port, gw_port, ll_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        up_proc = stack.enter_context(
            process([py, "-m", "evals.perf.gateway", "--fake-upstream-port", str(up_port)], f"{upstream}/models")
        )
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps({BENCH_KEY: ["*"]}))
        gw_cmd = [py, "-m", "remem_agent.cli", "serve", "--store", str(store), "--upstream", upstream]
        gw_cmd += ["--models", MODEL, "--port", str(gw_port), "--api-keys", str(keys)]
        gw_cmd += ["--max-concurrency", "64", "--max-queue", "256"]
        blas = {v: str(args.blas_threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        gw_env = {**os.environ, **blas} if args.blas_threads > 0 else None
        gw_stack = stack.enter_context(ExitStack())  # closed before the --workers phase
        gw_proc = gw_stack.enter_context(process(gw_cmd, f"http://127.0.0.1:{gw_port}/healthz", env=gw_env))
        auth = {"authorization": f"Bearer {BENCH_KEY}"}
        gw = f"http://127.0.0.1:{gw_port}/v1"
        targets: dict[str, Target] = {"direct": (upstream, {}), "gateway": (gw, auth)}
        litellm: dict[str, Any] = {"available": False}
        exe = args.litellm
        if exe and Path(exe).is_file():
            cfg = Path(tmp) / "litellm.yaml"
            cfg.write_text(
                f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
                f"      api_base: {upstream}\n      api_key: sk-fake\nlitellm_settings:\n  telemetry: false\n"
            )
            env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
            env["LITELLM_MASTER_KEY"] = BENCH_KEY  # it refuses to start without one
            ll_cmd = [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(ll_port), "--num_workers", "1"]
            try:
                ready = f"http://127.0.0.1:{ll_port}/health/liveliness"
                ll_proc = stack.enter_context(process(ll_cmd, ready, env=env, timeout=240))
                targets["litellm"] = (f"http://127.0.0.1:{ll_port}/v1", auth)
                litellm = {"available": True, "version": litellm_version(exe), "executable": exe}
            except RuntimeError as exc:
                litellm = {"available": False, "reason": str(exc)[-800:]}
        else:
            litellm["reason"] = f"no litellm executable at {exe!r} (pip install 'litellm[proxy]' in its own venv)"
        load_before = loadavg()
        plain = asyncio.run(sequential(targets, args.requests, False, args.seed))
        streamed = asyncio.run(sequential(targets, args.requests, True, args.seed + 1))
        followed = asyncio.run(sequential(targets, args.requests, False, args.seed + 6, follow_up=True))
        procs = {"gateway": gw_proc.pid, "litellm": ll_proc.pid if "litellm" in targets else 0}
        loads: dict[str, Any] = {}
        for name, target in targets.items():
            if name == "direct":
                continue
            pids = {name: procs[name], "fake_upstream": up_proc.pid}
            result, split = cpu_split(pids, partial(run_load, target, args.concurrency, args.seconds, args.seed + 2))
            loads[name] = {**result, "cpu_s": split}
        verify = httpx.get(f"{gw}/verify", headers=auth, timeout=60, trust_env=False).json()
        stats = httpx.get(f"{gw}/stats", headers=auth, timeout=60, trust_env=False).json()
        gw_stack.close()  # the single-process gateway stops; the same store is served by N workers next
        workers: dict[str, Any] | None = None
        if args.workers > 1:
            wk_port = free_port()
            wk_cmd = [*gw_cmd[: gw_cmd.index("--port") + 1], str(wk_port), *gw_cmd[gw_cmd.index("--port") + 2 :]]
            wk_cmd += ["--workers", str(args.workers)]
            with process(wk_cmd, f"http://127.0.0.1:{wk_port}/healthz", env=gw_env) as wk_proc:
                wk = f"http://127.0.0.1:{wk_port}/v1"
                wk_targets: dict[str, Target] = {"direct": (upstream, {}), "gateway": (wk, auth)}
                wk_plain = asyncio.run(sequential(wk_targets, args.requests, False, args.seed + 3))
                wk_streamed = asyncio.run(sequential(wk_targets, args.requests, True, args.seed + 4))
                pids = {"gateway": wk_proc.pid, "fake_upstream": up_proc.pid}
                wk_load, split = cpu_split(
                    pids, partial(run_load, (wk, auth), args.concurrency, args.seconds, args.seed + 5)
                )
                wk_verify = httpx.get(f"{wk}/verify", headers=auth, timeout=60, trust_env=False).json()
            workers = {
                "workers": args.workers,
                "overhead_p50_ms": diff(wk_plain["gateway"], wk_plain["direct"], "total"),
                "added_ttft_p50_ms": diff(wk_streamed["gateway"], wk_streamed["direct"], "first_token"),
                "sequential_non_streaming": wk_plain,
                "sequential_streaming": wk_streamed,
                "load": {**wk_load, "cpu_s": split},
                "verify": wk_verify,
            }
    summary: dict[str, Any] = {
        "gateway_overhead_p50_ms": diff(plain["gateway"], plain["direct"], "total"),
        "gateway_added_ttft_p50_ms": diff(streamed["gateway"], streamed["direct"], "first_token"),
        "gateway_follow_up_overhead_p50_ms": diff(followed["gateway"], followed["direct"], "total"),
        "gateway_load": {k: loads["gateway"][k] for k in ("requests_per_s", "errors")}
        | {"p99_ms": loads["gateway"]["latency"].get("p99_ms")},
        "verify_ok": bool(verify.get("ok")),
    }
    if workers is not None:
        summary["workers"] = {
            "workers": workers["workers"],
            "overhead_p50_ms": workers["overhead_p50_ms"],
            "added_ttft_p50_ms": workers["added_ttft_p50_ms"],
            "requests_per_s": workers["load"]["requests_per_s"],
            "errors": workers["load"]["errors"],
            "p99_ms": workers["load"]["latency"].get("p99_ms"),
            "verify_ok": bool(workers["verify"].get("ok")),
        }
    if "litellm" in plain:
        summary["litellm_overhead_p50_ms"] = diff(plain["litellm"], plain["direct"], "total")
        summary["litellm_added_ttft_p50_ms"] = diff(streamed["litellm"], streamed["direct"], "first_token")
        summary["litellm_follow_up_overhead_p50_ms"] = diff(followed["litellm"], followed["direct"], "total")
        summary["litellm_load"] = {k: loads["litellm"][k] for k in ("requests_per_s", "errors")} | {
            "p99_ms": loads["litellm"]["latency"].get("p99_ms")
        }
    report = {
        "benchmark": "perf_gateway",
        "command": "python -m evals.perf.gateway" + (" --quick" if args.quick else ""),
        "params": {
            "memories": args.memories,
            "requests": args.requests,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "seed": args.seed,
            "embedder": "hash",
            "trace": "on (default)",
            "auth": "bearer key on both proxies",
            "gateway_blas_threads": args.blas_threads or "library default",
            "workers_phase": args.workers,
            "load_generator": "raw asyncio HTTP/1.1 keep-alive client, one connection per concurrent client",
            "cores": "not pinned: the load generator, the fake upstream and the proxy share both cores; "
            "load.*.cpu_s says how much CPU each used during the load phase",
        },
        "summary": summary,
        "sequential_non_streaming": plain,
        "sequential_streaming": streamed,
        "sequential_follow_up": followed,
        "load": loads,
        "verify": verify,
        "workers_phase": workers,
        "store_stats_after": {k: stats.get(k) for k in ("memories", "searches", "feedbacks")},
        "litellm": litellm,
        "machine": machine_facts(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "wall_time_s": round(time.perf_counter() - t_start, 2),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, report, indent=2, sort_keys=True)
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")
    return 0 if summary["verify_ok"] and (workers is None or summary["workers"]["verify_ok"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
