"""Generated Kubernetes objects: the agent DaemonSet, RBAC, Service, ServiceMonitor, the
mig-parted and device-plugin ConfigMaps, and NVIDIA GPU Operator Helm values.

NVML access: by default the agent runs under the ``nvidia`` RuntimeClass the GPU Operator
installs, with ``NVIDIA_VISIBLE_DEVICES=all`` and ``NVIDIA_DRIVER_CAPABILITIES=utility`` (the
capability that mounts ``libnvidia-ml`` and ``nvidia-smi``; NVIDIA Container Toolkit docs,
"Driver capabilities"), unprivileged, no privilege escalation, all capabilities dropped.
``nvml_access="host-devices"`` instead mounts ``/dev`` and the driver's library directory from
the host, which needs ``privileged: true`` because the device cgroup would refuse /dev/nvidia*.

GPU Operator values (GPU Operator docs, "Getting Started" chart parameters and "GPUs with
Multi-Instance GPU"): ``mig.strategy`` (single|mixed), ``migManager.config.name`` (a ConfigMap
whose ``config.yaml`` is a mig-parted config), ``devicePlugin.config.name``/``default`` (a
ConfigMap of device-plugin configs, one per key), ``dcgmExporter.enabled`` (off when the
gpufleet agent exports the same dcgm-exporter metric names).

ServiceMonitor: ``monitoring.coreos.com/v1`` (Prometheus Operator API reference).
"""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet import __version__

__all__ = ["AGENT_PORT", "gpu_operator_values", "kubernetes_objects"]

AGENT_PORT = 9400  # dcgm-exporter's default port, so existing scrape configs keep working
APP = "gpufleet-agent"
CONTROLLER_SA = "gpufleet-controller"
MIG_CONFIGMAP = "gpufleet-mig-parted-config"
PLUGIN_CONFIGMAP = "gpufleet-device-plugin-config"
STATE_DIR = "/var/lib/gpufleet/agent"  # sequence numbers and the offline spool (gpufleet agent)


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "gpufleet"},
    }
    if namespace:
        meta["namespace"] = namespace
    return meta


def _daemonset(
    namespace: str, image: str, controller_url: str | None, nvml_access: str
) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "GPUFLEET_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
    ]
    args = ["agent", "--listen", f"0.0.0.0:{AGENT_PORT}", "--state-dir", STATE_DIR]
    if controller_url:
        args += ["--controller", controller_url]
    container: dict[str, Any] = {
        "name": "agent",
        "image": image,
        "args": args,
        "env": env,
        "ports": [{"name": "metrics", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 15},
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
    }
    pod: dict[str, Any] = {
        "serviceAccountName": APP,
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            # the agent must keep watching a node gpufleet itself tainted unhealthy
            {"key": "gpufleet.io/unhealthy", "operator": "Exists"},
        ],
        "priorityClassName": "system-node-critical",
        "containers": [container],
    }
    container["volumeMounts"] = [{"name": "state", "mountPath": STATE_DIR}]
    pod["volumes"] = [
        {"name": "state", "hostPath": {"path": STATE_DIR, "type": "DirectoryOrCreate"}}
    ]
    if nvml_access == "runtime-class":
        pod["runtimeClassName"] = "nvidia"
        container["securityContext"] = {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            # NVML opens /dev/nvidiactl, root-owned (mode 0666 on most hosts); the state
            # directory is a hostPath the kubelet creates root-owned 0755, which the image's
            # default user (Dockerfile: uid 10001) could not write: root, without capabilities
            "runAsNonRoot": False,
            "runAsUser": 0,
            "capabilities": {"drop": ["ALL"]},
        }
    elif nvml_access == "host-devices":
        container["securityContext"] = {"privileged": True}
        container["volumeMounts"] += [
            {"name": "dev", "mountPath": "/dev"},
            {
                "name": "driver-libs",
                "mountPath": "/usr/lib/x86_64-linux-gnu/nvidia",
                "readOnly": True,
            },
        ]
        pod["volumes"] += [
            {"name": "dev", "hostPath": {"path": "/dev"}},
            {
                "name": "driver-libs",
                "hostPath": {"path": "/usr/lib/x86_64-linux-gnu", "type": "Directory"},
            },
        ]
    else:
        from gpufleet.errors import UsageError

        raise UsageError(f"nvml_access {nvml_access!r}: use runtime-class or host-devices")
    labels = {"app.kubernetes.io/name": APP}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(APP, namespace),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _rbac(namespace: str) -> list[dict[str, Any]]:
    role_rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(APP, namespace)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(CONTROLLER_SA, namespace)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(CONTROLLER_SA),
            "rules": role_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(CONTROLLER_SA),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": CONTROLLER_SA,
            },
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": namespace}],
        },
    ]


def _service(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(APP, namespace),
        "spec": {
            "clusterIP": "None",  # headless: Prometheus scrapes every agent pod
            "selector": {"app.kubernetes.io/name": APP},
            "ports": [{"name": "metrics", "port": AGENT_PORT, "targetPort": "metrics"}],
        },
    }


def _service_monitor(namespace: str, interval: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(APP, namespace),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": interval}],
        },
    }


def _configmap(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(name, namespace),
        "data": data,
    }


def gpu_operator_values(
    *, mig_strategy: str = "mixed", sharing: str | None = None, agent_exports: bool = True
) -> dict[str, Any]:
    """Helm values for the NVIDIA GPU Operator chart (``nvidia/gpu-operator``)."""
    values: dict[str, Any] = {
        "mig": {"strategy": mig_strategy},
        "migManager": {
            "enabled": True,
            "config": {"name": MIG_CONFIGMAP, "default": "all-disabled"},
        },
        "dcgmExporter": {"enabled": not agent_exports},
    }
    if sharing is not None:
        values["devicePlugin"] = {"config": {"name": PLUGIN_CONFIGMAP, "default": sharing}}
    return values


def kubernetes_objects(
    *,
    namespace: str = "gpufleet",
    image: str = f"ghcr.io/gpufleet/gpufleet:{__version__}",
    controller_url: str | None = None,
    nvml_access: str = "runtime-class",
    mig_config: dict[str, Any] | None = None,
    sharing: dict[str, Any] | None = None,
    sharing_name: str | None = None,
    scrape_interval: str = "15s",
) -> list[dict[str, Any]]:
    """Every object, in apply order (namespace, RBAC, DaemonSet, Service, monitor, configs)."""
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(namespace)},
        *_rbac(namespace),
        _daemonset(namespace, image, controller_url, nvml_access),
        _service(namespace),
        _service_monitor(namespace, scrape_interval),
    ]
    if mig_config is not None:
        text = yaml.safe_dump(mig_config, sort_keys=False)
        objs.append(_configmap(MIG_CONFIGMAP, "gpu-operator", {"config.yaml": text}))
    if sharing is not None:
        text = yaml.safe_dump(sharing, sort_keys=False)
        objs.append(_configmap(PLUGIN_CONFIGMAP, "gpu-operator", {sharing_name or "sharing": text}))
    return objs
