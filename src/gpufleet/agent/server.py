"""The agent's HTTP endpoints: ``/metrics`` (Prometheus text), ``/health`` (JSON verdict and
findings) and ``/healthz`` (200 while the sampling loop is alive, 503 otherwise).

A stdlib threading HTTP server: no framework needed for three read-only endpoints, and a scrape
never touches NVML (it reads the ring buffers). ``--tls-cert``/``--tls-key`` make it HTTPS.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from gpufleet.errors import UsageError
from gpufleet.telemetry.exposition import CONTENT_TYPE

if TYPE_CHECKING:
    from gpufleet.agent.runner import Agent

log = logging.getLogger("gpufleet.agent.http")
HANDSHAKE_TIMEOUT_S = 10.0  # a client silent this long (TLS handshake or request) is dropped


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) to a (host, port) pair."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Handler(BaseHTTPRequestHandler):
    agent: Agent
    server_version = "gpufleet-agent"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(200, self.agent.render_metrics(), CONTENT_TYPE)
            elif path == "/health":
                doc = self.agent.health_doc()
                self._send(200, json.dumps(doc).encode(), "application/json")
            elif path == "/healthz":
                ok, doc = self.agent.healthz()
                self._send(200 if ok else 503, json.dumps(doc).encode(), "application/json")
            else:
                self._send(404, b"not found: try /metrics, /health or /healthz\n", "text/plain")
        except Exception:  # a failed scrape must never take the agent down
            log.exception("error serving %s", path)
            self._send(500, b"internal error\n", "text/plain")


class _TlsServer(ThreadingHTTPServer):
    """HTTPS: each accepted connection is wrapped, its handshake done in the request's own
    thread (a slow or silent client never holds up ``accept``)."""

    context: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = super().get_request()
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


class AgentServer:
    """Serves one agent on HOST:PORT from a background thread; HTTPS with ``tls``."""

    def __init__(
        self, agent: Agent, host: str, port: int, *, tls: ssl.SSLContext | None = None
    ) -> None:
        handler = type("Handler", (_Handler,), {"agent": agent, "timeout": HANDSHAKE_TIMEOUT_S})
        try:
            if tls is None:
                self.httpd = ThreadingHTTPServer((host, port), handler)
            else:
                self.httpd = _TlsServer((host, port), handler)
                self.httpd.context = tls
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self.scheme = "http" if tls is None else "https"
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="gpufleet-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> AgentServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
