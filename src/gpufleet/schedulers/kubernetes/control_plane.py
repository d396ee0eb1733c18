"""Generated Kubernetes objects for the control plane itself: a Deployment of the controller
(two replicas by default, on PostgreSQL: they elect a leader, `gpufleet.control.ha.leader`, and
both serve the API), its Service, a PodDisruptionBudget, a Secret holding the database
URL and the key that seals stored job specs (the same for every replica and restart), and a
ConfigMap holding the remediation policy.

The pods run the same image as the agents (the repository's ``Dockerfile``: a non-root user,
the package and nothing else) as that user, with a read-only root file system, no privilege
escalation and every capability dropped (Kubernetes "Pod Security Standards", restricted
profile). The database URL reaches the controller as ``GPUFLEET_DB_URL`` from the Secret,
never on the command line. Probes use ``GET /api/v1/health`` (no token). API versions:
apps/v1 Deployment, policy/v1 PodDisruptionBudget, v1 Service/Secret/ConfigMap (Kubernetes
API reference).
"""

from __future__ import annotations

from typing import Any

CONTROLLER = "gpufleet-controller"
CONTROLLER_SA = "gpufleet-controller"  # the ServiceAccount the RBAC objects bind
SECRET = "gpufleet-controller-db"
POLICY_CONFIGMAP = "gpufleet-policy"
API_PORT = 8080
RUN_AS = 10001  # the Dockerfile's gpufleet user
DB_URL_PLACEHOLDER = "postgresql://gpufleet:CHANGE-ME@postgresql:5432/gpufleet"
DATA_DIR = "/var/lib/gpufleet"
KEY_FILE = "job-env.key"  # gpufleet.schedulers.embedded.sealing.KEY_FILE


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "gpufleet"},
    }


def _deployment(
    namespace: str, image: str, replicas: int, scheduler: str, prometheus_url: str | None
) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {
            "name": "GPUFLEET_DB_URL",
            "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "db-url"}},
        },
        {"name": "HOME", "value": "/tmp"},
        # the data directory holds only the job-spec key, from the Secret: every replica (and
        # every restart) opens the job specs sealed by the others
        {"name": "GPUFLEET_DATA_DIR", "value": DATA_DIR},
    ]
    if prometheus_url:
        env.append({"name": "GPUFLEET_PROMETHEUS_URL", "value": prometheus_url})
    else:  # each pod's own address: the others forward raw series reads of its nodes there
        env += [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GPUFLEET_ADVERTISE_URL", "value": f"http://$(POD_IP):{API_PORT}"},
        ]
    args = [
        "controller",
        "--host",
        "0.0.0.0",
        "--port",
        str(API_PORT),
        "--scheduler",
        scheduler,
        "--policy",
        "/etc/gpufleet/policy/policy.yaml",
    ]
    probe = {"httpGet": {"path": "/api/v1/health", "port": "http"}, "periodSeconds": 10}
    labels = {"app.kubernetes.io/name": CONTROLLER}
    container: dict[str, Any] = {
        "name": "controller",
        "image": image,
        "args": args,
        "env": env,
        "ports": [{"name": "http", "containerPort": API_PORT, "protocol": "TCP"}],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "policy", "mountPath": "/etc/gpufleet/policy", "readOnly": True},
            {"name": "job-key", "mountPath": DATA_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod: dict[str, Any] = {
        "serviceAccountName": CONTROLLER_SA,
        "securityContext": {"runAsNonRoot": True, "fsGroup": RUN_AS},
        "containers": [container],
        "volumes": [
            {"name": "policy", "configMap": {"name": POLICY_CONFIGMAP}},
            {
                "name": "job-key",
                "secret": {
                    "secretName": SECRET,
                    "items": [{"key": "job-env-key", "path": KEY_FILE}],
                    "defaultMode": 0o440,  # the pod's group (fsGroup) reads it
                },
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
        ],
        # replicas on different nodes: losing one node leaves the API answering
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": labels},
            }
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(CONTROLLER, namespace),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def control_plane_objects(
    *,
    namespace: str,
    image: str,
    replicas: int = 2,
    db_url: str | None = None,
    job_key: str,
    policy_yaml: str = "{}\n",
    scheduler: str = "kubernetes",
    prometheus_url: str | None = None,
) -> list[dict[str, Any]]:
    """Secret, policy ConfigMap, Deployment, Service and PodDisruptionBudget, in apply order
    (the namespace and the ServiceAccount come first, from the agent's objects)."""
    labels = {"app.kubernetes.io/name": CONTROLLER}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(SECRET, namespace),
            "type": "Opaque",
            "stringData": {"db-url": db_url or DB_URL_PLACEHOLDER, "job-env-key": job_key},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(POLICY_CONFIGMAP, namespace),
            "data": {"policy.yaml": policy_yaml},
        },
        _deployment(namespace, image, replicas, scheduler, prometheus_url),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(CONTROLLER, namespace),
            "spec": {
                "selector": labels,
                "ports": [{"name": "http", "port": API_PORT, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(CONTROLLER, namespace),
            "spec": {
                "minAvailable" if replicas > 1 else "maxUnavailable": 1,
                "selector": {"matchLabels": labels},
            },
        },
    ]
