"""The Prometheus exposition: a custom collector that builds fresh metric families on every
scrape from the sampler's ring buffers (no NVML call during a scrape), and a text renderer.

Nothing registers at import time: `make_registry` builds an explicit ``CollectorRegistry``.
dcgm-exporter's counters keep their exact names (no ``_total`` suffix is added), so this module
renders the text format itself (`render_text`) instead of ``prometheus_client.generate_latest``,
which appends ``_total`` to every counter family.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpufleet.devices.types import CLOCK_REASON_WORDS
from gpufleet.telemetry import metrics as M
from gpufleet.telemetry.sampler import GpuState, Sampler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = logging.getLogger("gpufleet.telemetry.exposition")

_REASON_LABELS = {bit: word.lower().replace(" ", "_") for bit, word in CLOCK_REASON_WORDS.items()}


@dataclass
class HealthView:
    """The health verdicts the collector exports (0 ok, 1 warn, 2 fail, 3 unknown)."""

    node: int = 3
    gpus: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ExtraMetric:
    """One more agent metric (pusher, spool, ...) handed to the collector by its owner."""

    name: str
    kind: str  # "gauge" or "counter"; counters' samples are name + "_total"
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


def gpu_labels(gpu: GpuState, hostname: str) -> dict[str, str] | None:
    """dcgm-exporter's label set of a GPU, in its order; None until the GPU was identified."""
    info = gpu.info
    if info is None:
        return None
    minor = info.minor_number if info.minor_number is not None else gpu.index
    labels = {
        "gpu": str(gpu.index),
        "UUID": info.uuid,
        "pci_bus_id": info.pci_bus_id or "",
        "device": f"nvidia{minor}",
        "modelName": info.name,
        M.HOST_LABEL: hostname,
    }
    if info.driver_version:
        labels[M.DRIVER_LABEL] = info.driver_version
    return labels


def lost_labels(index: int, hostname: str) -> dict[str, str]:
    """The labels of a GPU lost before it was ever identified (no UUID, PCI address or model
    can be read from it): the index, the device node and the host; unknown labels are absent."""
    return {"gpu": str(index), "device": f"nvidia{index}", M.HOST_LABEL: hostname}


