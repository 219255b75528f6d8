"""Two ``remem serve`` processes on one PostgreSQL store (private pgserver): one memory, exact learning.

A memory added through one gateway is served by the other at once (pgvector index in the database);
feedback sent to both, concurrently, is counted exactly once each in the ledger; ``/v1/verify`` is ok.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
from _llama_server import free_port, serve_process
from _ollama_server import FakeOllama, chat_ok

pytest.importorskip("psycopg")

MODEL = "qwen2.5:0.5b"


@contextmanager
def gateway_process(store: str, upstream: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "remem_agent.cli", "serve", "--store", store, "--upstream", upstream]
    cmd += ["--upstream-kind", "ollama", "--models", MODEL, "--port", str(port), "--trace", "off"]
    base = f"http://127.0.0.1:{port}"
    with serve_process(cmd, f"{base}/healthz", "remem serve", timeout_s=60):
        yield base


def test_two_gateway_processes_share_one_postgresql_store(pg_url: str) -> None:
    with FakeOllama() as fake, ExitStack() as stack:
        fake.default = chat_ok("It is in west-2 [M1].", model=MODEL)
        a, b = (stack.enter_context(gateway_process(pg_url, fake.url)) for _ in range(2))
        http = stack.enter_context(httpx.Client(trust_env=False, timeout=60))
        added = http.post(f"{a}/v1/memories", json={"text": "Our server moved to west-2.", "entity": "server",
                                                    "attribute": "region"})  # fmt: skip
        assert added.status_code == 201
        mid = added.json()["id"]

        def turn(job: tuple[str, int]) -> tuple[str, bool, list[str]]:
            base, n = job
            r = http.post(
                f"{base}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": f"Where is our server? (#{n})"}]},
                headers={"x-remem-conversation": f"conv-{n}"},
            )
            assert r.status_code == 200, r.text
            success = n % 3 != 0
            fb = http.post(
                f"{base}/v1/feedback", json={"answer_id": r.headers["x-remem-answer-id"], "success": success}
            )
            assert fb.status_code == 200, fb.text
            return base, success, r.headers["x-remem-served"].split(",")

        jobs = [(a if n % 2 else b, n) for n in range(12)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(turn, jobs))
        assert all(mid in served for _, _, served in results)  # B serves what A added, at once
        assert {base for base, _, _ in results} == {a, b}
        info: dict[str, Any] = http.get(f"{b}/v1/memories/{mid}").json()
        credits = info["credits"]
        assert len(credits) == 12 and sum(c["success"] for c in credits) == sum(s for _, s, _ in results) == 8
        for base in (a, b):
            assert http.get(f"{base}/v1/stats").json()["feedbacks"] == 12
            report = http.get(f"{base}/v1/verify").json()
            assert report["ok"] and report["problems"] == []
