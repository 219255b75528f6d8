"""A scripted fake Ollama server on 127.0.0.1: a real HTTP server speaking ``/api/chat`` (plain and NDJSON streams).

Each POST /api/chat is recorded (path, headers, parsed JSON body) and answered by the next scripted
:class:`Reply`; once the script is empty, by a default success. Used with the real ``ollama.AsyncClient``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer. ``body``: a dict is sent as JSON, a str as-is. ``delay``: seconds before answering."""

    status: int = 200
    body: dict[str, Any] | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    content_type: str | None = None  # default: JSON for a dict body, text/plain for a str
    ndjson: list[dict[str, Any]] | None = None  # a streamed reply: these lines, chunked, one per chunk
    cut_after: int | None = None  # with ndjson: drop the connection after this many lines
    sse: bool = False  # with ndjson: send the lines as server-sent events ("data: ...") ending in [DONE]


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


def chat_ok(
    content: str = '{"ok": true}',
    *,
    model: str = "fake-model",
    done_reason: str | None = "stop",
    prompt_eval_count: int = 11,
    eval_count: int = 5,
    tool_calls: list[dict[str, Any]] | None = None,
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "model": model,
        "created_at": "2025-01-01T00:00:00.000000Z",
        "message": message,
        "done": True,
        "total_duration": 1_000_000,
        "load_duration": 1_000,
        "prompt_eval_count": prompt_eval_count,
        "prompt_eval_duration": 1_000,
        "eval_count": eval_count,
        "eval_duration": 1_000,
    }
    if done_reason is not None:
        body["done_reason"] = done_reason
    return Reply(200, body)


def error(status: int, message: str) -> Reply:
    return Reply(status, {"error": message})


class FakeOllama:
    """Start with :meth:`start` (or as a context manager); ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, paths: tuple[str, ...] = ("/api/chat",)) -> None:
        self.paths = paths  # POST paths answered by the script; any other gets a 404
        self.requests: list[Recorded] = []
        self.script: deque[Reply] = deque()
        self.default: Reply = chat_ok()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeOllama:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    parsed: Any = json.loads(raw) if raw else None
                except ValueError:
                    parsed = raw.decode("utf-8", "replace")
                with fake._lock:
                    fake.requests.append(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, parsed))
                    reply = fake.script.popleft() if fake.script else fake.default
                if self.path not in fake.paths:
                    reply = error(404, f"404 page not found: {self.path}")
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.ndjson is not None:
                    self._stream(reply)
                    return
                payload = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                data = payload.encode()
                try:
                    self.send_response(reply.status)
                    ctype = reply.content_type or (
                        "application/json" if isinstance(reply.body, dict) else "text/plain; charset=utf-8"
                    )
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

            def _stream(self, reply: Reply) -> None:
                assert reply.ndjson is not None
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "text/event-stream" if reply.sse else "application/x-ndjson")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for n, line in enumerate(reply.ndjson):
                        if reply.cut_after is not None and n >= reply.cut_after:
                            self.close_connection = True
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        data = (f"data: {json.dumps(line)}\n\n" if reply.sse else json.dumps(line) + "\n").encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    if reply.sse:
                        self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-ollama", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeOllama:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port_url() -> str:
    """A loopback URL on which nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def chat_stream(
    pieces: list[str], *, tool_calls: list[dict[str, Any]] | None = None, model: str = "fake-model"
) -> Reply:
    """An NDJSON streamed reply: one line per text piece, then a done line (with tool calls, if any)."""
    lines: list[dict[str, Any]] = [
        {
            "model": model,
            "created_at": "2025-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": p},
            "done": False,
        }
        for p in pieces
    ]
    last: dict[str, Any] = {"role": "assistant", "content": ""}
    if tool_calls:
        last["tool_calls"] = tool_calls
    lines.append(
        {"model": model, "created_at": "2025-01-01T00:00:00Z", "message": last, "done": True, "done_reason": "stop",
         "prompt_eval_count": 11, "eval_count": len(pieces)}
    )  # fmt: skip
    return Reply(200, ndjson=lines)
