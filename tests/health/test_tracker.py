"""Stickiness, acknowledgements (logged, persisted, re-fire is new), verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.devices.sim import FaultKind
from gpufleet.errors import UsageError
from gpufleet.health import (
    FileAckStore,
    GpuHealthInput,
    HealthTracker,
    NodeHealthInput,
    RuleParams,
)
from gpufleet.health.acks import Acknowledgement
from gpufleet.health.registry import RULES, Rule
from gpufleet.health.types import Finding, Severity

from .rig import Rig, codes, find


def test_ack_clears_logs_who_why_and_same_occurrence_stays_quiet() -> None:
    rig = Rig()
    rig.inject(FaultKind.ECC_DBE, gpu=1)
    first = find(rig.run(2), "ECC_DBE_VOLATILE")
    t_first = first.first_seen_s
    rig.run(3)
    ack = rig.tracker.acknowledge("ECC_DBE_VOLATILE", rig.uuids[1], "alice", "reset planned")
    assert (ack.who, ack.why, ack.at_s) == ("alice", "reset planned", rig.clock())
    log = rig.tracker.acknowledgements()
    assert [(a.code, a.component, a.who, a.why) for a in log] == [
        ("ECC_DBE_VOLATILE", rig.uuids[1], "alice", "reset planned")
    ]
    report = rig.run(5)  # the volatile count is still 1: the same occurrence
    assert "ECC_DBE_VOLATILE" not in codes(report)
    assert "ECC_DBE_VOLATILE" in [c.code for c in report.cleared]
    # a new DBE is a new occurrence: a new finding, first seen now
    rig.inject(FaultKind.ECC_DBE, gpu=1)
    again = find(rig.run(2), "ECC_DBE_VOLATILE")
    assert again.evidence["ecc_dbe_volatile"] == 2
    assert again.first_seen_s > t_first + 9


def test_refire_after_the_condition_left_is_a_new_finding() -> None:
    rig = Rig()
    rig.inject(FaultKind.ROW_REMAP_FAILURE, gpu=0, duration_s=3)
    rig.inject(FaultKind.ROW_REMAP_FAILURE, gpu=0, at_s=20, duration_s=3)
    f1 = find(rig.run(2), "ROW_REMAP_FAILURE")
    rig.tracker.acknowledge("ROW_REMAP_FAILURE", rig.uuids[0], "bob", "looked at it")
    assert "ROW_REMAP_FAILURE" not in codes(rig.run(5))
    f2 = find(rig.run(15), "ROW_REMAP_FAILURE")
    assert f2.first_seen_s > f1.first_seen_s


def test_acknowledging_a_non_sticky_or_absent_finding_is_refused() -> None:
    rig = Rig()
    rig.inject(FaultKind.PERSISTENCE_OFF, gpu=0)
    rig.run(1)
    with pytest.raises(UsageError, match="no active sticky finding"):
        rig.tracker.acknowledge("PERSISTENCE_MODE_OFF", rig.uuids[0], "a", "b")
    with pytest.raises(UsageError, match="who and why"):
        rig.tracker.acknowledge("PERSISTENCE_MODE_OFF", rig.uuids[0], "a", " ")


def test_file_store_persists_sticky_findings_and_acks_across_restarts(tmp_path: Path) -> None:
    rig = Rig(store=FileAckStore(tmp_path))
    rig.inject(FaultKind.XID, gpu=3, xid=79)
    f = find(rig.run(2), "XID_79")
    # a restarted agent (new tracker, same state dir) still reports it although the event
    # will never be delivered again
    rig.tracker = HealthTracker(clock=rig.clock, store=FileAckStore(tmp_path))
    restarted = rig.run(1)
    again = find(restarted, "XID_79")
    assert again.first_seen_s == f.first_seen_s
    # another process (gpufleet health ack) appends to the log; the running tracker reads it
    other = FileAckStore(tmp_path)
    other.append(
        Acknowledgement(
            code="XID_79",
            component=rig.uuids[3],
            who="carol",
            why="node rebooted",
            at_s=rig.clock(),
            node="sim-00",
            occurrence=f.occurrence,
            id="x1",
        )
    )
    assert "XID_79" not in codes(rig.run(1))
    lines = (tmp_path / "health-acks.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["who"] == "carol" and json.loads(lines[0])["why"] == "node rebooted"
    rig.tracker = HealthTracker(clock=rig.clock, store=FileAckStore(tmp_path))
    assert "XID_79" not in codes(rig.run(1))  # acknowledged stays acknowledged after restart


def test_no_data_is_unknown_and_gpu_verdicts_follow_findings() -> None:
    tracker = HealthTracker(clock=lambda: 100.0)
    empty = tracker.evaluate(NodeHealthInput(node="n"))
    assert empty.verdict == Severity.UNKNOWN and empty.gpu_verdicts == {}
    tracker2 = HealthTracker(clock=lambda: 100.0)
    blind = tracker2.evaluate(NodeHealthInput(node="n", gpus=(GpuHealthInput(index=0),)))
    assert blind.verdict == Severity.UNKNOWN and blind.gpu_verdicts == {"gpu0": Severity.UNKNOWN}
    rig = Rig()
    rig.inject(FaultKind.PERSISTENCE_OFF, gpu=0)
    rig.inject(FaultKind.ECC_DBE, gpu=1)
    report = rig.run(2)
    assert report.gpu_verdicts[rig.uuids[0]] == Severity.WARN
    assert report.gpu_verdicts[rig.uuids[1]] == Severity.FAIL
    assert report.gpu_verdicts[rig.uuids[2]] == Severity.OK
    assert report.verdict == Severity.FAIL
    assert report.findings[0].severity == Severity.FAIL  # worst first
    d = report.to_dict()
    assert d["verdict"] == "fail" and d["gpu_verdicts"][rig.uuids[0]] == "warn"


def test_one_tracker_per_node() -> None:
    tracker = HealthTracker(clock=lambda: 1.0)
    tracker.evaluate(NodeHealthInput(node="a"))
    with pytest.raises(UsageError, match="one tracker per node"):
        tracker.evaluate(NodeHealthInput(node="b"))


def test_a_broken_rule_is_reported_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(ctx: object, p: object) -> list[Finding]:
        raise RuntimeError("boom")

    monkeypatch.setitem(RULES, "broken", Rule("broken", "node", "test", True, RuleParams, broken))
    rig = Rig()
    rig.inject(FaultKind.PERSISTENCE_OFF, gpu=0)
    report = rig.run(1)
    assert report.errors == ("broken: RuntimeError: boom",)
    assert "PERSISTENCE_MODE_OFF" in codes(report)
