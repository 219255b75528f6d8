"""Stateless replicas: two ``remem serve`` processes on one PostgreSQL store, under load, no sticky sessions.

One store (hash embedder, ``--memories`` facts) on a private PostgreSQL (pgserver), one fake upstream
(:mod:`evals.perf.gateway`), two gateways. ``--conversations`` conversations of ``--turns`` user turns each run
``--concurrency`` at a time; every turn goes to a gateway chosen at random (no stickiness), and carries the
conversation's history and its ``x-remem-conversation``. Each next turn settles the answer before it ("moved
on", inferred by whichever process receives the turn); the last answer of each conversation gets an explicit
verdict sent to BOTH gateways at once.

Checked from the ledger afterwards (``outcomes``): every answer that served memories has exactly one verdict on
its search, claimed once (its waiting row claimed by one process); of each pair of duplicate verdicts, one was
recorded and the other answered as a repeat; ``verify()`` passes (it checks one credit row per served memory
per judged search, so a double count shows). ``ok`` is all of that with every request answered 200.

Usage::

    python -m evals.perf.replicas [--conversations 400] [--turns 3] [--concurrency 16] [--memories 1000]
                                  [--out results/perf/replicas.json]

``run`` is what the CI test calls with a small load on the test suite's PostgreSQL.
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

import httpx

from evals.harness.jsonio import write_json
from evals.perf.gateway import BENCH_KEY, MODEL, free_port, process
from evals.perf.measure import git_commit, git_dirty, latency_ms, loadavg, machine_facts
from evals.perf.middleware import ATTRS, ENTITIES, corpus


def _question(rng: random.Random, c: int, t: int) -> str:
    return f"What is the {rng.choice(ATTRS)} of {rng.choice(ENTITIES)}? (conversation {c}, turn {t})"


async def _load(bases: list[str], *, conversations: int, turns: int, concurrency: int, seed: int) -> dict[str, Any]:
    """Run the conversations; returns what each answer was and how the duplicate verdicts were answered."""
    rng = random.Random(seed)
    plans = [[(rng.randrange(2), _question(rng, c, t)) for t in range(turns)] for c in range(conversations)]
    verdicts = [rng.random() < 0.7 for _ in range(conversations)]
    auth = {"authorization": f"Bearer {BENCH_KEY}"}
    answers: list[dict[str, Any]] = []
    duplicates: list[tuple[int, int]] = []
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    def count(status: int) -> None:
        statuses[str(status)] = statuses.get(str(status), 0) + 1

    async def conversation(client: httpx.AsyncClient, c: int) -> None:
        history: list[dict[str, str]] = []
        async with gate:
            last = None
            for t, (which, question) in enumerate(plans[c]):
                history.append({"role": "user", "content": question})
                t0 = time.perf_counter()
                r = await client.post(
                    f"{bases[which]}/v1/chat/completions",
                    json={"model": MODEL, "messages": history},
                    headers={**auth, "x-remem-conversation": f"conv-{seed}-{c}"},
                )
                latencies.append((time.perf_counter() - t0) * 1e9)
                count(r.status_code)
                if r.status_code != 200:
                    return
                history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                last = r.headers["x-remem-answer-id"]
                answers.append({"answer_id": last, "conversation": c, "turn": t, "gateway": which})
            body = {"answer_id": last, "success": verdicts[c]}
            both = await asyncio.gather(*(client.post(f"{b}/v1/feedback", json=body, headers=auth) for b in bases))
            for r in both:
                count(r.status_code)
            repeated = [bool(r.json().get("repeated")) for r in both if r.status_code == 200]
            duplicates.append((len(repeated), sum(repeated)))

    limits = httpx.Limits(max_connections=2 * concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=120, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(client, c) for c in range(conversations)))
        wall = time.perf_counter() - t0
    return {
        "answers": answers,
        "duplicates": duplicates,
        "statuses": statuses,
        "seconds": round(wall, 2),
        "latency": latency_ms(latencies),
    }


def outcomes(url: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """What the ledger says of each answer: its waiting row, its search's verdict, and ``verify()``."""
    from remem_agent import ReMem

    with ReMem(url, embedder="hash") as mem:
        ids = [a["answer_id"] for a in answers]
        with mem.store.read() as tx:
            rows = {
                str(r[0]): (str(r[1]), r[2], r[3])
                for r in tx.run("SELECT answer_id, search_id, claimed_at, claimed_by FROM pending_outcomes")
            }
            judged = {str(r[0]) for r in tx.run("SELECT search_id FROM searches WHERE feedback IS NOT NULL").fetchall()}
        report = mem.verify()
    waiting = [i for i in ids if i in rows]
    return {
        "answers": len(ids),
        "served_memories": len(waiting),  # an answer that served nothing waits for nothing
        "claimed": sum(rows[i][1] is not None for i in waiting),
        "judged": sum(rows[i][0] in judged for i in waiting),
        "claimants": sorted({str(rows[i][2]) for i in waiting if rows[i][2] is not None}),
        "verify_ok": report.ok,
        "problems": list(report.problems[:5]),
    }


