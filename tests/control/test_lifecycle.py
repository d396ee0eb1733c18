"""Lifecycle transitions, remediation (auto-drain, circuit breaker, dry run), lost detection
and the controller's own downtime, with a manual clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select

from gpufleet.control.db.models import EventRow, Transition
from gpufleet.control.fleet import actions
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import Action, TransitionError
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.schedulers.base import NoScheduler
from tests.control.conftest import T0, batch, fail_finding, push

OP = Principal(7, "alice", Role.OPERATOR)


def states(svc: ControlService) -> dict[str, str]:
    return {n: c.state for n, c in svc.store.nodes.items()}


def history(svc: ControlService, node: str) -> list[tuple[str | None, str, str]]:
    with svc.store.sessions() as s:
        rows = s.scalars(select(Transition).where(Transition.node == node).order_by(Transition.id))
        return [(r.from_state, r.to_state, r.actor) for r in rows]


def events(svc: ControlService, kind: str) -> list[EventRow]:
    with svc.store.sessions() as s:
        return list(s.scalars(select(EventRow).where(EventRow.kind == kind)))


def test_registration_then_fail_finding_drains(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service(min_drain_s=5.0)
    hook = svc.scheduler  # no backend given: NoScheduler records the calls
    assert isinstance(hook, NoScheduler)
    for i in range(20):
        push(svc, batch(f"n{i:02d}", 1))
    assert set(states(svc).values()) == {"in_service"}
    assert history(svc, "n00") == [
        (None, "registering", "agent:agent-n00"),
        ("registering", "validating", "agent:agent-n00"),
        ("validating", "in_service", "agent:agent-n00"),
    ]
    push(svc, batch("n00", 2, devices=False, findings=[fail_finding("n00")], health=2))
    assert states(svc)["n00"] == "draining"
    assert svc.store.nodes["n00"].state_reason.startswith("finding XID_79")
    assert ("drain", "n00") in hook.calls
    clock.advance(2)
    push(svc, batch("n00", 3, devices=False, findings=[fail_finding("n00")], health=2))
    svc.tick()
    assert states(svc)["n00"] == "draining"  # min_drain_s = 5 not yet over
    clock.advance(4)
    for i in range(20):
        push(svc, batch(f"n{i:02d}", 10, devices=False))
    svc.tick()
    assert states(svc)["n00"] == "drained"
    # the drain's cause stays in the node's reason (the attention list shows only that one)
    reason = svc.store.nodes["n00"].state_reason
    assert reason.startswith("finding XID_79") and reason.endswith("(no work left on the node)")
    # operator: repair, validate; a posted validation result decides
    actions.node_action(svc.store, "n00", Action.REPAIR, OP, "replace GPU 0")
    actions.node_action(svc.store, "n00", Action.VALIDATE, OP)
    assert states(svc)["n00"] == "validating"  # fail finding still active (sticky)
    actions.post_validation(svc.store, {"node": "n00", "verdict": "fail"}, OP)
    assert states(svc)["n00"] == "repair"
    actions.node_action(svc.store, "n00", Action.ACKNOWLEDGE, OP)
    push(svc, batch("n00", 11, devices=False))  # the agent no longer reports it
    assert svc.store.nodes["n00"].findings == {}
    actions.post_validation(svc.store, {"node": "n00", "verdict": "pass", "summary": "ok"}, OP)
    assert states(svc)["n00"] == "in_service"
    assert history(svc, "n00")[-2:] == [
        ("repair", "validating", "operator:alice"),
        ("validating", "in_service", "operator:alice"),
    ]
    with pytest.raises(TransitionError):
        actions.node_action(svc.store, "n01", Action.VALIDATE, OP)  # in_service -> validating


def test_circuit_breaker_stops_drains(make_service: Callable[..., ControlService]) -> None:
    svc = make_service()
    for i in range(20):
        push(svc, batch(f"n{i:02d}", 1))
    for i in range(5):
        push(svc, batch(f"n{i:02d}", 2, devices=False, findings=[fail_finding(f"n{i:02d}")]))
    # at most max(1, floor(0.10 x 20)) = 2 out: drains at 0/20 and 1/20 out; at 2/20 a third
    # drain would make 3 > 2 out -> blocked (the breaker opened once the second node was out)
    assert [states(svc)[f"n{i:02d}"] for i in range(5)] == (["draining"] * 2 + ["in_service"] * 3)
    assert svc.store.breaker.open
    opened = events(svc, "circuit_breaker_open")
    assert len(opened) == 1 and "2/20" in opened[0].message
    assert len(events(svc, "remediation_blocked")) == 3


def test_a_breaker_opened_by_the_drain_budget_warns(
    make_service: Callable[..., ControlService],
) -> None:
    # issue 29: one drain on a 3-node fleet opened the breaker and paged "critical"; nothing
    # was lost beyond the policy's budget: the next failing node waits for a person
    svc = make_service()
    assert _fail_in_turn(svc, 3, 1) == ["draining"]
    (opened,) = events(svc, "circuit_breaker_open")
    assert opened.severity == 1 and opened.data["out"] == 1 and opened.data["allowed"] == 1


def test_a_breaker_opened_by_nodes_lost_beyond_the_budget_is_critical(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    svc._last_tick = clock()
    names = ["a", "b", "c", "d"]
    for name in names:
        push(svc, batch(name, 1))
    clock.advance(3.0)
    svc.tick()
    for k in range(2, 5):  # a and b fall silent together: lost in the same pass
        clock.advance(2.0)
        for name in ("c", "d"):
            push(svc, batch(name, k, devices=False))
        svc.tick()
    assert states(svc) == {"a": "lost", "b": "lost", "c": "in_service", "d": "in_service"}
    # the first loss used the budget (a warning); the second is 2 out where the policy lets
    # automation take 1: capacity went by itself, and the breaker says so again, louder
    opened = events(svc, "circuit_breaker_open")
    assert [(e.severity, e.data["out"], e.data["allowed"]) for e in opened] == [
        (1, 1, 1),
        (2, 2, 1),
    ]
    svc.tick()  # nothing new: not told again
    assert len(events(svc, "circuit_breaker_open")) == 2
    svc.ingest.stop()
    again = make_service()  # a restart finds the breaker open: nothing new to tell
    assert again.store.breaker.open
    again.tick()
    assert len(events(again, "circuit_breaker_open")) == 2


def _fail_in_turn(svc: ControlService, n: int, failing: int) -> list[str]:
    names = [f"n{i:02d}" for i in range(n)]
    for name in names:
        push(svc, batch(name, 1))
    for name in names[:failing]:
        push(svc, batch(name, 2, devices=False, findings=[fail_finding(name)]))
    return [states(svc)[name] for name in names[:failing]]


def test_breaker_floor_lets_a_small_fleet_drain_two(
    make_service: Callable[..., ControlService],
) -> None:
    # 4 nodes: floor(0.10 x 4) = 0, min_out_nodes 2 -> at most 2 out: 2 drained, the third not
    svc = make_service(policy=RemediationPolicy(min_out_nodes=2))
    assert _fail_in_turn(svc, 4, 3) == ["draining", "draining", "in_service"]
    assert svc.store.breaker.open and "2/4" in svc.store.breaker.message
    assert len(events(svc, "remediation_blocked")) == 1


def test_breaker_small_fleet_default_drains_one(
    make_service: Callable[..., ControlService],
) -> None:
    # 4 nodes, default min_out_nodes 1: max(1, 0) = 1 out allowed (as before the floor existed)
    svc = make_service()
    assert _fail_in_turn(svc, 4, 2) == ["draining", "in_service"]


def test_breaker_large_fleet_default(make_service: Callable[..., ControlService]) -> None:
    # 30 nodes: max(1, floor(0.10 x 30)) = 3 out allowed; the fourth failing node is blocked
    svc = make_service()
    assert _fail_in_turn(svc, 30, 4) == ["draining"] * 3 + ["in_service"]
    assert len(events(svc, "remediation_blocked")) == 1


def test_allowed_out_rule() -> None:
    from gpufleet.control.state.remediation import allowed_out

    # max(min_out_nodes, floor(fraction x nodes)), by hand
    assert allowed_out(4, 0.10, 1) == 1
    assert allowed_out(4, 0.10, 2) == 2
    assert allowed_out(30, 0.10, 1) == 3  # 0.1 x 30 is 3.0000000000000004 in floats
    assert allowed_out(29, 0.10, 1) == 2
    assert allowed_out(100, 0.25, 2) == 25
    assert allowed_out(10, 0.0, 0) == 0


def test_dry_run_records_only(make_service: Callable[..., ControlService]) -> None:
    svc = make_service(policy=RemediationPolicy(dry_run=True))
    push(svc, batch("a", 1))
    push(svc, batch("a", 2, devices=False, findings=[fail_finding("a")]))
    assert states(svc)["a"] == "in_service"
    ev = events(svc, "remediation_dry_run")
    assert len(ev) == 1 and "would drain" in ev[0].message


def test_policy_per_code(make_service: Callable[..., ControlService]) -> None:
    svc = make_service(policy=RemediationPolicy(auto_drain={"XID_*": False, "XID_79": True}))
    for n in ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"):
        push(svc, batch(n, 1))
    push(svc, batch("a", 2, devices=False, findings=[fail_finding("a", "XID_48")]))
    push(svc, batch("b", 2, devices=False, findings=[fail_finding("b", "XID_79")]))
    assert (states(svc)["a"], states(svc)["b"]) == ("in_service", "draining")


def test_lost_after_three_intervals(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    svc._last_tick = clock()
    push(svc, batch("quiet", 1))
    push(svc, batch("busy", 1))
    clock.advance(3.0)  # controller grace (3 x 2 s from start) still running
    svc.tick()
    for k in range(2, 5):
        clock.advance(2.0)
        push(svc, batch("busy", k, devices=False))
        svc.tick()
    # quiet: last heard at T0, now T0 + 9 s > 6 s
    assert states(svc) == {"quiet": "lost", "busy": "in_service"}
    reason = svc.store.nodes["quiet"].state_reason
    assert "no heartbeat" in reason and "3 x 2 s" in reason
    push(svc, batch("quiet", 2, devices=False))  # it comes back
    assert states(svc)["quiet"] == "in_service"
    assert [h[1] for h in history(svc, "quiet")][-2:] == ["validating", "in_service"]


def test_the_controllers_own_deaf_time_is_not_a_nodes_silence(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    """A starved controller (its event loop woke seconds late, `control.state.deafness`) cannot tell
    a silent node from one whose pushes wait unread: that span does not count toward lost
    (a restarted controller under the suite's load declared two pushing agents lost at once)."""
    svc = make_service()
    svc._last_tick = clock()
    push(svc, batch("quiet", 1))  # heartbeat interval 2 s: lost after 6 s of silence
    for _ in range(4):  # the loop ticks every 2 s (no gap of its own)
        clock.advance(2.0)
        if clock() - T0 == 6.0:
            svc.store.deaf.add(T0 + 1.0, T0 + 6.0)  # its event loop could not hear 1-6 s
        svc.tick()
    assert states(svc) == {"quiet": "in_service"}  # 8 s silent, of it 3 s heard
    for _ in range(2):
        clock.advance(2.0)
        svc.tick()
    assert states(svc) == {"quiet": "lost"}  # 12 s silent, 7 s of it heard
    reason = svc.store.nodes["quiet"].state_reason
    assert "no heartbeat for 12.0 s" in reason and "5.0 s of it deaf here" in reason, reason


def test_a_draining_node_back_from_lost_keeps_its_drain_reason(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    """A faulted node that went quiet under load came back draining with the reason
    'heartbeats resumed': why it was out of service was gone (the CI failure of
    test_sim_fleet_pushes_and_fault_drains). Twice lost, the reason does not stack."""
    svc = make_service(min_drain_s=1000.0)
    svc._last_tick = clock()
    push(svc, batch("n1", 1))
    push(svc, batch("n1", 2, devices=False, findings=[fail_finding("n1")], health=2))
    assert states(svc)["n1"] == "draining"
    drain_reason = svc.store.nodes["n1"].state_reason
    assert drain_reason.startswith("finding XID_79")
    for seq in (3, 4):
        for _ in range(6):  # 12 s quiet, over 3 x 2 s and the start's grace; ticks 2 s apart
            clock.advance(2.0)
            svc.tick()
        assert states(svc)["n1"] == "lost"
        push(svc, batch("n1", seq, devices=False, findings=[fail_finding("n1")], health=2))
        assert states(svc)["n1"] == "draining"
        reason = svc.store.nodes["n1"].state_reason
        assert reason == f"{drain_reason}; heartbeats resumed (agent agent-n1)", reason


def test_controller_outage_is_not_node_loss(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    svc._last_tick = clock()
    for n in ("a", "b"):
        push(svc, batch(n, 1))
    clock.advance(60.0)  # the controller's loop did not run for a minute
    svc.tick()
    assert states(svc) == {"a": "in_service", "b": "in_service"}
    assert len(events(svc, "controller_gap")) == 1
    # agents catch up (buffered batches), node b stays silent
    push(svc, batch("a", 2, devices=False, t=T0 + 30))
    clock.advance(5.0)
    svc.tick()
    assert states(svc) == {"a": "in_service", "b": "in_service"}
    # b's grace after the gap: 3 x 2 s, plus its agent's worst retry delay (a 5 s attempt
    # timing out, then a backoff capped at its 2 s interval) plus one 2 s push: 15 s
    for k in (3, 4, 5):  # 14 s after the gap (ticks closer than the 5 s stall threshold)
        clock.advance(3.0)
        push(svc, batch("a", k, devices=False))
        svc.tick()
    assert states(svc) == {"a": "in_service", "b": "in_service"}
    clock.advance(2.0)  # 16 s
    push(svc, batch("a", 6, devices=False))
    svc.tick()
    assert states(svc) == {"a": "in_service", "b": "lost"}


def test_restart_gives_grace(tmp_path: object, clock: ManualClock) -> None:
    from pathlib import Path

    data = Path(str(tmp_path)) / "d"
    policy = RemediationPolicy(require_validation=False)  # about grace, not the gate
    svc = ControlService(ServiceConfig(data_dir=data, policy=policy), clock=clock)
    svc.ingest.start()
    push(svc, batch("a", 1))
    svc.ingest.stop()
    svc.engine.dispose()
    clock.advance(60.0)  # controller down for a minute, then restarted
    svc2 = ControlService(ServiceConfig(data_dir=data, policy=policy), clock=clock)
    svc2.ingest.start()
    try:
        svc2.tick()
        assert states(svc2) == {"a": "in_service"}
        # its grace: 3 x 2 s, plus the agent's worst retry delay (an attempt timing out after
        # 5 s, then a backoff capped at the 2 s interval) plus one 2 s push interval: 15 s
        for _ in range(14):
            clock.advance(1.0)
            svc2.tick()
        assert states(svc2) == {"a": "in_service"}  # 14 s of its 15 s grace
        clock.advance(2.0)
        svc2.tick()
        assert states(svc2) == {"a": "lost"}
    finally:
        svc2.ingest.stop()
        svc2.engine.dispose()


def test_validation_gates_service_by_default(tmp_path: object, clock: ManualClock) -> None:
    """Issue 14 item 9: with the controller's default policy a new node waits in validating
    however healthy its reports, a failing level 1 sends it to repair with the failing checks
    as the reason, and only a pass puts it (back) in service."""
    from pathlib import Path

    svc = ControlService(ServiceConfig(data_dir=Path(str(tmp_path)) / "d"), clock=clock)
    svc.ingest.start()
    try:
        assert svc.store.policy.require_validation is True
        for seq in range(1, 4):
            push(svc, batch("a", seq, devices=seq == 1))
            clock.advance(2.0)
        assert states(svc) == {"a": "validating"}
        agent = Principal(None, "agent-a", Role.AGENT, node="a")
        why = "level 1 by the agent: ecc GPU 3: ECC is disabled"
        actions.post_validation(svc.store, {"node": "a", "verdict": "fail", "summary": why}, agent)
        assert states(svc) == {"a": "repair"}
        assert svc.store.nodes["a"].state_reason == f"validation result: fail ({why})"
        push(svc, batch("a", 4, devices=False))
        assert states(svc) == {"a": "repair"}  # healthy reports do not end a repair
        actions.node_action(svc.store, "a", Action.VALIDATE, OP, "GPU 3 replaced")
        push(svc, batch("a", 5, devices=False))
        assert states(svc) == {"a": "validating"}
        actions.post_validation(svc.store, {"node": "a", "verdict": "pass"}, agent)
        assert states(svc) == {"a": "in_service"}
        assert [h[:2] for h in history(svc, "a")] == [
            (None, "registering"),
            ("registering", "validating"),
            ("validating", "repair"),
            ("repair", "validating"),
            ("validating", "in_service"),
        ]
    finally:
        svc.ingest.stop()
        svc.engine.dispose()
