"""The tenant matrix of docs/tenants.md, asserted cell by cell against a real controller.

The test reads the table from the document itself (between its ``tenant-matrix`` markers), so
the document and the behaviour cannot drift apart: a changed status is a changed document. The
controller runs the embedded scheduler; the real agents of three simulated nodes push to it
over HTTP with node-bound tokens: ``na`` of tenant ``ta``, ``nb`` of tenant ``tb`` and ``ns``
shared, each with a finding (persistence mode off).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devices.sim import SimFleet
from gpufleet.devices.sim.faults import Fault, FaultKind
from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.testing.testbed import Agents, Controller, wait_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "tenants.md"
TENANT_OF = {"na": "ta", "nb": "tb", "ns": None}


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    body: str
    expected: dict[str, int]  # column -> status


def matrix() -> list[Row]:
    """The rows of the table in docs/tenants.md."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- tenant-matrix:start -->")[1].split("<!-- tenant-matrix:end -->")[0]
    lines = [ln.strip() for ln in block.strip().splitlines()]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    columns = header[2:]
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        method, path = cells[0].split(" ", 1)
        rows.append(
            Row(
                method,
                path,
                cells[1].strip("`"),
                dict(zip(columns, map(int, cells[2:]), strict=True)),
            )
        )
    return rows


def test_the_document_has_every_column_and_a_row_per_area() -> None:
    rows = matrix()
    assert set(rows[0].expected) == {
        f"{t}-{r}" for t in ("g", "ta") for r in ("admin", "operator", "viewer", "agent")
    }
    covered = {r.path.split("/")[3] for r in rows}
    assert {"nodes", "findings", "audit", "tokens", "policy", "jobs", "ingest"} <= covered


@dataclass
class Rig:
    ctl: Controller
    agents: Agents
    tokens: dict[str, str]
    seq: Iterator[int]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    faults = tuple(Fault(FaultKind.PERSISTENCE_OFF, node=n, gpu=0) for n in TENANT_OF)
    fleet = SimFleet(FleetSpec(tuple(NodeSpec(n, "h100-sxm", 2) for n in TENANT_OF), faults=faults))
    ctl = Controller(tmp_path_factory.mktemp("matrix")).start()
    agents = Agents(ctl.url, "", fleet, tokens=ctl.node_tokens(fleet)).start()
    try:
        sched = ctl.service.scheduler if ctl.service else None
        assert isinstance(sched, EmbeddedBackend)
        wait_for(lambda: len(sched.store.nodes()) == 3, 20, "three agents offer job slots")
        for node, tenant in TENANT_OF.items():
            if tenant:
                r = ctl.call("PATCH", f"/api/v1/nodes/{node}", json={"tenant": tenant})
                assert r.status_code == 200, r.text

        def findings() -> bool:
            got = ctl.call("GET", "/api/v1/findings").json()
            return {f["node"] for f in got} >= set(TENANT_OF)

        wait_for(findings, 20, "a finding on every node")
        tokens = {"g-admin": ctl.admin}
        for tenant, role in itertools.product(("g", "ta"), ("operator", "viewer", "agent")):
            tokens[f"{tenant}-{role}"] = ctl.token(role, tenant=None if tenant == "g" else tenant)
        tokens["ta-admin"] = ctl.token("admin", tenant="ta")
        yield Rig(ctl, agents, tokens, itertools.count(1))
    finally:
        agents.stop()
        ctl.stop()


def _finding(rig: Rig, node: str) -> int:
    got = rig.ctl.call("GET", "/api/v1/findings", params={"node": node, "active": "false"})
    rows = [f for f in got.json() if f["node"] == node]
    got = rig.ctl.call("GET", "/api/v1/findings", params={"node": node})
    rows += [f for f in got.json() if f["node"] == node]
    assert rows, f"no finding on {node}"
    return int(rows[0]["id"])


