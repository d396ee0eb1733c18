"""A small synchronous client of the control plane's REST API (``/api/v1``).

``Client(url, token)`` covers what the CLI asks a controller: nodes, findings, lifecycle actions
(cordon, drain, resume, ...), node attributes, and jobs (submit, list, show, cancel, logs). Every
call sends the bearer token; an HTTP error becomes ``ApiError`` with the status and the server's
``detail``; a connection failure becomes ``ControllerUnreachable``. Every answer is one of the
API's own models (`gpufleet.wire.views`: ``Node``, ``Finding``, ``Job``, ``JobDetail``,
``NodeDetail``, ``FleetSummary``, ...), validated on arrival; ``.model_dump(mode="json",
exclude_unset=True)`` gives the JSON document back as the controller sent it.

Neither the agent nor the control plane imports this module: it sits beside the CLI, above them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, RootModel, ValidationError

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.replicas import UNAVAILABLE, Replicas
from gpufleet.tls import client_verify
from gpufleet.wire.views import (
    EnergyReport,
    FindingOut,
    FleetSummary,
    Health,
    JobDetail,
    JobOut,
    NodeDetail,
    NodeOut,
    WhoAmI,
)

#: Lifecycle actions ``POST /nodes/{name}/actions/{action}`` accepts.
NODE_ACTIONS = (
    "cordon",
    "uncordon",
    "drain",
    "resume",
    "repair",
    "validate",
    "fail",
    "acknowledge",
)


class ApiError(GpufleetError):
    """The controller answered with an HTTP error; ``status`` and ``detail`` say which (the
    CLI exits 2, as for any refused input)."""

    exit_code = 2

    def __init__(self, method: str, path: str, status: int, detail: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")


def _seg(value: str) -> str:
    """One path segment, quoted: a name holding ``/`` or ``?`` stays inside it."""
    if value in ("", ".", ".."):
        raise UsageError(f"{value!r} is not a node name or job id")
    return quote(value, safe="")


class ControllerUnreachable(GpufleetError):
    """No answer from the controller (connection refused, timeout, bad URL)."""


class MalformedAnswer(GpufleetError):
    """The controller answered 2xx with a document that is not the API's model (a proxy's
    page, another service on the port, a controller of another version)."""


M = TypeVar("M", bound=BaseModel)


class _NodePage(BaseModel):
    """``GET /nodes``: one page of nodes (without their GPUs)."""

    nodes: list[NodeOut]


class _JobPage(BaseModel):
    """``GET /jobs``."""

    jobs: list[JobOut]


class _Findings(RootModel[list[FindingOut]]):
    """``GET /findings``."""


def _parse(model: type[M], doc: Any, what: str) -> M:
    """``doc`` as ``model``, or `MalformedAnswer` naming the call and the first bad field."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        field = ".".join(str(x) for x in first.get("loc", ())) or "the document"
        raise MalformedAnswer(
            f"{what}: the controller's answer is not a {model.__name__} ({field}: {first['msg']})"
        ) from None


#: A node (lifecycle ``state``, ``health`` 0 ok .. 3 unknown, counts), as the API answers it.
Node = NodeOut
#: A health finding on a node (``severity`` 0 ok .. 2 fail; ``action`` recommended).
Finding = FindingOut
#: A job: ``state`` (queued, running, succeeded, failed, cancelled, ...), where it runs.
Job = JobOut


def _env_ca() -> Path | None:
    value = os.environ.get("GPUFLEET_CA", "").strip()
    return Path(value) if value else None


