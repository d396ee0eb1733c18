"""A minimal HTTP/1.1 keep-alive client over asyncio streams, for load generation.

httpx is convenient but costs milliseconds of CPU per request, which made the load generator,
not the controller, the bottleneck of the ingest benchmark (about 120 requests/s against
1,500/s with this client on the same 2-core machine). Plain ``http://`` only; one request at a
time per connection; `Pool` hands out connections.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Reply:
    """Status, headers (lower-case names) and body of one response."""

    status: int
    headers: dict[str, str]
    body: bytes


class Connection:
    """One keep-alive connection; reconnects once when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self._r, self._w = await asyncio.open_connection(self.host, self.port)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        for attempt in (0, 1):
            if self._w is None:
                await self._open()
            try:
                return await self._once(method, path, body, headers or {})
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt == 1:
                    raise
        raise ConnectionError("unreachable")

    async def _once(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply:
        assert self._r is not None and self._w is not None
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Content-Length: {len(body)}",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._w.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await self._w.drain()
        head = await self._r.readuntil(b"\r\n\r\n")
        status_line, *rest = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        hdrs = {}
        for line in rest:
            if ":" in line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int((await self._r.readuntil(b"\r\n")).strip(), 16)
                chunk = await self._r.readexactly(size + 2)
                if size == 0:
                    break
                data += chunk[:-2]
            payload = bytes(data)
        else:
            payload = await self._r.readexactly(int(hdrs.get("content-length", "0")))
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return Reply(status, hdrs, payload)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
        self._r = self._w = None


class Pool:
    """Up to ``size`` connections to one ``http://host:port``."""

    def __init__(self, base_url: str, size: int) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"{base_url}: only http://host:port URLs")
        self.prefix = u.path.rstrip("/")
        self._free: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(size):
            self._free.put_nowait(Connection(u.hostname, u.port or 80))

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        conn = await self._free.get()
        try:
            return await conn.request(method, self.prefix + path, body, headers)
        finally:
            self._free.put_nowait(conn)

    def close(self) -> None:
        while not self._free.empty():
            self._free.get_nowait().close()
