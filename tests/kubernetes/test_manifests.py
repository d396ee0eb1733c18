"""Every generated object loads into the official client's typed models and round-trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.mig.demand import parse_demand
from gpufleet.mig.emit import mig_parted_config
from gpufleet.mig.fleet import parse_gpus
from gpufleet.mig.planner import plan_exact
from gpufleet.mig.sharing import time_slicing_config
from gpufleet.schedulers.kubernetes.manifests import gpu_operator_values, kubernetes_objects
from kubernetes import client as k8s

KINDS = {
    "Namespace": "V1Namespace",
    "ServiceAccount": "V1ServiceAccount",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "DaemonSet": "V1DaemonSet",
    "Service": "V1Service",
    "ConfigMap": "V1ConfigMap",
}


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


def _round_trip(obj: dict[str, Any], klass: str) -> Any:
    api = k8s.ApiClient()
    model = api.deserialize(json.dumps(obj), klass, "application/json")
    assert type(model).__name__ == klass
    # the kubernetes client leaves sanitize_for_serialization unannotated
    plain = api.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    assert _drop_none(plain) == obj
    return model


def _objects() -> list[dict[str, Any]]:
    plan = plan_exact(parse_gpus("8xh200"), parse_demand("a: 7 x 1g.18gb"))
    return kubernetes_objects(
        mig_config=mig_parted_config(plan),
        sharing=time_slicing_config(4),
        sharing_name="time-slicing",
        controller_url="http://gpufleet:8080",
    )


@pytest.mark.parametrize("nvml_access", ["runtime-class", "host-devices"])
def test_typed_round_trip(nvml_access: str) -> None:
    objs = kubernetes_objects(nvml_access=nvml_access) + _objects()[-2:]
    seen = set()
    for obj in objs:
        if obj["kind"] == "ServiceMonitor":
            continue
        _round_trip(obj, KINDS[obj["kind"]])
        seen.add(obj["kind"])
    assert seen == set(KINDS)


def test_daemonset_nvml_access() -> None:
    ds = next(o for o in _objects() if o["kind"] == "DaemonSet")
    model = _round_trip(ds, "V1DaemonSet")
    pod = model.spec.template.spec
    assert pod.runtime_class_name == "nvidia"
    c = pod.containers[0]
    assert c.security_context.privileged is False
    env = {e.name: e.value for e in c.env}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert any(t.key == "gpufleet.io/unhealthy" and t.operator == "Exists" for t in pod.tolerations)


def test_service_monitor_fields() -> None:
    # No typed model exists for the Prometheus Operator CRD; its metadata and label selector
    # are core types, the rest is checked against the monitoring.coreos.com/v1 API reference.
    sm = next(o for o in _objects() if o["kind"] == "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    _round_trip(sm["metadata"], "V1ObjectMeta")
    _round_trip(sm["spec"]["selector"], "V1LabelSelector")
    svc = next(o for o in _objects() if o["kind"] == "Service")
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert set(sm["spec"]["endpoints"][0]) <= {"port", "path", "interval", "scheme"}


def test_configmaps_hold_mig_parted_and_plugin_configs() -> None:
    cms = {o["metadata"]["name"]: o for o in _objects() if o["kind"] == "ConfigMap"}
    parted = yaml.safe_load(cms["gpufleet-mig-parted-config"]["data"]["config.yaml"])
    assert parted["version"] == "v1"
    # 7 x 1g.18gb fit on one GPU: the node's config gives GPU 0 seven 1g and the rest MIG off
    entries = next(v for k, v in parted["mig-configs"].items() if k != "all-disabled")
    assert {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.18gb": 7}} in entries
    assert {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False} in entries
    ts = yaml.safe_load(cms["gpufleet-device-plugin-config"]["data"]["time-slicing"])
    assert ts["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]


def test_gpu_operator_values() -> None:
    v = gpu_operator_values(mig_strategy="single", sharing="mps", agent_exports=True)
    assert v["mig"] == {"strategy": "single"}
    assert v["dcgmExporter"] == {"enabled": False}
    assert v["devicePlugin"]["config"] == {
        "name": "gpufleet-device-plugin-config",
        "default": "mps",
    }
    assert v["migManager"]["config"]["name"] == "gpufleet-mig-parted-config"


def test_cli_config_kubernetes(tmp_path: Path, mig_parted: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "config",
            "kubernetes",
            "--json",
            "--sharing",
            "mps",
            "--mig-config",
            str(mig_parted),
            "--out",
            str(tmp_path / "k8s"),
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    kinds = [o["kind"] for o in doc["objects"]]
    operator_cms = [
        o
        for o in doc["objects"]
        if o["kind"] == "ConfigMap" and o["metadata"]["namespace"] == "gpu-operator"
    ]
    assert len(operator_cms) == 2 and "DaemonSet" in kinds
    assert (tmp_path / "k8s" / "gpu-operator-values.yaml").exists()
    loaded = list(yaml.safe_load_all((tmp_path / "k8s" / "gpufleet.yaml").read_text()))
    assert loaded == doc["objects"]
    r = runner.invoke(app, ["config", "kubernetes", "--sharing", "bogus"])
    assert r.exit_code != 0