class Client:
    """A synchronous client of one controller, e.g. ``Client("http://ctl:8080", token)``.

    Use it as a context manager (or call ``close()``) to release its connections. ``transport``
    lets a caller route requests elsewhere (an in-process ASGI app, a test server).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        ca: Path | ssl.SSLContext | None = None,
    ) -> None:
        """``ca``: a PEM bundle (or a ready TLS context) to verify an https controller with
        (default: the ``GPUFLEET_CA`` environment variable, else the system's trust store)."""
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"controller URL {url!r}: expected http://HOST:PORT or https://...")
        if not token:
            raise UsageError("a controller token is needed (--token or GPUFLEET_TOKEN)")
        # ``URL1,URL2``: the control plane's replicas; requests fail over between them
        self.replicas = Replicas(url, "controller URL")
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
            verify=ca if isinstance(ca, ssl.SSLContext) else client_verify(ca or _env_ca()),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        """One call under ``/api/v1`` (``path`` like ``/nodes``); the decoded JSON answer."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        r = self._send(method, path, json, query)
        if r.status_code >= 400:
            try:
                body = r.json()
                detail = body.get("detail", r.text) if isinstance(body, dict) else r.text
            except ValueError:
                detail = r.text
            raise ApiError(method, path, r.status_code, str(detail))
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

    @property
    def url(self) -> str:
        """The replica that answered last."""
        return self.replicas.base

    def _send(self, method: str, path: str, json: Any, query: Mapping[str, Any]) -> httpx.Response:
        """The request to the replica that answered last, then to the others while one cannot
        be reached or answers 502/503/504 (`gpufleet.replicas`). Only requests that cannot
        have taken effect move on: a replica that could not be reached, or one that said it
        cannot serve."""
        failure: Exception | None = None
        last: httpx.Response | None = None
        for i in self.replicas.order():
            base = self.replicas.urls[i]
            try:
                r = self._http.request(method, f"{base}/api/v1{path}", json=json, params=query)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never reached it
                failure = exc
                continue
            except httpx.HTTPError as exc:
                if method != "GET":  # it may have acted: never send it twice
                    raise ControllerUnreachable(f"control plane {base}: {exc}") from exc
                failure = exc
                continue
            if r.status_code in UNAVAILABLE and len(self.replicas.urls) > 1:
                last = r
                continue
            self.replicas.answered(i)
            return r
        if last is not None:
            return last
        urls = ", ".join(self.replicas.urls)
        raise ControllerUnreachable(f"control plane {urls}: {failure}") from failure

    # -- fleet ----------------------------------------------------------------------------------
    def health(self) -> Health:
        """The controller's liveness answer: status, version, leader or follower."""
        return _parse(Health, self.request("GET", "/health"), "GET /health")

    def whoami(self) -> WhoAmI:
        """The token's name, role, tenant and node."""
        return _parse(WhoAmI, self.request("GET", "/whoami"), "GET /whoami")

    def summary(self) -> FleetSummary:
        """Fleet counts by state, health and model, breaker and ingest figures."""
        return _parse(FleetSummary, self.request("GET", "/summary"), "GET /summary")

    def nodes(
        self,
        *,
        state: str | None = None,
        rack: str | None = None,
        model: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[Node]:
        """Nodes, optionally filtered by lifecycle state, rack or GPU model."""
        params = {
            "state": state,
            "rack": rack,
            "model": model,
            "gpus": "false",
            "limit": limit,
            "offset": offset,
        }
        doc = self.request("GET", "/nodes", params=params)
        return _parse(_NodePage, doc, "GET /nodes").nodes

    def node(self, name: str) -> NodeDetail:
        """One node in detail: its GPUs with their newest samples, devices, active findings,
        transitions and validations."""
        return _parse(NodeDetail, self.request("GET", f"/nodes/{_seg(name)}"), f"GET /nodes/{name}")

    def findings(
        self,
        *,
        node: str | None = None,
        active: bool | None = True,
        severity: int | None = None,
        limit: int = 500,
    ) -> list[Finding]:
        """Findings, newest first; ``active=None`` includes cleared ones."""
        params = {"node": node, "severity": severity, "limit": limit}
        if active is not None:
            params["active"] = "true" if active else "false"
        return _parse(
            _Findings, self.request("GET", "/findings", params=params), "GET /findings"
        ).root

    # -- lifecycle ------------------------------------------------------------------------------
    def node_action(self, name: str, action: str, reason: str = "") -> Node:
        """Apply a lifecycle action (one of ``NODE_ACTIONS``) to a node; the node after it."""
        if action not in NODE_ACTIONS:
            raise UsageError(f"action {action!r}: expected one of {', '.join(NODE_ACTIONS)}")
        body = {"reason": reason} if reason else None
        doc = self.request("POST", f"/nodes/{_seg(name)}/actions/{action}", json=body)
        return _parse(Node, doc, f"POST /nodes/{name}/actions/{action}")

    def cordon(self, name: str, reason: str = "") -> Node:
        """Stop new work landing on the node; running work stays."""
        return self.node_action(name, "cordon", reason)

    def drain(self, name: str, reason: str = "") -> Node:
        """Cordon the node and move its work away (the scheduler drains it)."""
        return self.node_action(name, "drain", reason)

    def resume(self, name: str, reason: str = "") -> Node:
        """Return a drained or repaired node to service."""
        return self.node_action(name, "resume", reason)

    def uncordon(self, name: str, reason: str = "") -> Node:
        """Lift a cordon."""
        return self.node_action(name, "uncordon", reason)

    def set_node(
        self,
        name: str,
        *,
        rack: str | None = None,
        tenant: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> Node:
        """Set a node's rack, tenant or labels (only the ones given)."""
        body = {"rack": rack, "tenant": tenant, "labels": labels}
        payload = {k: v for k, v in body.items() if v is not None}
        return _parse(
            Node,
            self.request("PATCH", f"/nodes/{_seg(name)}", json=payload),
            f"PATCH /nodes/{name}",
        )

    # -- jobs -----------------------------------------------------------------------------------
    def submit(self, name: str, command: list[str], **options: Any) -> Job:
        """Submit a job; ``options`` are the jobs API's fields (``gpus``, ``nodes``, ``tenant``,
        ``image``, ``gpu_model``, ``priority``, ``max_restarts``, ``env``, ``duration_s``, ...).
        Unknown fields are refused by the controller with the field's name."""
        body = {"name": name, "command": list(command)}
        body.update({k: v for k, v in options.items() if v is not None})
        return _parse(Job, self.request("POST", "/jobs", json=body), "POST /jobs")

    def jobs(self, *, state: str | None = None, tenant: str | None = None) -> list[Job]:
        """Jobs, oldest first (a tenant token sees its tenant's only)."""
        doc = self.request("GET", "/jobs", params={"state": state, "tenant": tenant})
        return _parse(_JobPage, doc, "GET /jobs").jobs

    def energy(self, by: str = "tenant", since: str = "30d") -> EnergyReport:
        """The energy report (``GET /energy``): rows per job, tenant, node, model or day."""
        doc = self.request("GET", "/energy", params={"by": by, "since": since})
        return _parse(EnergyReport, doc, "GET /energy")

    def job(self, job_id: str) -> JobDetail:
        """One job with its spec, every attempt and its energy."""
        return _parse(
            JobDetail, self.request("GET", f"/jobs/{_seg(job_id)}"), f"GET /jobs/{job_id}"
        )

    def cancel(self, job_id: str) -> Job:
        """Cancel a job (its running copies are killed)."""
        return _parse(
            Job, self.request("POST", f"/jobs/{_seg(job_id)}/cancel"), f"POST /jobs/{job_id}/cancel"
        )

    def logs(self, job_id: str, *, tail: int = 0) -> str:
        """The output of the job's newest copy (``tail``: only the last N lines)."""
        doc = self.request("GET", f"/jobs/{_seg(job_id)}/logs", params={"tail": max(0, tail)})
        return str(doc["text"])
