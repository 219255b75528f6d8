"""The examples/ scripts run as users would run them, against loopback servers (no network)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _examples import ROOT, run_example
from _ollama_server import FakeOllama, chat_ok, chat_stream

ANSWER = json.dumps({"answer": "west-2", "citations": []})


def test_wrap_ollama_example(tmp_path: Path) -> None:
    pytest.importorskip("ollama")
    with FakeOllama() as fake:
        fake.default = chat_ok(ANSWER)
        out = run_example("wrap_ollama.py", {"OLLAMA_HOST": fake.url}, tmp_path, "qwen2.5:3b")
        body = fake.requests[0].body
    assert "west-2" in out and "success=True" in out
    assert body["model"] == "qwen2.5:3b" and body["format"]["required"][-1] == "citations"
    assert "Our server moved to west-2." in body["messages"][1]["content"]


@contextmanager
def openai_server(reply: Callable[[dict[str, Any]], tuple[dict[str, Any], str]]) -> Iterator[tuple[str, list[Any]]]:
    """A loopback OpenAI-protocol server: ``reply(body)`` gives (message, finish_reason); requests are kept."""
    seen: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            message, finish = reply(body)
            data = json.dumps(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def fake_openai() -> Iterator[tuple[str, list[Any]]]:
    with openai_server(lambda body: ({"role": "assistant", "content": ANSWER}, "stop")) as served:
        yield served


def test_wrap_openai_example(tmp_path: Path, fake_openai: tuple[str, list[Any]]) -> None:
    pytest.importorskip("openai")
    url, seen = fake_openai
    out = run_example(
        "wrap_openai.py", {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-test-0123456789"}, tmp_path, "my-model"
    )
    assert "west-2" in out and "success=True" in out
    req = seen[0]
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "my-model"
    assert req["body"]["response_format"]["type"] == "json_schema"
    # the trace the example wrote never contains the key
    traces = list((tmp_path / ".remem" / "example" / "traces").glob("*.jsonl"))  # traces live in the store folder
    assert not (tmp_path / "traces").exists()  # never in the working directory
    assert traces and "sk-test-0123456789" not in traces[0].read_text()


def test_stream_ollama_example(tmp_path: Path) -> None:
    pytest.importorskip("ollama")
    with FakeOllama() as fake:
        fake.push(chat_stream(["Our server ", "is in west-2 ", "[M1]", "."]))
        out = run_example("stream_ollama.py", {"OLLAMA_HOST": fake.url}, tmp_path, "qwen2.5:3b")
        body = fake.requests[0].body
    assert body["stream"] is True and "Our server moved to west-2." in body["messages"][0]["content"]
    assert out.splitlines()[0] == "Our server is in west-2." and "cited: ['Our server moved to west-2.']" in out


def _call_ping_then_answer(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    if body["messages"][-1]["role"] == "tool":
        return {"role": "assistant", "content": "Yes, west-2 answers [M1]."}, "stop"
    call = {"id": "call_1", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"


@pytest.fixture()
def fake_openai_tools() -> Iterator[tuple[str, list[Any]]]:
    """An OpenAI-protocol server that calls the tool once, then answers citing M1."""
    with openai_server(_call_ping_then_answer) as served:
        yield served


def test_chat_with_tools_example(tmp_path: Path, fake_openai_tools: tuple[str, list[Any]]) -> None:
    pytest.importorskip("openai")
    url, seen = fake_openai_tools
    out = run_example("chat_with_tools.py", {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-x"}, tmp_path, "m")
    assert out.strip() == "Yes, west-2 answers. | cited: ['Our server moved to west-2.']"
    bodies = [r["body"] for r in seen]
    assert len(bodies) == 2 and bodies[0]["messages"][0] == {"role": "system", "content": "You are Ops Bot."}
    assert bodies[1]["messages"][-1] == {"role": "tool", "content": "pong", "tool_call_id": "call_1"}
    assert bodies[0]["messages"][1] == bodies[1]["messages"][1]  # the same memory block for the whole turn


def test_examples_are_short() -> None:
    for name in ("wrap_openai.py", "wrap_ollama.py", "chat_with_tools.py", "stream_ollama.py"):
        src = (ROOT / "examples" / name).read_text()
        body = src.split('"""', 2)[2]  # after the docstring
        code = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(code) <= 15, (name, len(code))
