"""Receivers for the notification tests, run in the test process: a webhook server that
records every attempt (and can answer 500 to first attempts, or answer slowly), and a minimal
SMTP server (RFC 5321 commands HELO/EHLO, MAIL, RCPT, DATA, QUIT) on asyncio."""

from __future__ import annotations

import asyncio
import email
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Attempt:
    """One POST as received."""

    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def id(self) -> str:
        return self.headers["x-gpufleet-id"]

    def json(self) -> Any:
        return json.loads(self.body)

    def signed_by(self, secret: bytes) -> bool:
        """Checks the signature as a receiver would (docs/alerts.md), independently of
        gpufleet's own code."""
        ts = self.headers["x-gpufleet-timestamp"]
        want = hmac.new(secret, ts.encode() + b"." + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("x-gpufleet-signature", ""), "sha256=" + want)


class WebhookReceiver:
    """Records attempts; ``fail_first``: answer 500 to the first attempt of every id;
    ``delay_s``: answer that late."""

    def __init__(self, *, fail_first: bool = False, delay_s: float = 0.0) -> None:
        self.attempts: list[Attempt] = []
        self.accepted: dict[str, Attempt] = {}  # by id: what a de-duplicating receiver keeps
        self.lock = threading.Lock()
        self.fail_first = fail_first
        self.delay_s = delay_s
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                with outer.lock:
                    seen = any(
                        a.headers.get("x-gpufleet-id") == headers.get("x-gpufleet-id")
                        for a in outer.attempts
                    )
                    status = 500 if outer.fail_first and not seen else 200
                    attempt = Attempt(headers, body, status)
                    outer.attempts.append(attempt)
                    if status == 200:
                        outer.accepted.setdefault(attempt.id, attempt)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up waiting

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/s3cr3t-path"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait(self, predicate: Any, timeout_s: float = 30.0) -> None:
        end = time.monotonic() + timeout_s
        while True:
            with self.lock:
                if predicate(self):
                    return
            if time.monotonic() > end:
                raise AssertionError(f"timed out; attempts: {[a.headers for a in self.attempts]}")
            time.sleep(0.05)


class SmtpReceiver:
    """A minimal SMTP server on asyncio in its own thread; ``messages``: what DATA delivered."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        async def serve() -> None:
            server = await asyncio.start_server(self._session, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._server = server
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self.loop)
        ready.wait(10)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def reply(line: str) -> None:
            writer.write(line.encode() + b"\r\n")
            await writer.drain()

        await reply("220 test-smtp ready")
        sender, rcpts = "", list[str]()
        while True:
            line = (await reader.readline()).decode().rstrip("\r\n")
            if not line:
                break
            verb = line.split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                await reply("250 test-smtp")
            elif verb == "MAIL":
                sender, rcpts = line.split(":", 1)[1].strip(), []
                await reply("250 ok")
            elif verb == "RCPT":
                rcpts.append(line.split(":", 1)[1].strip())
                await reply("250 ok")
            elif verb == "DATA":
                await reply("354 end with <CRLF>.<CRLF>")
                data = bytearray()
                while True:
                    chunk = await reader.readline()
                    if chunk in (b".\r\n", b".\n", b""):
                        break
                    data += chunk[1:] if chunk.startswith(b"..") else chunk
                self.messages.append(email.message_from_bytes(bytes(data)))
                self.envelopes.append((sender, rcpts))
                await reply("250 queued")
            elif verb == "QUIT":
                await reply("221 bye")
                break
            elif verb in ("RSET", "NOOP"):
                await reply("250 ok")
            else:
                await reply("502 not implemented")
        writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
