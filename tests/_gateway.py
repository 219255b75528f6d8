"""For the gateway tests: a real uvicorn server in a thread on 127.0.0.1 (random port), an HTTP client on it,
the one-memory store the fault tests serve from, and the upstream faults every upstream kind must map."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from _llama_server import free_port
from _ollama_server import Reply, error

from remem_agent import ReMem


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields ``http://127.0.0.1:<port>``."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="gateway-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextmanager
def client_of(app: Any) -> Iterator[httpx.Client]:
    """``app`` served by :func:`running`, and an HTTP client on it (no proxies from the environment)."""
    with running(app) as base, httpx.Client(base_url=base, trust_env=False, timeout=30) as client:
        yield client


@pytest.fixture()
def one_memory(tmp_path: Path) -> Iterator[ReMem]:
    """A store holding one memory, the server's region (west-2), closed after the test. A test module takes it
    as its ``mem`` fixture with ``mem = one_memory`` (pytest names a fixture by the module attribute)."""
    m = ReMem(tmp_path / "store")
    m.add("Our server moved to west-2.", entity="server", attribute="region")
    yield m
    m.close()


def nothing_credited(mem: ReMem) -> None:
    """The store's one memory has no credit rows (a failed turn taught nothing) and the ledger verifies."""
    (m,) = mem.list()
    assert mem.inspect(m.id).credits == () and mem.verify().ok


UPSTREAM_FAULTS = [  # (replies, status, code): the scripted upstream's misbehaviour, the gateway's answer
    pytest.param([error(429, "slow down"), error(429, "slow down")], 429, "upstream_rate_limited", id="429"),
    pytest.param([error(500, "boom"), error(503, "down")], 502, "upstream_error", id="5xx"),
    pytest.param([Reply(200, "<html>not an API</html>")], 502, "upstream_error", id="garbage"),
    pytest.param([Reply(delay=2.5), Reply(delay=2.5)], 504, "upstream_timeout", id="hang"),
    pytest.param([error(400, "bad option")], 400, "upstream_rejected", id="4xx"),
]
"""For ``@pytest.mark.parametrize(("replies", "status", "code"), UPSTREAM_FAULTS)``; the hang outlasts the
``upstream_timeout_s`` of 1 s the fault tests configure, and the retries are used up by two replies."""


@pytest.fixture()
def two_scope_memory(tmp_path: Path) -> Iterator[ReMem]:
    """The server's region (west-2) in the default scope and again in ``user:alice``'s, closed after the test."""
    m = ReMem(tmp_path / "store")
    m.add("Our server moved to west-2.", entity="server", attribute="region")
    m.add("Our server moved to west-2.", entity="server", attribute="region", scope="user:alice")
    yield m
    m.close()


def in_process_app(mem: ReMem, tmp_path: Path, model: Any, models: tuple[str, ...], **over: Any) -> Any:
    """The gateway app on ``mem`` with a local ``model`` (or the upstream ``over`` names); ``keys=`` as for
    ``create_app``, every other keyword a ``GatewayConfig`` field. Trace in ``tmp_path``."""
    from remem_agent.gateway import GatewayConfig, create_app

    keys = over.pop("keys", None)
    config = GatewayConfig(models=models, trace=str(tmp_path / "trace.jsonl"), **over)
    return create_app(config, memory=mem, model=model, keys=keys)
