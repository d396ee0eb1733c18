"""A loopback stand-in for the few Kubernetes API endpoints the backend uses.

Paths and payloads follow the Kubernetes API reference (v1.30+): ``GET /api/v1/nodes``,
``GET/PATCH /api/v1/nodes/{name}`` (merge-patch or strategic-merge-patch bodies; a stale
``metadata.resourceVersion`` in the patch answers 409 Conflict), ``GET /api/v1/pods`` with a
``fieldSelector`` on ``spec.nodeName`` / ``status.phase``, and
``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` taking a ``policy/v1`` Eviction and
answering 429 TooManyRequests while a PodDisruptionBudget forbids it.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _status(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        **extra,
    }


class FakeApi:
    """In-memory nodes and pods behind a ThreadingHTTPServer on 127.0.0.1."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdb_blocks: dict[tuple[str, str], int] = {}  # pod -> 429 answers left (-1: always)
        self.requests: list[dict[str, Any]] = []
        self.conflicts_left = 0  # answer this many taint patches with 409
        self._rv = 100
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def do_GET(self) -> None:
                with api._lock:
                    self._send(*api.get(self.path))

            def _record(self, method: str, body: Any) -> None:
                """Log the request in ``api.requests`` (the caller holds the lock)."""
                api.requests.append(
                    {
                        "method": method,
                        "path": self.path,
                        "body": body,
                        "content_type": self.headers.get("Content-Type"),
                    }
                )

            def do_PATCH(self) -> None:
                body = self._body()
                with api._lock:
                    self._record("PATCH", body)
                    self._send(*api.patch(self.path, self.headers.get("Content-Type", ""), body))

            def do_POST(self) -> None:
                body = self._body()
                with api._lock:
                    self._record("POST", body)
                    self._send(*api.post(self.path, body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeApi:
        self.thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    # -- state helpers -----------------------------------------------------------------

    def add_node(
        self, name: str, gpus: int = 8, taints: list[dict[str, str]] | None = None
    ) -> None:
        self._rv += 1
        self.nodes[name] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, "resourceVersion": str(self._rv), "labels": {}},
            "spec": {"taints": taints or []},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    def add_pod(
        self,
        ns: str,
        name: str,
        node: str,
        gpus: int = 1,
        owner: str = "ReplicaSet",
        phase: str = "Running",
    ) -> None:
        res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        self.pods[(ns, name)] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": owner,
                        "name": "o",
                        "uid": "u",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "img:1", "resources": res}],
            },
            "status": {"phase": phase},
        }

    # -- endpoints ----------------------------------------------------------------------

    def get(self, raw: str) -> tuple[int, dict[str, Any]]:
        url = urlparse(raw)
        if url.path == "/api/v1/nodes":
            return 200, {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {},
                "items": list(self.nodes.values()),
            }
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", url.path)
        if m:
            node = self.nodes.get(m[1])
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{m[1]}" not found')
            return 200, node
        if url.path == "/api/v1/pods":
            sel = parse_qs(url.query).get("fieldSelector", [""])[0]
            items = [p for p in self.pods.values() if _matches(p, sel)]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        return 404, _status(404, "NotFound", f"no route {url.path}")

    def patch(self, raw: str, ctype: str, body: Any) -> tuple[int, dict[str, Any]]:
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", urlparse(raw).path)
        if not m or m[1] not in self.nodes:
            return 404, _status(404, "NotFound", "node not found")
        ctype = ctype.split(";")[0].strip()
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return 415, _status(
                415, "UnsupportedMediaType", f"the body of type {ctype} is not supported"
            )
        node = self.nodes[m[1]]
        want_rv = (body.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None:
            if self.conflicts_left > 0:
                self.conflicts_left -= 1
                self._rv += 1
                node["metadata"]["resourceVersion"] = str(self._rv)
            if want_rv != node["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", "the object has been modified")
            body = merge_patch(body, {"metadata": {"resourceVersion": None}})
        new = merge_patch(node, body)
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        self.nodes[m[1]] = new
        return 200, new

    def post(self, raw: str, body: Any) -> tuple[int, dict[str, Any]]:
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", urlparse(raw).path)
        if not m:
            return 404, _status(404, "NotFound", "no route")
        ns, name = m[1], m[2]
        if body.get("apiVersion") != "policy/v1" or body.get("kind") != "Eviction":
            return 400, _status(400, "BadRequest", "expected a policy/v1 Eviction")
        md = body.get("metadata") or {}
        if md.get("name") != name or md.get("namespace", ns) != ns:
            return 400, _status(400, "BadRequest", "name in body does not match the URL")
        if (ns, name) not in self.pods:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        left = self.pdb_blocks.get((ns, name), 0)
        if left:
            self.pdb_blocks[(ns, name)] = left - 1 if left > 0 else left
            return 429, _status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                details={
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": "The disruption budget pdb needs 1 healthy pods "
                            "and has 1 currently",
                        }
                    ]
                },
            )
        del self.pods[(ns, name)]
        return 201, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }


def _matches(pod: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        neg = "!=" in term
        key, val = term.split("!=" if neg else "=", 1)
        actual = {
            "spec.nodeName": pod["spec"].get("nodeName"),
            "status.phase": pod["status"].get("phase"),
        }.get(key)
        if (actual == val) == neg:
            return False
    return True