def run(url: str, *, conversations: int, turns: int, concurrency: int, memories: int, seed: int = 7) -> dict[str, Any]:
    """Two gateways on the store at ``url`` (filled with ``memories`` facts), the load, the ledger's account."""
    from remem_agent import ReMem

    with ReMem(url, embedder="hash") as mem:
        mem.add_many(corpus(memories, random.Random(seed)))
    py = sys.executable
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="remem-replicas-") as tmp:
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        stack.enter_context(
            process([py, "-m", "evals.perf.gateway", "--fake-upstream-port", str(up_port)], f"{upstream}/models")
        )
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps({BENCH_KEY: ["*"]}))
        bases = []
        for _ in range(2):
            port = free_port()
            cmd = [py, "-m", "remem_agent.cli", "serve", "--store", url, "--upstream", upstream, "--models", MODEL]
            cmd += ["--port", str(port), "--api-keys", str(keys), "--trace", "off"]
            stack.enter_context(process(cmd, f"http://127.0.0.1:{port}/healthz"))
            bases.append(f"http://127.0.0.1:{port}")
        load = asyncio.run(_load(bases, conversations=conversations, turns=turns, concurrency=concurrency, seed=seed))
    ledger = outcomes(url, load["answers"])
    dup = load["duplicates"]
    checks = {
        "all_200": set(load["statuses"]) == {"200"},
        "every_answer_judged_once": ledger["claimed"] == ledger["judged"] == ledger["served_memories"] > 0,
        "both_processes_settled": len(ledger["claimants"]) == 2,
        "duplicates_recorded_once": all(n == 2 and rep == 1 for n, rep in dup) and len(dup) == conversations,
        "verify_ok": ledger["verify_ok"],
    }
    return {
        "settings": {
            "conversations": conversations,
            "turns": turns,
            "concurrency": concurrency,
            "memories": memories,
            "seed": seed,
        },
        "statuses": load["statuses"],
        "requests": sum(load["statuses"].values()),
        "seconds": load["seconds"],
        "latency": load["latency"],
        "ledger": ledger,
        "per_gateway_answers": [sum(a["gateway"] == g for a in load["answers"]) for g in (0, 1)],
        "checks": checks,
        "ok": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--memories", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="results/perf/replicas.json")
    args = ap.parse_args(argv)
    from evals.perf.postgres import create_database, private_server

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="remem-replicas-pg-") as folder, private_server(Path(folder)) as server:
        url = create_database(server, "replicas")
        result = run(
            url,
            conversations=args.conversations,
            turns=args.turns,
            concurrency=args.concurrency,
            memories=args.memories,
            seed=args.seed,
        )
    out = {
        "benchmark": "two remem serve processes on one PostgreSQL store, no sticky sessions",
        "command": "python -m evals.perf.replicas "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        **result,
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": machine_facts(),
        "loadavg_end": loadavg(),
        "commit": git_commit(),
        "dirty": git_dirty(),
    }
    write_json(args.out, out)
    print(json.dumps({k: out[k] for k in ("checks", "ok", "requests", "seconds", "latency")}, indent=2))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
