"""The jobs REST API on a real controller with simulated agents: the list shape the dashboard
reads, roles, tenant scoping, audit, logs and the `gpufleet jobs --controller` commands."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.testing.testbed import Agents, Controller, wait_for
from gpufleet.wire.views import JobDetail
from tests.integration.conftest import embedded

pytestmark = pytest.mark.process


LIST_KEYS = {
    "id",
    "name",
    "tenant",
    "state",
    "nodes",
    "gpus",
    "restarts",
    "requeues",
    "exit_code",
    "reason",
    "priority",
    "submitted_at_s",
    "started_at_s",
    "ended_at_s",
}
Bed = Callable[..., tuple[Controller, Agents]]


def _job(ctl: Controller, job_id: str, token: str | None = None) -> dict[str, Any]:
    r = ctl.call("GET", f"/api/v1/jobs/{job_id}", token)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _nodes_known(ctl: Controller, n: int) -> bool:
    return len(embedded(ctl).store.nodes()) >= n


def test_submit_runs_on_an_agent_and_lists_in_the_dashboard_shape(bed: Bed) -> None:
    ctl, agents = bed()
    wait_for(lambda: _nodes_known(ctl, 3), 10, "three agents report jobs capability")
    body = {"name": "train", "command": ["sim"], "gpus": 2, "duration_s": 1.0, "priority": 3}
    r = ctl.call("POST", "/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    done = wait_for(
        lambda: _job(ctl, jid)["state"] == "succeeded" and _job(ctl, jid), 15, "job succeeds"
    )
    assert done["exit_code"] == 0 and (done["restarts"], done["requeues"]) == (0, 0)
    assert (done["max_restarts"], done["max_requeues"]) == (3, 10)  # failover on by default
    assert len(done["nodes"]) == 1 and done["gpu_indexes"] == [0, 1]
    # The simulated agent really ran it: one copy, on the node the controller shows, ~1 s long.
    ran = [i for i in agents.executor.intervals if i.job_id == jid]
    assert [(i.node, i.how) for i in ran] == [(done["nodes"][0], "completed")]
    assert abs((ran[0].end_s - ran[0].start_s) - 1.0) < 0.05
    listed = ctl.call("GET", "/api/v1/jobs").json()
    assert set(listed) == {"jobs"}
    item = next(j for j in listed["jobs"] if j["id"] == jid)
    assert set(item) == LIST_KEYS
    assert item["gpus"] == 2 and item["priority"] == 3 and item["tenant"] == "default"
    assert item["started_at_s"] <= item["ended_at_s"]


def test_roles_tenants_and_audit(bed: Bed) -> None:
    ctl, _ = bed()
    wait_for(lambda: _nodes_known(ctl, 3), 10, "agents report")
    viewer = ctl.token("viewer")
    red = ctl.token("operator", tenant="red")
    blue_viewer = ctl.token("viewer", tenant="blue")
    spec = {"name": "x", "command": ["sim"], "gpus": 1, "duration_s": 600}
    assert ctl.call("POST", "/api/v1/jobs", viewer, json=spec).status_code == 403
    r = ctl.call("POST", "/api/v1/jobs", red, json=spec)
    assert r.status_code == 201 and r.json()["tenant"] == "red"
    red_id = r.json()["id"]
    # A tenant token cannot submit for another tenant.
    assert ctl.call("POST", "/api/v1/jobs", red, json={**spec, "tenant": "blue"}).status_code == 403
    other = ctl.call("POST", "/api/v1/jobs", json={**spec, "tenant": "blue"}).json()["id"]
    red_list = [j["id"] for j in ctl.call("GET", "/api/v1/jobs", red).json()["jobs"]]
    assert red_list == [red_id]
    blue_list = [j["id"] for j in ctl.call("GET", "/api/v1/jobs", blue_viewer).json()["jobs"]]
    assert blue_list == [other]
    assert ctl.call("GET", f"/api/v1/jobs/{other}", red).status_code == 404
    assert ctl.call("POST", f"/api/v1/jobs/{other}/cancel", red).status_code == 404
    assert ctl.call("POST", f"/api/v1/jobs/{red_id}/cancel", viewer).status_code == 403
    r = ctl.call("POST", f"/api/v1/jobs/{red_id}/cancel", red)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    audit = ctl.call("GET", "/api/v1/audit?limit=50").json()
    seen = {(a["action"], a["target"], a["outcome"]) for a in audit}
    assert ("job.submit", red_id, "ok") in seen
    assert ("job.cancel", red_id, "ok") in seen
    assert ("job.cancel", other, "refused") in seen
    assert any(a["action"] == "job.submit" and a["outcome"] == "refused" for a in audit)
    assert any(
        a["action"].startswith("POST /api/v1/jobs") and a["outcome"] == "refused" for a in audit
    )  # the viewer's refused submit


def test_cli_talks_to_the_controller(bed: Bed) -> None:
    ctl, _ = bed()
    wait_for(lambda: _nodes_known(ctl, 3), 10, "agents report")
    runner = CliRunner()
    remote = ["--controller", ctl.url, "--token", ctl.admin, "--json"]
    r = runner.invoke(
        app, ["jobs", "submit", *remote, "--gpus", "1", "--duration", "0.5", "--", "sim"]
    )
    assert r.exit_code == 0, r.output
    jid = json.loads(r.output)["id"]
    wait_for(lambda: _job(ctl, jid)["state"] == "succeeded", 15, "job succeeds")
    r = runner.invoke(app, ["jobs", "list", *remote])
    assert r.exit_code == 0, r.output
    assert [j["state"] for j in json.loads(r.output)["jobs"] if j["id"] == jid] == ["succeeded"]
    r = runner.invoke(app, ["jobs", "show", jid, *remote])
    assert r.exit_code == 0 and json.loads(r.output)["attempts"][0]["outcome"] == "exit 0"
    assert set(json.loads(r.output)) == set(JobDetail.model_fields)  # as local show prints it
    r = runner.invoke(app, ["jobs", "logs", jid, *remote])
    assert r.exit_code == 0 and json.loads(r.output)["job"] == jid
    r = runner.invoke(app, ["jobs", "cancel", "999999", *remote])
    assert r.exit_code != 0 and "HTTP 404: job '999999' not found" in str(r.exception)
