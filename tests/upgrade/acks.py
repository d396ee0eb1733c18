"""An HTTP forwarder in front of one controller replica that records every ingest answer: the
test's witness of which batch (node, agent_id, seq) which replica, of which release,
acknowledged. Agents are pointed at the forwarders (``--controller FWD_A,FWD_B``); a replica
that does not answer is a 502, on which an agent moves to its next URL, as it does for the
replica itself."""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding"}


@dataclass(frozen=True)
class Answer:
    """One answer to ``POST /api/v1/ingest`` as it went back to the agent."""

    replica: str
    release: str  # what ran behind the forwarder then ("old" or "new")
    node: str
    agent_id: str
    seq: int
    status: int
    duplicate: bool | None  # the Ack's flag (None unless 200)
    at_s: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.node, self.agent_id, self.seq)


class AckRecorder:
    """Forwards to ``http://127.0.0.1:PORT`` of the replica named ``replica``; ``release`` is
    set by the test whenever it replaces what runs there."""

    def __init__(self, replica: str, target_port: int, release: str) -> None:
        self.replica, self.release = replica, release
        self.target = f"http://127.0.0.1:{target_port}"
        self.answers: list[Answer] = []
        # every other answer but a 2xx: (release, "METHOD PATH STATUS why")
        self.other: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=30.0)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> AckRecorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def acked(self, release: str | None = None) -> list[Answer]:
        with self._lock:
            return [
                a
                for a in self.answers
                if a.status == 200 and (release is None or a.release == release)
            ]

    def _record(self, raw: bytes, encoding: str | None, r: httpx.Response, release: str) -> None:
        body = json.loads(gzip.decompress(raw) if encoding == "gzip" else raw)
        dup = None
        if r.status_code == 200:
            dup = bool(r.json().get("duplicate"))
        a = Answer(
            self.replica, release, body["node"], body["agent_id"], int(body["seq"]),
            r.status_code, dup, time.time(),
        )  # fmt: skip
        with self._lock:
            self.answers.append(a)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        rec = self

        class Forward(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _forward(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                release = rec.release
                try:
                    r = rec._client.request(
                        method, rec.target + self.path, content=raw, headers=headers
                    )
                except httpx.HTTPError as exc:
                    with rec._lock:
                        why = f"{type(exc).__name__}: {exc}"
                        rec.other.append((release, f"{method} {self.path} 502 {why}"))
                    self.send_response(502)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if method == "POST" and self.path == "/api/v1/ingest":
                    rec._record(raw, self.headers.get("Content-Encoding"), r, release)
                elif r.status_code >= 300:
                    with rec._lock:
                        what = f"{method} {self.path} {r.status_code} {r.text[:200]}"
                        rec.other.append((release, what))
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in HOP | {"content-encoding"}:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        return Forward
