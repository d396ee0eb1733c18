"""The ``kubernetes`` scheduler backend, through the official ``kubernetes`` Python client.

What it does on a node: cordon/uncordon (``spec.unschedulable``), a ``NoExecute`` taint
``gpufleet.io/unhealthy=<finding code>``, eviction of the node's GPU pods through the Eviction
API (``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` with a ``policy/v1`` Eviction, so
PodDisruptionBudgets are honoured: the API answers 429 while a PDB forbids it; we back off and
retry, then report the pod as blocked), and node labels from the inventory.

Order of a drain: cordon, evict GPU pods, then taint. A ``NoExecute`` taint makes the node
lifecycle controller delete every pod that does not tolerate it *without* consulting PDBs, so
while any eviction is still blocked the taint is applied as ``NoSchedule`` and the report says
so; calling ``drain_node`` again once the pods are gone upgrades it to ``NoExecute``.

``gpufleet controller --scheduler kubernetes [--kubeconfig PATH]`` builds it with
:meth:`KubernetesScheduler.from_config` (a kubeconfig file, else the in-cluster service account,
else ``~/.kube/config``). Tested against a loopback HTTP server that implements the endpoints
used with their real paths and payloads (tests/kubernetes); NOT yet run against a real cluster.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.schedulers.base import (
    Capabilities,
    Capability,
    Evacuation,
    Feature,
    JobAttempt,
    JobSpec,
    JobState,
    JobStatus,
    SchedNodeState,
    SchedulerContext,
    UnsupportedFeature,
)

if TYPE_CHECKING:
    from gpufleet.wire import Batch, WireCommand

__all__ = ["DrainReport", "KubernetesError", "KubernetesScheduler", "label_value"]

TAINT_KEY = "gpufleet.io/unhealthy"
LABEL_PREFIX = "gpufleet.io/"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

_PHASE = {
    "Pending": JobState.QUEUED,
    "Running": JobState.RUNNING,
    "Succeeded": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
}


class KubernetesError(GpufleetError):
    """The Kubernetes API refused or failed a call (status and message included)."""


def label_value(text: str) -> str:
    """A valid label/taint value: <= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends
    (Kubernetes "Labels and Selectors": syntax and character set)."""
    v = re.sub(r"[^A-Za-z0-9_.\-]+", "_", text)[:63]
    return v.strip("_.-")


@dataclass
class DrainReport:
    """What a drain did: evicted and blocked pods, and the taint effect applied."""

    node: str
    cordoned: bool = False
    evicted: list[str] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # pod -> API message
    skipped: list[str] = field(default_factory=list)
    taint_effect: str | None = None


class KubernetesScheduler:
    """Nodes and GPU pods of a Kubernetes cluster (no job submission: see capabilities)."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: Any | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        eviction_attempts: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        from kubernetes import client as k8s

        if api_client is None:
            from kubernetes import config as kconfig

            try:
                kconfig.load_incluster_config()  # type: ignore[no-untyped-call]
            except kconfig.ConfigException:
                try:
                    kconfig.load_kube_config()  # type: ignore[no-untyped-call]
                except Exception as exc:  # the client raises several kinds here
                    raise KubernetesError(f"no Kubernetes configuration: {exc}") from exc
            api_client = k8s.ApiClient()
        self._k8s = k8s
        self.core = k8s.CoreV1Api(api_client)
        self._sleep = sleep
        self.eviction_attempts = eviction_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.last_drain: DrainReport | None = None

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, **kw: Any) -> KubernetesScheduler:
        """Connect with ``kubeconfig`` (a file), else in-cluster config, else the default
        kubeconfig; a missing or unreadable configuration is a clear error."""
        from kubernetes import config as kconfig

        if kubeconfig is not None:
            try:
                client = kconfig.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            except Exception as exc:  # the client raises several kinds here
                raise KubernetesError(f"--kubeconfig {kubeconfig}: {exc}") from exc
            return cls(client, **kw)
        return cls(None, **kw)

    # -- protocol ---------------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        no_jobs = (
            "gpufleet does not create Pods or Jobs on Kubernetes; use kubectl, Kueue or Volcano"
        )
        return Capabilities(
            self.name,
            [
                Capability(Feature.SUBMIT, False, no_jobs),
                Capability(
                    Feature.REQUEUE,
                    False,
                    "pods are rescheduled by their controllers after eviction",
                ),
                Capability(Feature.LIST_JOBS, True, "GPU pods, read-only"),
                Capability(Feature.JOB_ATTEMPTS, False, "pods have no attempt history"),
                Capability(Feature.JOB_LOGS, False, "use kubectl logs"),
                Capability(Feature.AGENT_JOBS, False, "the kubelet runs the pods"),
                Capability(Feature.DRAIN, True, "cordon + PDB-respecting eviction + taint"),
                Capability(
                    Feature.EVACUATE,
                    True,
                    "the drain's evictions again (PDBs respected); an evicted pod gets SIGTERM"
                    " and its own terminationGracePeriodSeconds, not the campaign's signal",
                ),
                Capability(Feature.REPORTS_IDLE, True, "no running GPU pod left on the node"),
                Capability(Feature.NODE_STATES, True),
                Capability(Feature.MIG, True, "nvidia.com/mig-* resources are counted"),
            ],
        )

    def start(self, context: SchedulerContext) -> None:
        return None  # no background work: every call is one API request

    def stop(self) -> None:
        return None

    def _no(self, feature: Feature, doing: str) -> UnsupportedFeature:
        return UnsupportedFeature(
            f"{doing}: the kubernetes scheduler does not support {feature.value}",
            hint=self.capabilities().why(feature),
        )

    def submit(self, spec: JobSpec) -> str:
        raise self._no(Feature.SUBMIT, f"job {spec.name!r}")

    def cancel(self, job_id: str) -> None:
        raise self._no(Feature.SUBMIT, f"cancel {job_id}")

    def requeue(self, job_id: str) -> None:
        raise self._no(Feature.REQUEUE, f"requeue {job_id}")

    def job(self, job_id: str) -> JobStatus:
        """One GPU pod by ``namespace/name``."""
        jobs = self.list_jobs()
        for j in jobs:
            if j.id == job_id:
                return j
        raise UsageError(f"no GPU pod {job_id!r}", hint="ids are namespace/name")

    def attempts(self, job_id: str) -> list[JobAttempt]:
        return []

    def logs(self, job_id: str) -> str | None:
        return None

    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        return []  # the kubelet runs the pods; agents only report health

    def list_jobs(self) -> list[JobStatus]:
        pods = self._call(self.core.list_pod_for_all_namespaces).items
        out = []
        for pod in pods:
            gpus = _gpu_count(pod)
            if not gpus:
                continue
            md, spec, status = pod.metadata, pod.spec, pod.status
            images = [c.image for c in spec.containers or [] if c.image]
            job = JobSpec(
                name=md.name,
                tenant=md.namespace or "default",
                gpus=gpus,
                image=images[0] if images else None,
            )
            phase = status.phase if status else None
            out.append(
                JobStatus(
                    id=f"{md.namespace}/{md.name}",
                    spec=job,
                    state=_PHASE.get(phase or "", JobState.QUEUED),
                    nodes=(spec.node_name,) if spec.node_name else (),
                    reason=(status.reason or "") if status else "",
                )
            )
        return out

    def node_states(self) -> list[SchedNodeState]:
        nodes = self._call(self.core.list_node).items
        pods = self._call(
            self.core.list_pod_for_all_namespaces, field_selector="status.phase=Running"
        ).items
        allocated: dict[str, int] = {}
        for pod in pods:
            if pod.spec.node_name:
                allocated[pod.spec.node_name] = allocated.get(pod.spec.node_name, 0) + _gpu_count(
                    pod
                )
        out = []
        for node in nodes:
            name = node.metadata.name
            taints = node.spec.taints or [] if node.spec else []
            ours = next((t for t in taints if t.key == TAINT_KEY), None)
            cordoned = bool(node.spec and node.spec.unschedulable)
            ready = any(
                c.type == "Ready" and c.status == "True"
                for c in (node.status.conditions or [] if node.status else [])
            )
            state = "drain" if cordoned else ("idle" if ready else "down")
            if ready and not cordoned and allocated.get(name):
                state = "alloc"
            total = 0
            for key, qty in ((node.status.allocatable or {}) if node.status else {}).items():
                if key.startswith(GPU_RESOURCE_PREFIXES):
                    total += int(qty)
            out.append(
                SchedNodeState(
                    name=name,
                    state=state,
                    reason=ours.value or "" if ours else "",
                    gpus_total=total,
                    gpus_allocated=allocated.get(name, 0),
                    schedulable=not cordoned and ready,
                )
            )
        return out

    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        """Cordon, evict GPU pods, taint (``fail`` changes nothing: evicted pods move anyway)."""
        self.last_drain = self.drain_node(node, reason)

    def resume(self, node: str) -> None:
        self.untaint(node)
        self.uncordon(node)

    def evacuate(self, node: str, reason: str, *, signal: str, grace_s: float) -> Evacuation:
        """A drain's deadline: evict the node's GPU pods again (a PodDisruptionBudget still
        answers 429: retried with backoff, then reported as blocked; the pod is never deleted
        past its PDB). Kubernetes sends an evicted pod SIGTERM and gives it its own
        ``terminationGracePeriodSeconds``: ``signal`` and ``grace_s`` do not apply."""
        rep = self.drain_node(node, reason)
        self.last_drain = rep
        note = ""
        if rep.blocked:
            pod, why = next(iter(rep.blocked.items()))
            note = (
                f"{len(rep.blocked)} pod(s) blocked by a PodDisruptionBudget (e.g. {pod}: {why})"
            )[:300]
        return Evacuation(len(rep.evicted), 0, tuple([*rep.evicted, *rep.blocked]), note)

    def node_lost(self, node: str) -> None:
        self.drain(node, "node lost (no heartbeat)", fail=True)

    def is_idle(self, node: str) -> bool:
        """No running GPU pod on ``node`` except DaemonSet and mirror pods (which stay)."""
        try:
            pods = self._call(
                self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
            ).items
        except KubernetesError:
            return False
        return not any(
            _gpu_count(p) and not _stays(p) and (p.status is None or p.status.phase == "Running")
            for p in pods
        )

    # -- node operations --------------------------------------------------------------------

    def cordon(self, node: str) -> None:
        self._patch(node, {"spec": {"unschedulable": True}}, STRATEGIC_PATCH)

    def uncordon(self, node: str) -> None:
        self._patch(node, {"spec": {"unschedulable": None}}, STRATEGIC_PATCH)

    def taint(self, node: str, finding: str, effect: str = "NoExecute") -> None:
        """Set ``gpufleet.io/unhealthy=<finding>:<effect>``, keeping the node's other taints."""
        value = label_value(finding)
        self._update_taints(
            node, lambda ts: [*ts, {"key": TAINT_KEY, "value": value, "effect": effect}]
        )

    def untaint(self, node: str) -> None:
        self._update_taints(node, lambda ts: ts)

    def label(self, node: str, labels: dict[str, str | None]) -> None:
        """Set (or with ``None`` remove) node labels."""
        self._patch(node, {"metadata": {"labels": labels}}, STRATEGIC_PATCH)

    def label_from_inventory(
        self, node: str, inventory: Any, health: str | None = None
    ) -> dict[str, str | None]:
        """Labels ``gpufleet.io/gpu-model``, ``gpu-count``, ``driver-version``, ``health`` from a
        ``NodeInventory``; applied and returned."""
        gpus = list(inventory.gpus)
        models = sorted({g.model or g.name for g in gpus})
        labels: dict[str, str | None] = {
            LABEL_PREFIX + "gpu-model": label_value("_".join(models)) or None,
            LABEL_PREFIX + "gpu-count": str(len(gpus)),
            LABEL_PREFIX + "driver-version": label_value(inventory.driver_version or "") or None,
        }
        if health is not None:
            labels[LABEL_PREFIX + "health"] = label_value(health)
        self.label(node, labels)
        return labels

    def evict_gpu_pods(self, node: str, report: DrainReport | None = None) -> DrainReport:
        """Evict the node's GPU pods through the Eviction API; 429 (PDB) retried with backoff."""
        rep = report or DrainReport(node)
        pods = self._call(
            self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        ).items
        for pod in pods:
            md = pod.metadata
            ident = f"{md.namespace}/{md.name}"
            phase = pod.status.phase if pod.status else None
            if not _gpu_count(pod):
                continue
            if _stays(pod):
                rep.skipped.append(ident)
                continue
            if phase in ("Succeeded", "Failed"):
                continue
            self._evict(md.namespace, md.name, ident, rep)
        return rep

    def drain_node(self, node: str, finding: str) -> DrainReport:
        """Cordon, evict GPU pods (PDBs respected), then taint (see the module doc)."""
        rep = DrainReport(node)
        self.cordon(node)
        rep.cordoned = True
        self.evict_gpu_pods(node, rep)
        rep.taint_effect = "NoSchedule" if rep.blocked else "NoExecute"
        self.taint(node, finding, rep.taint_effect)
        return rep

    # -- internals --------------------------------------------------------------------------

    def _evict(self, ns: str, name: str, ident: str, rep: DrainReport) -> None:
        k8s = self._k8s
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=ns),
        )
        delay = self.backoff_s
        for attempt in range(self.eviction_attempts):
            try:
                self.core.create_namespaced_pod_eviction(name, ns, body)
                rep.evicted.append(ident)
                return
            except k8s.exceptions.ApiException as exc:
                if exc.status == 404:
                    rep.evicted.append(ident)  # already gone
                    return
                if exc.status != 429:
                    raise _translate(exc, f"evict {ident}") from exc
                message = _message(exc)
                if attempt + 1 == self.eviction_attempts:
                    rep.blocked[ident] = message
                    return
                self._sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _update_taints(
        self, node: str, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> None:
        """Read-modify-write of ``spec.taints`` guarded by resourceVersion (409: retry)."""
        k8s = self._k8s
        for _ in range(5):
            current = self._call(self.core.read_node, node)
            others = [
                {
                    k: v
                    for k, v in {"key": t.key, "value": t.value, "effect": t.effect}.items()
                    if v is not None
                }
                for t in (current.spec.taints or [] if current.spec else [])
                if t.key != TAINT_KEY
            ]
            body = {
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "spec": {"taints": change(others)},
            }
            try:
                self.core.patch_node(node, body, _content_type=MERGE_PATCH)
                return
            except k8s.exceptions.ApiException as exc:
                if exc.status != 409:
                    raise _translate(exc, f"taint node {node}") from exc
        raise KubernetesError(f"taint node {node}: kept conflicting with other writers")

    def _patch(self, node: str, body: dict[str, Any], content_type: str) -> None:
        self._call(self.core.patch_node, node, body, _content_type=content_type)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._k8s.exceptions.ApiException as exc:
            raise _translate(exc, fn.__name__) from exc
        except OSError as exc:  # connection refused, DNS, TLS
            raise KubernetesError(f"{fn.__name__}: cannot reach the API server: {exc}") from exc


def _message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.reason))
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _translate(exc: Any, what: str) -> KubernetesError:
    return KubernetesError(f"{what}: HTTP {exc.status}: {_message(exc)}")


def _stays(pod: Any) -> bool:
    """DaemonSet and static (mirror) pods are not evicted: they belong to the node."""
    md = pod.metadata
    owners = [o.kind for o in md.owner_references or []]
    return "DaemonSet" in owners or "kubernetes.io/config.mirror" in (md.annotations or {})


def _gpu_count(pod: Any) -> int:
    total = 0
    for c in pod.spec.containers or []:
        res = c.resources
        if res is None:
            continue
        amounts = {**(res.requests or {}), **(res.limits or {})}
        for key, qty in amounts.items():
            if key.startswith(GPU_RESOURCE_PREFIXES):
                total += int(qty)
    return total
