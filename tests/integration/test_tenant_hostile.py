"""The hostile cases of the "jobs you can trust" issue (items 6-8), reproduced against a real
controller on loopback with real agents, each one failing before its fix:

- a tenant's job placed on another tenant's node;
- an unbound agent token registering a fake node with many GPUs and being handed a big job's
  start command (with its secret env); a node-bound token offering more slots than its GPUs;
- a job's env readable by viewers, in the audit log or the events;
- a token bound to one node reusing another node's agent id, making that node's real batches
  count as duplicates;
- the CLI sending ``--tenant default`` so a tenant token's submit was refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.testing.testbed import Agents, Controller, wait_for
from tests.integration.conftest import embedded

pytestmark = pytest.mark.process


Bed = Callable[..., tuple[Controller, Agents]]
SECRET = "hf_very_secret_value_123"


def _known(ctl: Controller, n: int) -> bool:
    return len(embedded(ctl).store.nodes()) >= n


def _push(ctl: Controller, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        ctl.url + "/api/v1/ingest",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10.0,
    )


def _batch(
    node: str, seq: int, *, agent: str = "", gpus: int = 0, slots: int = 0, power: float = 0.0
) -> dict[str, Any]:
    now = time.time()
    body: dict[str, Any] = {
        "node": node,
        "agent_id": agent or f"agent-{node}",
        "seq": seq,
        "sent_at_s": now,
    }
    if gpus:
        body["devices"] = [
            {"index": g, "uuid": f"GPU-{node}-{g}", "info": {"model": "h100-sxm"}}
            for g in range(gpus)
        ]
    if power:
        body["samples"] = [
            {
                "gpu_index": 0,
                "gpu_uuid": f"GPU-{node}-0",
                "t": [now],
                "fields": {"power_w": [power]},
            }
        ]
    if slots:
        body["jobs"] = {
            "lease_s": 30,
            "slots": [
                {"index": i, "model": "h100-sxm", "memory_bytes": 80 * 2**30} for i in range(slots)
            ],
            "copies": [],
        }
    return body


def test_a_tenants_jobs_run_only_on_its_nodes_or_shared_ones(bed: Bed) -> None:
    ctl, agents = bed(nodes=["n1", "n2", "n3"])
    wait_for(lambda: _known(ctl, 3), 15, "agents offer job slots")
    # the nodes joined the scheduler as shared; re-tenanting them now must reach placement
    for node, tenant in (("n1", "ta"), ("n2", "tb"), ("n3", "tb")):
        assert (
            ctl.call("PATCH", f"/api/v1/nodes/{node}", json={"tenant": tenant}).status_code == 200
        )
    ta = ctl.token("operator", tenant="ta")
    spec = {"name": "a", "command": ["sim"], "gpus": 2, "duration_s": 600}
    ids = [ctl.call("POST", "/api/v1/jobs", ta, json=spec).json()["id"] for _ in range(3)]
    first = wait_for(
        lambda: (
            (j := ctl.call("GET", f"/api/v1/jobs/{ids[0]}", ta).json())["state"] == "running" and j
        ),
        15,
        "the first job of ta runs",
    )
    assert first["nodes"] == ["n1"]
    time.sleep(2.0)  # several scheduler ticks with n2 and n3 idle
    for jid in ids[1:]:
        j = ctl.call("GET", f"/api/v1/jobs/{jid}", ta).json()
        assert j["state"] == "queued" and j["nodes"] == [], j
    # no copy of a ta job ever ran on a tb node (the simulated agents saw every start)
    assert {c[2] for c in agents.running_copies() if c[0] in ids} == {"n1"}
    # a job no ta node could ever hold is refused, not queued for tb's GPUs
    big = ctl.call("POST", "/api/v1/jobs", ta, json={**spec, "gpus": 2, "nodes": 2})
    assert big.status_code == 422 and "only 1 of 1 node(s)" in big.json()["detail"]


def test_an_unbound_agent_token_gets_no_job_and_no_secret(bed: Bed) -> None:
    ctl, _ = bed(nodes=["n1"])
    wait_for(lambda: _known(ctl, 1), 15, "agent offers job slots")
    unbound = ctl.token("agent")
    # the trial's attack: a fake node claiming 16 GPUs (the most a node may have) with 16
    # slots, from an unbound token
    r = _push(ctl, unbound, _batch("fake", 1, gpus=16, slots=16))
    assert r.status_code == 200, r.text
    body = {"name": "big", "command": ["sim"], "gpus": 16, "env": {"HF_TOKEN": SECRET}}
    refused = ctl.call("POST", "/api/v1/jobs", json=body)
    assert refused.status_code == 422, refused.text  # no node with 16 GPUs offers slots
    assert "fake" not in embedded(ctl).store.nodes()
    # a node-bound token offering more slots than its node registered: only the real ones count
    bound = ctl.token("agent", node="two")
    for seq in (1, 2):
        r = _push(ctl, bound, _batch("two", seq, gpus=2, slots=8))
        assert r.status_code == 200, r.text
    wait_for(lambda: "two" in embedded(ctl).store.nodes(), 10, "node two joins")
    slots = embedded(ctl).store.nodes()["two"].info.gpus
    assert sorted(s.index for s in slots) == [0, 1]
    # a job submitted later is never sent to the unbound token's fake node
    ok = ctl.call("POST", "/api/v1/jobs", json={**body, "gpus": 1, "duration_s": 600})
    assert ok.status_code == 201
    for seq in range(2, 6):
        r = _push(ctl, unbound, _batch("fake", seq, gpus=16, slots=16))
        assert "commands" not in r.json() and SECRET not in r.text
        time.sleep(0.3)


def test_a_jobs_env_is_never_shown(bed: Bed) -> None:
    ctl, _ = bed(nodes=["n1"])
    wait_for(lambda: _known(ctl, 1), 15, "agent offers job slots")
    body = {"name": "s", "command": ["sim"], "duration_s": 600, "env": {"HF_TOKEN": SECRET}}
    jid = ctl.call("POST", "/api/v1/jobs", json=body).json()["id"]
    viewer = ctl.token("viewer")
    for path in (
        "/api/v1/jobs",
        f"/api/v1/jobs/{jid}",
        f"/api/v1/jobs/{jid}/logs",
        "/api/v1/audit",
        "/api/v1/events",
    ):
        for token in (viewer, ctl.admin):
            r = ctl.call("GET", path, token)
            assert SECRET not in r.text, path
    audit = ctl.call("GET", "/api/v1/audit").json()
    assert any(a["action"] == "job.submit" and a["target"] == jid for a in audit)


def test_a_token_cannot_freeze_another_nodes_batches_by_reusing_its_agent_id(bed: Bed) -> None:
    ctl, _ = bed(nodes=["n1"], run_jobs=False)
    ra = ctl.token("agent", node="ra")
    rb = ctl.token("agent", node="rb")
    # rb's token goes first with ra's agent id and sequence numbers
    for seq in (1, 2, 3):
        r = _push(ctl, rb, _batch("rb", seq, agent="agent-ra", gpus=1, power=50.0))
        assert r.status_code == 200 and r.json()["duplicate"] is False
    # ra's real batches are stored, not acknowledged as duplicates
    for seq in (1, 2, 3):
        r = _push(ctl, ra, _batch("ra", seq, agent="agent-ra", gpus=1, power=300.0 + seq))
        assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
    node = ctl.call("GET", "/api/v1/nodes/ra").json()["node"]
    assert node["gpu_latest"][0]["metrics"]["power_w"] == 303.0  # telemetry not frozen
    # a true replay is still a duplicate, and a bound token cannot write for another node
    assert _push(ctl, ra, _batch("ra", 3, agent="agent-ra", gpus=1)).json()["duplicate"] is True
    assert _push(ctl, rb, _batch("ra", 9, agent="agent-ra", gpus=1)).status_code == 403


def test_a_tenant_agent_token_pushes_only_for_its_tenants_nodes(bed: Bed) -> None:
    ctl, _ = bed(nodes=["n1"], run_jobs=False)
    wait_for(lambda: ctl.call("GET", "/api/v1/nodes/n1").status_code == 200, 10, "n1 registers")
    assert ctl.call("PATCH", "/api/v1/nodes/n1", json={"tenant": "tb"}).status_code == 200
    ta_agent = ctl.token("agent", tenant="ta")
    assert _push(ctl, ta_agent, _batch("n1", 1, agent="x", gpus=1)).status_code == 403
    # a node it registers is its tenant's
    assert _push(ctl, ta_agent, _batch("na-new", 1, gpus=1)).status_code == 200
    assert ctl.call("GET", "/api/v1/nodes/na-new").json()["node"]["tenant"] == "ta"


def test_the_cli_leaves_the_tenant_to_the_token(bed: Bed, tmp_path: Path) -> None:
    ctl, _ = bed(nodes=["n1"])
    wait_for(lambda: _known(ctl, 1), 15, "agent offers job slots")
    token_file = tmp_path / "ta.token"
    token_file.write_text(ctl.token("operator", tenant="ta") + "\n", encoding="utf-8")
    remote = ["--controller", ctl.url, "--token-file", str(token_file), "--json"]
    r = CliRunner().invoke(
        app, ["jobs", "submit", *remote, "--duration", "0.5", "--", "sim"], env={}
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tenant"] == "ta"
    r = CliRunner().invoke(app, ["jobs", "list", *remote])
    assert r.exit_code == 0 and [j["tenant"] for j in json.loads(r.output)["jobs"]] == ["ta"]
