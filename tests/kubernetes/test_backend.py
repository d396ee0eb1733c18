"""The kubernetes backend through the official client against the loopback fake API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.devices.types import DeviceInfo, NodeInventory
from gpufleet.errors import UsageError
from gpufleet.schedulers.base import Feature, JobSpec, UnsupportedFeature
from gpufleet.schedulers.kubernetes.backend import (
    TAINT_KEY,
    KubernetesError,
    KubernetesScheduler,
)
from kubernetes import client as k8s
from tests.scheduling.protocol import assert_protocol

from .fake_api import FakeApi

pytestmark = pytest.mark.process


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with FakeApi() as fake:
        fake.add_node("gpu-1", taints=[{"key": "other", "value": "x", "effect": "NoSchedule"}])
        fake.add_pod("ml", "train-0", "gpu-1", gpus=4)
        fake.add_pod("ml", "train-1", "gpu-1", gpus=2)
        fake.add_pod("ml", "web", "gpu-1", gpus=0)  # no GPU: left alone
        fake.add_pod("kube-system", "dcgm", "gpu-1", gpus=1, owner="DaemonSet")
        fake.add_pod("ml", "elsewhere", "gpu-2", gpus=1)
        yield fake


@pytest.fixture
def sched(api: FakeApi) -> KubernetesScheduler:
    conf = k8s.Configuration(host=f"http://127.0.0.1:{api.port}")
    sleeps: list[float] = []
    s = KubernetesScheduler(k8s.ApiClient(conf), sleep=sleeps.append, eviction_attempts=4)
    s.sleeps = sleeps  # type: ignore[attr-defined]
    return s


def test_no_submit_with_the_reason(sched: KubernetesScheduler) -> None:
    caps = sched.capabilities()
    assert not caps.supports(Feature.SUBMIT) and "kubectl" in caps.why(Feature.SUBMIT)
    with pytest.raises(UnsupportedFeature, match="does not support submit"):
        sched.submit(JobSpec(name="x"))


def test_cordon_and_uncordon(api: FakeApi, sched: KubernetesScheduler) -> None:
    sched.cordon("gpu-1")
    assert api.nodes["gpu-1"]["spec"]["unschedulable"] is True
    assert api.requests[-1]["content_type"] == "application/strategic-merge-patch+json"
    assert api.requests[-1]["path"] == "/api/v1/nodes/gpu-1"
    sched.uncordon("gpu-1")
    assert "unschedulable" not in api.nodes["gpu-1"]["spec"]


def test_taint_keeps_other_taints_and_retries_conflict(
    api: FakeApi, sched: KubernetesScheduler
) -> None:
    api.conflicts_left = 1
    sched.taint("gpu-1", "XID 79: GPU fell off the bus")
    taints = api.nodes["gpu-1"]["spec"]["taints"]
    assert {"key": "other", "value": "x", "effect": "NoSchedule"} in taints
    ours = [t for t in taints if t["key"] == TAINT_KEY]
    assert ours == [
        {"key": TAINT_KEY, "value": "XID_79_GPU_fell_off_the_bus", "effect": "NoExecute"}
    ]
    patches = [r for r in api.requests if r["method"] == "PATCH"]
    assert len(patches) == 2  # the first got 409
    assert patches[-1]["content_type"] == "application/merge-patch+json"
    sched.untaint("gpu-1")
    assert [t["key"] for t in api.nodes["gpu-1"]["spec"]["taints"]] == ["other"]


def test_eviction_uses_policy_v1_and_skips_daemonsets(
    api: FakeApi, sched: KubernetesScheduler
) -> None:
    rep = sched.evict_gpu_pods("gpu-1")
    assert sorted(rep.evicted) == ["ml/train-0", "ml/train-1"]
    assert rep.skipped == ["kube-system/dcgm"]
    assert ("ml", "web") in api.pods and ("ml", "elsewhere") in api.pods
    posts = [r for r in api.requests if r["method"] == "POST"]
    assert posts[0]["path"] == "/api/v1/namespaces/ml/pods/train-0/eviction"
    assert posts[0]["body"]["apiVersion"] == "policy/v1"
    assert posts[0]["body"]["kind"] == "Eviction"
    assert posts[0]["body"]["metadata"] == {"name": "train-0", "namespace": "ml"}


def test_pdb_429_is_retried_with_backoff(api: FakeApi, sched: KubernetesScheduler) -> None:
    api.pdb_blocks[("ml", "train-0")] = 2
    rep = sched.evict_gpu_pods("gpu-1")
    assert "ml/train-0" in rep.evicted and not rep.blocked
    assert sched.sleeps == [1.0, 2.0]  # type: ignore[attr-defined]


def test_drain_with_pdb_blocked_pod(api: FakeApi, sched: KubernetesScheduler) -> None:
    api.pdb_blocks[("ml", "train-1")] = -1
    rep = sched.drain_node("gpu-1", "XID_79")
    assert rep.cordoned and rep.evicted == ["ml/train-0"]
    assert "disruption budget" in rep.blocked["ml/train-1"]
    assert ("ml", "train-1") in api.pods
    # a NoExecute taint would bypass the PDB: NoSchedule until the pod has left
    assert rep.taint_effect == "NoSchedule"
    assert sched.sleeps == [1.0, 2.0, 4.0]  # type: ignore[attr-defined]
    api.pdb_blocks.clear()
    sched.drain("gpu-1", "XID_79")
    assert sched.last_drain is not None and sched.last_drain.taint_effect == "NoExecute"
    ours = [t for t in api.nodes["gpu-1"]["spec"]["taints"] if t["key"] == TAINT_KEY]
    assert ours == [{"key": TAINT_KEY, "value": "XID_79", "effect": "NoExecute"}]
    sched.resume("gpu-1")
    assert "unschedulable" not in api.nodes["gpu-1"]["spec"]
    assert all(t["key"] != TAINT_KEY for t in api.nodes["gpu-1"]["spec"]["taints"])


def test_node_states_and_jobs(api: FakeApi, sched: KubernetesScheduler) -> None:
    (state,) = sched.node_states()
    assert (state.name, state.gpus_total, state.gpus_allocated) == ("gpu-1", 8, 4 + 2 + 1 + 0)
    sched.drain_node("gpu-1", "ECC_DBE")
    (state,) = sched.node_states()
    assert state.state == "drain" and not state.schedulable and state.reason == "ECC_DBE"
    jobs = {j.id: j for j in sched.list_jobs()}
    assert set(jobs) == {"kube-system/dcgm", "ml/elsewhere"}
    assert jobs["ml/elsewhere"].spec.gpus == 1 and jobs["ml/elsewhere"].nodes == ("gpu-2",)


def test_labels_from_inventory(api: FakeApi, sched: KubernetesScheduler) -> None:
    inv = NodeInventory(
        name="gpu-1",
        gpus=tuple(
            DeviceInfo(index=i, uuid=f"GPU-{i}", name="NVIDIA H200", model="h200-sxm")
            for i in range(8)
        ),
        driver_version="570.124.06",
    )
    sched.label_from_inventory("gpu-1", inv, health="ok")
    labels = api.nodes["gpu-1"]["metadata"]["labels"]
    assert labels == {
        "gpufleet.io/gpu-model": "h200-sxm",
        "gpufleet.io/gpu-count": "8",
        "gpufleet.io/driver-version": "570.124.06",
        "gpufleet.io/health": "ok",
    }


def test_api_errors_are_translated(api: FakeApi, sched: KubernetesScheduler) -> None:
    with pytest.raises(KubernetesError, match="404"):
        sched.cordon("missing")


def test_answers_the_one_protocol(api: FakeApi, sched: KubernetesScheduler) -> None:
    assert_protocol(sched, "kubernetes")
    caps = sched.capabilities()
    assert caps.supports(Feature.DRAIN) and caps.supports(Feature.REPORTS_IDLE)
    assert not caps.supports(Feature.REQUEUE) and caps.why(Feature.REQUEUE)
    assert sched.job("ml/train-0").spec.gpus == 4
    with pytest.raises(UsageError, match="namespace/name"):
        sched.job("train-0")


def test_is_idle_ignores_daemonsets_and_lost_node_is_drained(
    api: FakeApi, sched: KubernetesScheduler
) -> None:
    assert not sched.is_idle("gpu-1")  # train-0 and train-1 use its GPUs
    api.add_node("gpu-3")
    api.add_pod("kube-system", "dcgm-3", "gpu-3", gpus=1, owner="DaemonSet")
    assert sched.is_idle("gpu-3")  # the DaemonSet pod stays with its node
    sched.node_lost("gpu-1")
    node = api.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True
    ours = [t for t in node["spec"]["taints"] if t["key"] == TAINT_KEY]
    assert ours and ours[0]["effect"] == "NoExecute" and "lost" in ours[0]["value"]
    assert sched.is_idle("gpu-1")  # its GPU pods were evicted


def test_campaign_deadline_evacuation_respects_a_pdb(
    api: FakeApi, sched: KubernetesScheduler
) -> None:
    """A campaign's drain and its deadline (issue 15) through the one protocol, as the control
    plane calls them (`SchedulerEvents`): a pod whose PodDisruptionBudget answers 429 is never
    removed; the evacuation at the deadline retries it and reports it blocked; once the PDB
    allows it, the next evacuation evicts it and the node is idle."""
    from gpufleet.control.jobs.events import SchedulerEvents
    from gpufleet.schedulers.base import Evacuation

    events = SchedulerEvents(sched)  # not started: calls run inline, as in unit tests
    api.pdb_blocks[("ml", "train-1")] = -1
    events.drain("gpu-1", "maintenance campaign 7: cordoned")
    assert events.drain_confirmed("gpu-1")
    assert ("ml", "train-1") in api.pods and not sched.is_idle("gpu-1")
    got: list[Evacuation] = []
    events.evacuate("gpu-1", "deadline", signal="USR1", grace_s=60, then=got.append)
    assert got[-1].signalled == 0 and got[-1].killed == 0
    assert "PodDisruptionBudget" in got[-1].note and "ml/train-1" in got[-1].note
    assert ("ml", "train-1") in api.pods and not sched.is_idle("gpu-1")
    api.pdb_blocks.clear()
    events.evacuate("gpu-1", "deadline", signal="USR1", grace_s=60, then=got.append)
    assert got[-1] == Evacuation(1, 0, ("ml/train-1",), "")
    assert ("ml", "train-1") not in api.pods and sched.is_idle("gpu-1")
    ours = [t for t in api.nodes["gpu-1"]["spec"]["taints"] if t["key"] == TAINT_KEY]
    assert [t["effect"] for t in ours] == ["NoExecute"]  # every pod left: the full taint