def _job(rig: Rig, tenant: str) -> str:
    body = {"name": "target", "command": ["sim"], "duration_s": 600, "tenant": tenant}
    r = rig.ctl.call("POST", "/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _token_id(rig: Rig, tenant: str) -> int:
    r = rig.ctl.call("POST", "/api/v1/tokens", json={"role": "viewer", "tenant": tenant})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _resolve(rig: Rig, text: str) -> str:
    """Fill in ``{finding:N}``, ``{job:T}`` and ``{token:T}`` (fresh targets per request)."""

    def one(m: re.Match[str]) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "finding":
            return str(_finding(rig, arg))
        if kind == "job":
            return _job(rig, arg)
        return str(_token_id(rig, arg))

    return re.sub(r"\{(finding|job|token):(\w+)\}", one, text)


def _body(rig: Rig, spec: str, column: str) -> Any:
    if not spec:
        return None
    if spec == "{policy}":
        return rig.ctl.call("GET", "/api/v1/policy").json()
    m = re.fullmatch(r"batch\((\w+)\)", spec)
    if m:
        return {
            "node": m.group(1),
            "agent_id": f"matrix-{column}",
            "seq": next(rig.seq),
            "sent_at_s": time.time(),
        }
    return json.loads(spec)


@pytest.mark.process
def test_every_cell_of_the_matrix(rig: Rig) -> None:
    wrong = []
    for row in matrix():
        for column, expected in row.expected.items():
            path = _resolve(rig, row.path)
            body = _body(rig, row.body, column)
            r = rig.ctl.call(row.method, path, rig.tokens[column], json=body)
            if r.status_code != expected:
                wrong.append(
                    f"{row.method} {path} {row.body} as {column}: {r.status_code} "
                    f"(documented {expected}) {r.text[:120]}"
                )
    assert not wrong, "\n".join(wrong)


@pytest.mark.process
def test_a_tenant_token_reads_nothing_of_another_tenant(rig: Rig) -> None:
    ta = rig.tokens["ta-viewer"]
    call = rig.ctl.call
    assert {n["name"] for n in call("GET", "/api/v1/nodes", ta).json()["nodes"]} == {"na", "ns"}
    assert {g["node"] for g in call("GET", "/api/v1/gpus", ta).json()} == {"na", "ns"}
    assert call("GET", "/api/v1/gpus", ta, params={"node": "nb"}).json() == []
    assert set(call("GET", "/api/v1/heatmap", ta).json()["nodes"]) == {"na", "ns"}
    assert call("GET", "/api/v1/summary", ta).json()["nodes"] == 2
    nodes = {f["node"] for f in call("GET", "/api/v1/findings", ta).json()}
    assert nodes and "nb" not in nodes
    assert "nb" not in {e["node"] for e in call("GET", "/api/v1/events", ta).json()}
    # the global view has all three, so the filters above did remove something
    assert call("GET", "/api/v1/summary").json()["nodes"] == 3


@pytest.mark.process
def test_the_audit_log_is_per_tenant(rig: Rig) -> None:
    op_a = rig.tokens["ta-operator"]
    r = rig.ctl.call("POST", "/api/v1/nodes/na/actions/uncordon", op_a)
    assert r.status_code == 200, r.text
    rig.ctl.call("POST", "/api/v1/nodes/nb/actions/uncordon", rig.tokens["g-operator"])
    # ta's own refused attempt naming tb's node (this test's own row: it relied on the matrix
    # test before it in the file making one, and failed when run alone)
    body = {"node": "nb", "verdict": "pass"}
    refused = rig.ctl.call("POST", "/api/v1/validation-results", rig.tokens["ta-viewer"], json=body)
    assert refused.status_code == 403, refused.text
    mine = rig.ctl.call("GET", "/api/v1/audit", op_a, params={"limit": 5000}).json()
    assert mine and any(a["action"] == "node.uncordon" and a["target"] == "na" for a in mine)
    # every row the tenant reads was written by one of its tokens (actor names its role)
    ta_names = {
        t["name"] for t in rig.ctl.call("GET", "/api/v1/tokens").json() if t["tenant"] == "ta"
    }
    assert {a["actor"].split(":", 1)[1] for a in mine} <= ta_names
    everything = rig.ctl.call("GET", "/api/v1/audit", params={"limit": 5000}).json()
    assert any(a["target"] == "nb" and a["action"] == "node.uncordon" for a in everything)
    # ta's own refused attempts on nb are its rows; the global operator's uncordon is not
    assert not any(a["target"] == "nb" and a["outcome"] == "ok" for a in mine)
    assert any(a["target"] == "nb" and a["outcome"] == "refused" for a in mine)