class IdentityMemory:
    """The label set of every GPU the agent identified, kept in a 0600 JSON file in the
    agent's state directory, so that a GPU already lost when the agent starts exports its
    ``gpufleet_gpu_lost`` series under the same labels as before the restart (the alert keeps
    its identity, and the restart does not resolve it). ``path=None``: in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._known: dict[int, dict[str, str]] = self._load()

    def _load(self) -> dict[int, dict[str, str]]:
        if self.path is None:
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # a damaged file only loses the memory
            log.warning("%s: GPU identities not read: %s", self.path, exc)
            return {}
        out: dict[int, dict[str, str]] = {}
        if isinstance(raw, dict):
            for key, labels in raw.items():
                if key.isdigit() and isinstance(labels, dict):
                    out[int(key)] = {str(k): str(v) for k, v in labels.items()}
        return out

    def recall(self, index: int, hostname: str) -> dict[str, str] | None:
        """The labels GPU ``index`` had when last identified (host label set to ``hostname``)."""
        with self._lock:
            known = self._known.get(index)
        if known is None:
            return None
        return {k: (hostname if k == M.HOST_LABEL else v) for k, v in known.items()}

    def remember(self, index: int, labels: dict[str, str]) -> None:
        """Keep ``labels`` for GPU ``index``; the file is written only when they changed."""
        with self._lock:
            if self._known.get(index) == labels:
                return
            self._known[index] = dict(labels)
            data = {str(k): v for k, v in sorted(self._known.items())}
        if self.path is not None:
            self._write(data)

    def _write(self, data: dict[str, dict[str, str]]) -> None:
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as exc:  # the series still export; only the memory is lost
            log.warning("%s: GPU identities not written: %s", self.path, exc)


def _value(raw: float, metric: M.MetricDef) -> float:
    v = raw * metric.scale
    return float(math.floor(v)) if metric.floor else v


class AgentCollector(Collector):
    """Yields every family from the sampler's latest ring-buffer rows."""

    def __init__(
        self,
        sampler: Sampler,
        *,
        hostname: str | None = None,
        health: Callable[[], HealthView] | None = None,
        extra: Callable[[], Iterable[ExtraMetric]] | None = None,
        identities: IdentityMemory | None = None,
    ) -> None:
        """``identities``: where the labels of identified GPUs are remembered, so that a GPU
        lost before it was identified (already lost at start) still exports its lost series
        under the labels it had (else the index, device and host only)."""
        self.sampler = sampler
        self.hostname = hostname or sampler.node
        self._health = health or HealthView
        self._extra = extra
        self.identities = identities or IdentityMemory()

    def collect(self) -> Iterator[Metric]:
        s = self.sampler
        health = self._health()
        with s.lock:
            rows = []
            identified: list[tuple[int, dict[str, str]]] = []
            live_uuids = {g.info.uuid for g in s.gpus if g.info is not None}
            for gpu in s.gpus:
                labels = gpu_labels(gpu, self.hostname)
                if labels is not None:
                    identified.append((gpu.index, labels))
                elif gpu.lost:  # lost before identified: still a lost series (issue 18)
                    labels = self.identities.recall(gpu.index, self.hostname)
                    # indices shift when a GPU leaves the bus for good: a remembered identity
                    # that another GPU now answers to is not this GPU's
                    if labels is None or labels.get("UUID") in live_uuids:
                        labels = lost_labels(gpu.index, self.hostname)
                else:
                    continue
                fast = gpu.fast.latest()
                slow = gpu.slow.latest()
                rows.append(
                    (
                        gpu,
                        labels,
                        None if fast is None or gpu.lost else fast[1].copy(),
                        None if slow is None or gpu.lost else slow[1].copy(),
                    )
                )
            mig = {
                gpu.index: [(inst.gi_id, inst.profile, inst.ring) for inst in gpu.mig]
                for gpu in s.gpus
                if gpu.mig
            }
            mig_latest = {
                idx: [(gi, prof, _copy(ring.latest())) for gi, prof, ring in insts]
                for idx, insts in mig.items()
            }
            mig_mode = {g.index: bool(g.info is not None and g.info.mig_current) for g in s.gpus}
            xids = {g.index: dict(g.xid_counts) for g in s.gpus}
            last_xid = {g.index: g.last_xid for g in s.gpus}
            errors = {g.index: dict(g.errors) for g in s.gpus}
            flags = {g.index: (g.stalled, g.lost) for g in s.gpus}
            last_duration = s.last_duration_s
            duration_sum = s.duration_sum_s
            ticks = s.ticks
            depth = sum(len(g.fast) + len(g.slow) for g in s.gpus)
        for index, labels in identified:
            self.identities.remember(index, labels)

        for metric in M.DCGM_METRICS:
            fam = Metric(metric.name, metric.help, metric.kind)
            for gpu, labels, fast_row, slow_row in rows:
                mig_on = mig_mode.get(gpu.index, False)
                if mig_on and metric.mig_unsupported:
                    continue  # NVML does not supply it on a MIG-enabled GPU: absent, not 0
                if metric.mig and self._add_instances(
                    fam, metric, labels, mig_latest.get(gpu.index, [])
                ):
                    continue  # the instances carry it: no whole-GPU series to double-count
                row = fast_row if metric.tier == "fast" else slow_row
                if row is None:
                    continue
                raw = float(
                    row[(gpu.fast if metric.tier == "fast" else gpu.slow).index[metric.column]]
                )
                if math.isnan(raw):
                    continue  # unsupported on this GPU: skipped, never a fake 0
                fam.add_sample(metric.name, labels, _value(raw, metric))
            if fam.samples:
                yield fam

        xid_gauge = Metric(M.XID_GAUGE, M.XID_GAUGE_HELP, "gauge")
        xid_counter = Metric(
            M.XID_COUNTER, "XID events seen by the agent, per GPU and XID code.", "counter"
        )
        reasons = Metric(
            M.CLOCK_REASON,
            "Whether each NVML clock-event (throttle) reason is active (1) or not (0).",
            "gauge",
        )
        health_fam = Metric(
            M.GPU_HEALTH, "Health verdict of the GPU: 0 ok, 1 warn, 2 fail, 3 unknown.", "gauge"
        )
        stalled_fam = Metric(
            M.GPU_STALLED, "1 while an NVML call on this GPU has not returned in time.", "gauge"
        )
        lost_fam = Metric(M.GPU_LOST, "1 when the GPU has fallen off the bus.", "gauge")
        err_fam = Metric(M.NVML_ERRORS, "NVML errors seen by the sampler, per kind.", "counter")
        for gpu, labels, fast_row, _slow_row in rows:
            if not gpu.lost:
                xid_gauge.add_sample(M.XID_GAUGE, labels, float(last_xid[gpu.index] or 0))
            for code, n in sorted(xids[gpu.index].items()):
                xid_counter.add_sample(
                    M.XID_COUNTER + "_total", {**labels, "xid": str(code)}, float(n)
                )
            if fast_row is not None:
                mask = fast_row[gpu.fast.index["clock_event_reasons"]]
                if not math.isnan(mask):
                    m = int(mask)
                    for bit, word in _REASON_LABELS.items():
                        reasons.add_sample(
                            M.CLOCK_REASON, {**labels, "reason": word}, float(bool(m & bit))
                        )
            sev = health.gpus.get(gpu.index, health.node if health.node == 3 else 0)
            health_fam.add_sample(M.GPU_HEALTH, labels, float(sev))
            stalled, lost = flags[gpu.index]
            stalled_fam.add_sample(M.GPU_STALLED, labels, float(stalled))
            lost_fam.add_sample(M.GPU_LOST, labels, float(lost))
            for kind, n in sorted(errors[gpu.index].items()):
                err_fam.add_sample(M.NVML_ERRORS + "_total", {**labels, "kind": kind}, float(n))
        for fam in (xid_gauge, xid_counter, reasons, health_fam, stalled_fam, lost_fam, err_fam):
            yield fam

        host = {M.HOST_LABEL: self.hostname}
        node = Metric(
            M.NODE_HEALTH, "Health verdict of the node: 0 ok, 1 warn, 2 fail, 3 unknown.", "gauge"
        )
        node.add_sample(M.NODE_HEALTH, host, float(health.node))
        yield node
        dur = Metric(M.SAMPLE_DURATION, "Wall time of the agent's last sampling round.", "gauge")
        dur.add_sample(M.SAMPLE_DURATION, host, last_duration)
        yield dur
        rounds = Metric(M.TICKS, "Sampling rounds done by the agent.", "counter")
        rounds.add_sample(M.TICKS + "_total", host, float(ticks))
        yield rounds
        dsum = Metric(M.SAMPLE_SECONDS, "Total wall time of all sampling rounds.", "counter")
        dsum.add_sample(M.SAMPLE_SECONDS + "_total", host, duration_sum)
        yield dsum
        depth_fam = Metric(M.BUFFER_DEPTH, "Rows held in the agent's buffers.", "gauge")
        depth_fam.add_sample(M.BUFFER_DEPTH, {**host, "buffer": "ring"}, float(depth))
        if self._extra is not None:
            extras = list(self._extra())
            for e in extras:
                if e.name == M.BUFFER_DEPTH:
                    depth_fam.add_sample(M.BUFFER_DEPTH, {**host, **dict(e.labels)}, e.value)
            yield depth_fam
            for e in extras:
                if e.name == M.BUFFER_DEPTH:
                    continue
                fam = Metric(e.name, e.help, e.kind)
                sample_name = e.name + "_total" if e.kind == "counter" else e.name
                fam.add_sample(sample_name, {**host, **dict(e.labels)}, e.value)
                yield fam
        else:
            yield depth_fam

    @staticmethod
    def _add_instances(
        fam: Metric,
        metric: M.MetricDef,
        labels: dict[str, str],
        instances: list[tuple[int, str, tuple[float, np.ndarray] | None]],
    ) -> bool:
        """One sample per MIG GPU instance (``GPU_I_ID``, ``GPU_I_PROFILE``); whether any."""
        ci = M.MIG_COLUMNS.index(metric.column)
        added = False
        for gi_id, profile, latest in instances:
            if latest is None:
                continue
            v = float(latest[1][ci])
            if math.isnan(v):
                continue
            fam.add_sample(metric.name, _mig_labels(labels, profile, gi_id), _value(v, metric))
            added = True
        return added


def _copy(latest: tuple[float, np.ndarray] | None) -> tuple[float, np.ndarray] | None:
    return None if latest is None else (latest[0], latest[1].copy())


def _mig_labels(labels: dict[str, str], profile: str, gi_id: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in labels.items():
        if k == M.HOST_LABEL:
            out["GPU_I_PROFILE"] = profile
            out["GPU_I_ID"] = str(gi_id)
        out[k] = v
    return out


def make_registry(collector: Collector) -> CollectorRegistry:
    """A fresh registry holding only ``collector`` (no default process/platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n")


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render_text(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of every family, names exactly as collected."""
    out: list[str] = []
    for fam in registry.collect():
        if not fam.samples:
            continue
        name = fam.name
        if fam.type == "counter" and all(s.name != name for s in fam.samples):
            name = name + "_total"
        out.append(f"# HELP {name} {_escape_help(fam.documentation)}\n")
        out.append(f"# TYPE {name} {fam.type}\n")
        for s in fam.samples:
            if s.labels:
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
                out.append(f"{s.name}{{{lab}}} {_fmt(s.value)}\n")
            else:
                out.append(f"{s.name} {_fmt(s.value)}\n")
    return "".join(out).encode()
