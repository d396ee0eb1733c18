"""A campaign's ``validate_level`` 2 on the controller (issue 15): the node's ``Ack`` asks its
agent for level 2, a level-1 pass does not put the node back in service, a level-2 pass does,
and a level-2 fail sends it to repair with the failing check as the campaign's reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.control.campaigns import ops
from gpufleet.control.fleet import actions
from gpufleet.control.state.auth import Principal, Role
from gpufleet.devices.sim import ManualClock
from tests.maintenance.test_campaign_engine import OP, POLICY, T0, Fleet, make, run, spec

pytestmark = pytest.mark.process


def test_level_2_is_asked_in_the_ack_and_only_level_2_passes(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    gated = POLICY.model_copy(update={"require_validation": True})
    svc = make(tmp_path, clock, gated)
    fleet = Fleet(svc, clock, ["a", "b", "c", "d"])
    fleet.heartbeat_all()
    for n in fleet.version:
        actions.post_validation(svc.store, {"node": n, "verdict": "pass"}, OP)
    cid = ops.start(svc.store, spec(batch=1, max_failures=3, floor=0.5, validate_level=2), OP)
    asked: dict[str, int | None] = {}
    level1_refused: set[str] = set()
    for _ in range(150):
        run(svc, fleet, steps=1)
        for n, v in svc.store.view.nodes.items():
            if v.state != "validating":
                continue
            asked[n] = ops.validation_level(svc.store, n)
            agent = Principal(None, "agent", Role.AGENT, node=n)
            if n not in level1_refused:  # an agent that ran its level 1 only
                actions.post_validation(svc.store, {"node": n, "verdict": "pass"}, agent)
                assert svc.store.view.nodes[n].state == "validating"
                level1_refused.add(n)
                continue
            verdict = "fail" if n == "a" else "pass"
            body = {"node": n, "verdict": verdict, "level": 2, "summary": "memory GPU 1: 3 bad"}
            actions.post_validation(svc.store, body, agent)
        if ops.status(svc.store, cid)["state"] != "running":
            break
    st = ops.status(svc.store, cid)
    steps = {n["node"]: n for n in st["nodes"]}
    assert asked == dict.fromkeys("abcd", 2), (st["nodes"], st["by_step"])
    assert steps["a"]["step"] == "failed" and "memory GPU 1" in steps["a"]["reason"]
    assert {steps[n]["step"] for n in "bcd"} == {"done"}
    assert svc.store.view.nodes["a"].state == "repair"
    assert json.dumps(st)  # the status stays JSON
