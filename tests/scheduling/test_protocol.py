"""The one scheduler protocol: the registry the CLI uses, capabilities, and the embedded backend
inside a real control service (SQLite, the ingest writer, the lifecycle's scheduler thread)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.schedulers.base import (
    Capabilities,
    Capability,
    Feature,
    JobSpec,
    JobState,
    NoScheduler,
    UnsupportedFeature,
)
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.schedulers.registry import make_scheduler, scheduler_names
from gpufleet.wire import Batch
from tests.control.conftest import T0, batch, fail_finding, push
from tests.scheduling.protocol import assert_protocol


def test_registry_names_and_unknown_name() -> None:
    assert scheduler_names() == ["embedded", "slurm", "kubernetes", "none"]
    assert isinstance(make_scheduler("embedded"), EmbeddedBackend)
    assert isinstance(make_scheduler("none"), NoScheduler)
    with pytest.raises(UsageError) as ei:
        make_scheduler("pbs")
    msg = str(ei.value)
    assert "--scheduler 'pbs'" in msg and "embedded, slurm, kubernetes, none" in msg


def test_no_scheduler_answers_the_protocol() -> None:
    none = assert_protocol(NoScheduler(), "none")
    assert none.is_idle("n1")
    with pytest.raises(UnsupportedFeature, match="--scheduler none"):
        none.list_jobs()


def test_capabilities_require_and_check_spec_name_the_field() -> None:
    caps = Capabilities(
        "x", [Capability(Feature.SUBMIT, True), Capability(Feature.MIG, False, "no slices")]
    )
    caps.check_spec(JobSpec(name="ok", command=("true",)))
    with pytest.raises(UnsupportedFeature) as ei:
        caps.check_spec(JobSpec(name="m", command=("true",), mig_profile="1g.10gb"))
    assert "mig_profile" in str(ei.value) and "no slices" in str(ei.value)
    with pytest.raises(UnsupportedFeature, match="nodes"):  # not listed: unsupported
        caps.check_spec(JobSpec(name="two", command=("true",), nodes=2))


def _jobs_batch(node: str, seq: int, copies: list[dict[str, object]] | None = None) -> Batch:
    return Batch.model_validate(
        {
            "node": node,
            "agent_id": f"agent-{node}",
            "seq": seq,
            "sent_at_s": T0,
            "jobs": {
                "lease_s": 30,
                "slots": [
                    {"index": g, "model": "h100-sxm", "memory_bytes": 80 << 30} for g in (0, 1)
                ],
                "copies": copies or [],
            },
        }
    )


# these tests push hand-built batches: no agent validates, so the gate into service is off
UNGATED = RemediationPolicy(require_validation=False)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = ControlService(
        ServiceConfig(data_dir=tmp_path / "data", tick_s=60.0, policy=UNGATED),
        clock=ManualClock(T0),
        scheduler=EmbeddedBackend(tick_s=60.0),  # ticked by hand below
    )
    svc.start()
    yield svc
    svc.stop()


def test_embedded_in_the_service_fail_drain_requeues(service: ControlService) -> None:
    backend = service.scheduler
    assert isinstance(backend, EmbeddedBackend)
    assert_protocol(backend, "embedded")
    for i, node in enumerate(("n1", "n2")):
        push(service, batch(node, 1))
        assert service.store.nodes[node].state == "in_service"
        assert backend.exchange(_jobs_batch(node, 1), T0 + i) == []  # joins the scheduler
    assert {n.name: n.schedulable for n in backend.node_states()} == {"n1": True, "n2": True}
    jid = backend.submit(JobSpec(name="t", command=("sim",), gpus=2, max_restarts=1))
    backend.tick()
    job = backend.job(jid)
    node = job.nodes[0]
    assert job.state is JobState.STARTING and not backend.is_idle(node)
    cmds = backend.exchange(_jobs_batch(node, 2), T0)
    assert [(c.op, c.job_id) for c in cmds] == [("start", jid)]
    copy = {"job_id": jid, "generation": cmds[0].generation, "running": True}
    backend.exchange(_jobs_batch(node, 3, [copy]), T0)
    backend.tick()
    assert backend.job(jid).state is JobState.RUNNING
    # a fail finding drains the node through the lifecycle; the scheduler thread moves the job
    push(service, batch(node, 2, devices=False, findings=[fail_finding(node)], health=2))
    assert service.store.nodes[node].state == "draining"
    assert service.events.flush()
    assert ("fail", node, "ok") in service.events.done
    moved = backend.job(jid)
    assert moved.state is JobState.REQUEUED and node in moved.reason
    assert (moved.requeues, moved.restarts) == (1, 0)
    # its copy still runs until the agent confirms the kill: the node is not idle before that
    assert not backend.is_idle(node)
    ended = {**copy, "running": False, "reason": "killed", "fenced": True}
    backend.exchange(_jobs_batch(node, 4, [ended]), T0)
    assert backend.is_idle(node)
    assert backend.attempts(jid)[0].outcome.startswith("requeued")


class _FlakyDrain(NoScheduler):
    """A scheduler whose drain fails while ``failing`` is set (scontrol down, API refusing)."""

    name = "flaky"

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.drains = 0

    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        self.drains += 1
        if self.failing:
            raise GpufleetError("scontrol: Unable to contact slurm controller")
        super().drain(node, reason, fail=fail)


def test_a_drain_the_scheduler_refused_never_completes_and_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpufleet.control.jobs.events as scheduling

    monkeypatch.setattr(scheduling, "RETRY_DRAIN_S", 0.0)
    flaky = _FlakyDrain()
    svc = ControlService(
        ServiceConfig(data_dir=tmp_path / "data", tick_s=60.0, min_drain_s=0.0, policy=UNGATED),
        clock=ManualClock(T0),
        scheduler=flaky,
    )
    svc.start()
    try:
        for node in ("n1", "n2"):
            push(svc, batch(node, 1))
        push(svc, batch("n1", 2, devices=False, findings=[fail_finding("n1")], health=2))
        assert svc.store.nodes["n1"].state == "draining"
        for _ in range(3):  # the backend refuses: the node still takes work there
            assert svc.events.flush()
            svc.store.check_nodes()
            assert svc.store.view.nodes["n1"].state == "draining"
        assert flaky.drains >= 3  # sent again after each failure
        flaky.failing = False
        assert svc.events.flush()
        svc.store.check_nodes()  # sends the drain again; this time the backend takes it
        assert svc.events.flush()
        svc.store.check_nodes()
        assert svc.store.view.nodes["n1"].state == "drained"
        assert ("drain", "n1") in flaky.calls
    finally:
        svc.stop()


def test_a_node_the_control_plane_has_back_is_taken_back_after_a_lost_resume(
    service: ControlService,
) -> None:
    """The lifecycle's events die with the controller: killed after the scheduler applied a
    node's ``lost`` but before its ``resume``, the controller left the node lost in the
    scheduler for good, and a job excluded from it waited forever when it was its only node
    (found by the chaos test). The next tick takes back a node the control plane has in
    service."""
    backend = service.scheduler
    assert isinstance(backend, EmbeddedBackend)
    push(service, batch("n1", 1))
    backend.exchange(_jobs_batch("n1", 1), T0)
    jid = backend.submit(JobSpec(name="t", command=("sim",), gpus=2))
    backend.tick()
    start = backend.exchange(_jobs_batch("n1", 2), T0)
    copy = {"job_id": jid, "generation": start[0].generation, "running": True}
    backend.exchange(_jobs_batch("n1", 3, [copy]), T0)
    backend.tick()
    assert backend.job(jid).state is JobState.RUNNING
    backend.node_lost("n1")  # applied; the resume that followed was lost with the controller
    assert backend.job(jid).state is JobState.REQUEUED
    assert service.store.nodes["n1"].state == "in_service"  # the control plane has it back
    copy["running"] = False
    copy["fenced"] = True
    backend.exchange(_jobs_batch("n1", 4, [copy]), T0)  # the old copy is confirmed gone
    backend.tick()
    assert {n.name: n.schedulable for n in backend.node_states()} == {"n1": True}
    backend.tick()
    assert backend.job(jid).state in (JobState.STARTING, JobState.RUNNING)
    assert backend.job(jid).nodes == ("n1",)
