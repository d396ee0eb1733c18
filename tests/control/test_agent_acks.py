"""Acknowledgements handed back to the agent: the wire model (``WireAck``, ``Ack.acks``) and the
controller's per-node list (acknowledged sticky findings the agent still reports), through the
API, the lifecycle ``acknowledge`` action, a controller restart and the agent dropping them.

Expected values are written by hand from the inputs of each test (actor names are
``<role>:<token name>``, see ``Principal.actor``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from gpufleet.agent.jobs import AgentJobs
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.control.api.ingest_http import handle_ingest
from gpufleet.control.db.models import FindingRow
from gpufleet.control.fleet import actions
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import Action
from gpufleet.devices.sim import Fault, FaultKind, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.health.acks import FileAckStore
from gpufleet.health.types import Severity
from gpufleet.wire import Ack, WireAck, WireCommand
from tests.control.conftest import T0, batch, fail_finding, push

OP = Principal(7, "alice", Role.OPERATOR)
BOB = Principal(8, "bob", Role.OPERATOR)
DBE_CODE = "ECC_DBE_VOLATILE"


def warn_finding(node: str, code: str = "ECC_SBE_RATE") -> dict[str, Any]:
    return {
        "rule": "sbe_rate",
        "code": code,
        "severity": 1,
        "component": f"GPU-{node}-1",
        "message": "corrected errors climbing",
        "sticky": False,
        "gpu_index": 1,
    }


def finding_id(svc: ControlService, node: str, code: str) -> int:
    with svc.store.sessions() as s:
        row = s.scalars(
            select(FindingRow).where(FindingRow.node == node, FindingRow.code == code)
        ).one()
        return row.id


def row(svc: ControlService, fid: int) -> FindingRow:
    with svc.store.sessions() as s:
        r = s.get(FindingRow, fid)
        assert r is not None
        return r


# ----- the wire model -----------------------------------------------------------------------
def test_ack_without_acks_parses_as_before_and_acks_round_trip() -> None:
    old = Ack.model_validate_json(b'{"agent_id": "a", "seq": 3, "duplicate": false}')
    assert old.acks == [] and old.commands == []
    a = WireAck(code="ECC_DBE_VOLATILE", component="GPU-x", who="operator:alice", why="r", at_s=5)
    back = Ack.model_validate_json(Ack(agent_id="a", seq=4, acks=[a]).model_dump_json())
    assert back.acks == [a] and back.acks[0].at_s == 5.0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"who": ""}, "who"),
        ({"why": ""}, "why"),
        ({"code": "X" * 65}, "code"),
        ({"extra": 1}, "extra"),
    ],
)
def test_wire_ack_rejects_bad_fields_naming_them(change: dict[str, Any], field: str) -> None:
    doc = {"code": "XID_79", "component": "GPU-0", "who": "w", "why": "y", "at_s": 1.0}
    with pytest.raises(ValidationError) as exc:
        WireAck.model_validate({**doc, **change})
    assert exc.value.errors()[0]["loc"] == (field,)


# ----- the controller's per-node list -------------------------------------------------------
def test_acknowledged_sticky_finding_rides_every_ack_until_the_agent_drops_it(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    push(svc, batch("n1", 1))
    both = [fail_finding("n1"), warn_finding("n1")]
    first = push(svc, batch("n1", 2, devices=False, findings=both, health=2))
    assert first.acks == []  # nothing acknowledged yet
    xid = finding_id(svc, "n1", "XID_79")
    sbe = finding_id(svc, "n1", "ECC_SBE_RATE")
    clock.advance(10)
    actions.acknowledge_finding(svc.store, xid, OP)
    actions.acknowledge_finding(svc.store, sbe, OP)  # not sticky: the agent clears it itself
    expect = WireAck(
        code="XID_79",
        component="GPU-n1-0",
        who="operator:alice",
        why="acknowledged on the control plane by operator:alice",
        at_s=T0 + 10,
    )
    for seq in (3, 4):
        ack = push(svc, batch("n1", seq, devices=False, findings=both, health=2))
        assert ack.acks == [expect]
    dup = push(svc, batch("n1", 4, devices=False, findings=both, health=2))
    assert dup.duplicate and dup.acks == [expect]  # a replayed answer carries it too
    assert row(svc, xid).active  # acknowledged but still reported: still active
    assert push(svc, batch("n2", 1)).acks == []  # another node's agent gets nothing
    clock.advance(1)
    gone = push(svc, batch("n1", 5, devices=False, findings=[warn_finding("n1")], health=1))
    assert gone.acks == []
    r = row(svc, xid)
    assert not r.active and r.cleared_s == T0 + 11
    assert push(svc, batch("n1", 6, devices=False, health=0)).acks == []


def test_lifecycle_acknowledge_sends_the_reason_given(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    push(svc, batch("n1", 1))
    two = [fail_finding("n1", "XID_79", 0), fail_finding("n1", "XID_48", 1)]
    push(svc, batch("n1", 2, devices=False, findings=two, health=2))
    clock.advance(3)
    actions.node_action(svc.store, "n1", Action.ACKNOWLEDGE, BOB, "GPU reset; DBE counter zero")
    ack = push(svc, batch("n1", 3, devices=False, findings=two, health=2))
    got = sorted((a.code, a.component, a.who, a.why, a.at_s) for a in ack.acks)
    assert got == [
        ("XID_48", "GPU-n1-1", "operator:bob", "GPU reset; DBE counter zero", T0 + 3),
        ("XID_79", "GPU-n1-0", "operator:bob", "GPU reset; DBE counter zero", T0 + 3),
    ]
    # without a reason: the default text naming the operator
    push(svc, batch("n1", 4, devices=False, findings=[two[0]], health=2))  # XID_48 cleared
    actions.node_action(svc.store, "n1", Action.ACKNOWLEDGE, OP)
    ack = push(svc, batch("n1", 5, devices=False, findings=[two[0]], health=2))
    assert [(a.code, a.who, a.why) for a in ack.acks] == [
        ("XID_79", "operator:alice", "acknowledged on the control plane by operator:alice")
    ]


def test_acks_survive_a_controller_restart(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    for n in ("n1", "n2"):
        push(svc, batch(n, 1))
        push(svc, batch(n, 2, devices=False, findings=[fail_finding(n)], health=2))
    clock.advance(7)
    actions.acknowledge_finding(svc.store, finding_id(svc, "n1", "XID_79"), OP)
    actions.node_action(svc.store, "n2", Action.ACKNOWLEDGE, BOB, "riser reseated")
    svc.ingest.stop()
    svc.engine.dispose()
    again = make_service()  # same database, a fresh cache built from the finding rows
    got = {}
    for n in ("n1", "n2"):
        ack = push(again, batch(n, 3, devices=False, findings=[fail_finding(n)], health=2))
        got[n] = [(a.code, a.component, a.who, a.why, a.at_s) for a in ack.acks]
    assert got == {
        "n1": [
            (
                "XID_79",
                "GPU-n1-0",
                "operator:alice",
                "acknowledged on the control plane by operator:alice",
                T0 + 7,
            )
        ],
        "n2": [("XID_79", "GPU-n2-0", "operator:bob", "riser reseated", T0 + 7)],
    }
    assert push(again, batch("n1", 4, devices=False, health=0)).acks == []
    assert not row(again, finding_id(again, "n1", "XID_79")).active


def test_a_finding_already_gone_is_cleared_not_sent(
    make_service: Callable[..., ControlService],
) -> None:
    svc = make_service()
    push(svc, batch("n1", 1))
    push(svc, batch("n1", 2, devices=False, findings=[fail_finding("n1")], health=2))
    push(svc, batch("n1", 3, devices=False, health=0))  # sticky: stays active, not present
    fid = finding_id(svc, "n1", "XID_79")
    assert row(svc, fid).active
    actions.acknowledge_finding(svc.store, fid, OP)
    assert not row(svc, fid).active
    assert push(svc, batch("n1", 4, devices=False, health=0)).acks == []


def test_ingest_answer_omits_empty_acks_and_lists_them_as_json(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    token = svc.store.tokens.create("agent")[0]

    def post(body: dict[str, Any]) -> dict[str, Any]:
        raw = json.dumps(body).encode()
        reply = asyncio.run(handle_ingest(svc, f"Bearer {token}", None, raw))
        assert reply.status == 200
        out: dict[str, Any] = json.loads(reply.body)
        return out

    f = [fail_finding("n1")]
    assert post(batch("n1", 1, findings=f, health=2)) == {
        "agent_id": "agent-n1",
        "seq": 1,
        "duplicate": False,
    }
    clock.advance(2)
    actions.acknowledge_finding(svc.store, finding_id(svc, "n1", "XID_79"), OP)
    doc = post(batch("n1", 2, devices=False, findings=f, health=2))
    assert doc["acks"] == [
        {
            "code": "XID_79",
            "component": "GPU-n1-0",
            "who": "operator:alice",
            "why": "acknowledged on the control plane by operator:alice",
            "at_s": T0 + 2,
        }
    ]
    assert Ack.model_validate(doc).acks[0].who == "operator:alice"  # what the agent parses


# ----- the agent's side, without a controller -------------------------------------------------
class _Jobs:
    """Records the commands handed to the jobs runner (the part of AgentJobs on_ack uses)."""

    def __init__(self) -> None:
        self.applied: list[list[WireCommand]] = []

    def apply(self, commands: list[WireCommand]) -> None:
        self.applied.append(list(commands))

    def report(self) -> None:
        return None


def test_agent_applies_acks_and_job_commands_from_one_ack(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    fleet = SimFleet(parse_fleet_spec("1x2xh100"), clock=clock)
    fleet.inject(Fault(FaultKind.ECC_DBE, node="sim-00", gpu=1, at_s=0.5))
    cfg = AgentConfig(controller="http://127.0.0.1:9", token="t", state_dir=tmp_path)
    agent = Agent(fleet.node("sim-00").backend(), cfg, clock=clock)
    jobs = _Jobs()
    agent.enable_jobs(cast(AgentJobs, jobs))
    try:
        for _ in range(3):
            clock.advance(1)
            agent.tick()
        fleet.node("sim-00").gpus[1].ecc_dbe_volatile = 0
        clock.advance(1)
        agent.tick()
        codes = {f.code for f in agent.health.findings}
        assert DBE_CODE in codes and agent.health.verdict == Severity.FAIL  # sticky
        comp = next(f.component for f in agent.health.findings if f.code == DBE_CODE)
        others = [(f.code, f.component) for f in agent.health.findings if f.code != DBE_CODE]
        kill = WireCommand(op="kill", job_id="j1", generation=2)
        acks = [
            WireAck(code=c, component=k, who="operator:alice", why="reset", at_s=T0)
            for c, k in [(DBE_CODE, comp), *others, ("XID_79", "GPU-gone")]  # last: not active
        ]
        assert agent.pusher is not None and agent.pusher.on_ack is not None
        agent.pusher.on_ack(Ack(agent_id="a", seq=9, commands=[kill], acks=acks))
        assert jobs.applied == [[kill]]  # the jobs runner still gets its commands
        clock.advance(1)
        agent.tick()
        after = agent.health  # a new outcome
        assert after.findings == () and after.verdict == Severity.OK
        assert agent.acks_applied == len(acks) - 1  # the inactive one is ignored
        log = FileAckStore(tmp_path).read_all()
        assert {(a.code, a.who, a.why) for a in log} == {
            (a.code, "operator:alice", "reset") for a in acks[:-1]
        }
        # the same acks again (the controller repeats them until the snapshot drops them)
        agent.pusher.on_ack(Ack(agent_id="a", seq=10, acks=acks))
        clock.advance(1)
        agent.tick()
        assert agent.acks_applied == len(FileAckStore(tmp_path).read_all()) == len(acks) - 1
        assert jobs.applied == [[kill], []]
    finally:
        agent.close()


def test_agents_ignore_unknown_ack_fields() -> None:
    """Forward compatibility: an answer with a field this agent does not know still parses."""
    from gpufleet.wire import Ack

    ack = Ack.model_validate_json('{"agent_id": "a", "seq": 3, "future_field": [1, 2]}')
    assert (ack.agent_id, ack.seq, ack.commands, ack.acks) == ("a", 3, [], [])
