"""A minimal keep-alive HTTP/1.1 client on raw asyncio streams, for load generators that share the CPU.

The gateway benchmark runs the load generator, the fake upstream and the proxy under test on the same two
cores, so every CPU-millisecond the client spends per request is taken from the server being measured.
httpx costs about a millisecond of Python per request; this client writes one request buffer and parses
the status line, headers, ``content-length`` or chunked bodies itself: a fraction of that. It speaks only
what the benchmark needs (loopback, no TLS, no redirects, no proxies, no compression).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass


class RawHTTPError(Exception):
    """The server closed the connection or sent something this client does not parse."""


@dataclass(frozen=True, kw_only=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


class RawConnection:
    """One keep-alive connection to ``host:port``; requests on it run one after another."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):  # the peer already went away: closed either way
                await self._writer.wait_closed()
        self._reader = self._writer = None

    def _request(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def _head(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise RawHTTPError("connection closed before the response head") from exc
        status_line, *header_lines = raw[:-4].decode("latin-1").split("\r\n")
        try:
            status = int(status_line.split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise RawHTTPError(f"bad status line {status_line!r}") from exc
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _pieces(self, reader: asyncio.StreamReader, headers: Mapping[str, str]) -> AsyncIterator[bytes]:
        try:
            if headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        return
                    piece = await reader.readexactly(size + 2)
                    yield piece[:-2]
            elif "content-length" in headers:
                n = int(headers["content-length"])
                if n:
                    yield await reader.readexactly(n)
            else:
                yield await reader.read()
                await self.close()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            await self.close()
            raise RawHTTPError("connection closed in the middle of a body") from exc

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> RawResponse:
        reader, writer = await self._open()
        writer.write(self._request(method, path, body, headers or {}))
        status, head = await self._head(reader)
        data = b"".join([p async for p in self._pieces(reader, head)])
        if head.get("connection", "").lower() == "close":
            await self.close()
        return RawResponse(status=status, headers=head, body=data)

    async def stream(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, AsyncIterator[bytes]]:
        """The status, and the body's pieces as they arrive (read them all before the next request)."""
        reader, writer = await self._open()
        writer.write(self._request(method, path, body, headers or {}))
        status, head = await self._head(reader)
        return status, self._pieces(reader, head)
