"""Placement never uses a broken node, whatever the circuit breaker says (issue 12, item 4).

A real controller (embedded scheduler) and the real agents of four simulated nodes. With the
breaker open, XID 79 on n1 leaves it in service (its drain is blocked) with a fail finding and
one healthy GPU: new jobs and requeued jobs must never land there, the API says "drain blocked
by circuit breaker" as its reason, and once the breaker closes the controller drains it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.testing.testbed import Agents, Controller, wait_for
from tests.integration.conftest import embedded

pytestmark = pytest.mark.process


Bed = Callable[..., tuple[Controller, Agents]]
BLOCKED = "drain blocked by circuit breaker"


def _node(ctl: Controller, name: str) -> dict[str, Any]:
    return dict(ctl.call("GET", f"/api/v1/nodes/{name}").json()["node"])


def _never_on(agents: Agents, node: str, jids: list[str], for_s: float) -> None:
    """For ``for_s`` seconds, no copy of these jobs runs on ``node``."""
    end = time.monotonic() + for_s
    while time.monotonic() < end:
        on = [c for c in agents.running_copies() if c[0] in jids and c[2] == node]
        assert not on, f"placed on the broken node {node}: {on}"
        time.sleep(0.05)


def _policy(ctl: Controller, fraction: float) -> None:
    body = {"max_out_fraction": fraction, "min_out_nodes": 1}
    r = ctl.call("PUT", "/api/v1/policy", json=body)
    assert r.status_code == 200, r.text


def test_breaker_open_keeps_jobs_off_a_failing_node_and_drains_it_once_closed(bed: Bed) -> None:
    ctl, agents = bed(nodes=["n1", "n2", "n3", "n4"])
    wait_for(lambda: len(embedded(ctl).store.nodes()) == 4, 15, "agents report")
    wait_for(
        lambda: all(_node(ctl, n)["state"] == "in_service" for n in ("n1", "n2", "n3", "n4")),
        15,
        "nodes in service",
    )
    _policy(ctl, 0.0)  # at most one node out (min_out_nodes 1)
    r = ctl.call("POST", "/api/v1/nodes/n4/actions/drain", json={"reason": "maintenance"})
    assert r.status_code == 200, r.text
    summary = ctl.call("GET", "/api/v1/summary").json()
    assert summary["remediation"]["circuit_open"], summary["remediation"]

    agents.inject_xid79("n1", 0)  # GPU 1 of n1 still looks free to a naive placement
    n1 = wait_for(lambda: (n := _node(ctl, "n1"))["findings_fail"] > 0 and n, 10, "XID found")
    time.sleep(1.0)  # the drain would have happened by now
    n1 = _node(ctl, "n1")
    assert n1["state"] == "in_service" and n1["reason"] == BLOCKED

    # new jobs: 5 single-GPU jobs, 4 free GPUs on n2+n3; the fifth must wait, not take n1's
    body = {"command": ["sim"], "gpus": 1, "duration_s": 600}
    jids = [
        ctl.call("POST", "/api/v1/jobs", json={**body, "name": f"j{i}"}).json()["id"]
        for i in range(5)
    ]
    wait_for(lambda: len(agents.running_copies()) == 4, 10, "four jobs running")
    _never_on(agents, "n1", jids, 2.0)
    waiting = [j for j in jids if ctl.call("GET", f"/api/v1/jobs/{j}").json()["state"] == "queued"]
    assert len(waiting) == 1

    # requeued jobs: n3 fails (an operator action), its two jobs are requeued; room only on n1
    r = ctl.call("POST", "/api/v1/nodes/n3/actions/fail", json={"reason": "PSU"})
    assert r.status_code == 200, r.text
    wait_for(
        lambda: sum(ctl.call("GET", f"/api/v1/jobs/{j}").json()["requeues"] for j in jids) == 2,
        10,
        "n3's jobs requeued",
    )
    _never_on(agents, "n1", jids, 2.0)

    # the breaker closes: the blocked drain happens, and n1's reason is no longer the block
    _policy(ctl, 1.0)
    n1 = wait_for(
        lambda: (n := _node(ctl, "n1"))["state"] in ("draining", "drained") and n,
        10,
        "blocked drain retried",
    )
    assert n1["reason"] != BLOCKED and "circuit breaker closed" in n1["state_reason"]
