"""Level 1 checks (seconds): software and health of every GPU, through the GpuBackend.

Both engines run these: they read NVML (real or simulated) through the production backend and
never change a setting. ``cuda_usable`` is the engine's answer to "can CUDA run a kernel here".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.deadline import with_deadlines
from gpufleet.devices.discovery import read_each
from gpufleet.devices.types import DeviceInfo, Sample
from gpufleet.errors import DeviceError
from gpufleet.validate.results import Status, TestResult
from gpufleet.validate.thresholds import Thresholds

CudaProbe = Callable[[str, int], tuple[bool, str]]
HEALTH_WINDOW_S = 3.0  # as `gpufleet health --duration`


@dataclass
class GpuState:
    """What level 1 read from one GPU (``error`` when it could not be read)."""

    node: str
    index: int
    info: DeviceInfo | None
    sample: Sample | None
    processes: list[int] | None = None
    error: str | None = None


def running_processes(backend: GpuBackend, index: int) -> list[int] | None:
    """PIDs of compute processes on a GPU (None where the backend cannot tell).

    Backends without a process list (``running_processes``) answer None.
    """
    lister = getattr(backend, "running_processes", None)
    if lister is None:
        return None
    procs: list[tuple[int, int | None]] | None = lister(index)
    return None if procs is None else [pid for pid, _ in procs]


def read_node(backend: GpuBackend, gpus: list[int] | None = None) -> list[GpuState]:
    """Read identity, one sample and the process list of each selected GPU of a node, all
    GPUs at once under NVML deadlines (a hung GPU is a state with its error, within seconds)."""
    bounded = with_deadlines(backend)
    try:
        selected = [i for i in range(bounded.device_count()) if gpus is None or i in gpus]
        # The first event poll (it registers every GPU) runs alongside: its events wait in
        # `bounded` for the health rules, and a hung GPU stalls both within one deadline.
        infos = bounded.each("device_info", selected, poll_events=True)
        readable = [i for i in selected if not isinstance(infos[i], DeviceError)]
        samples = read_each(bounded, "sample", readable)
        procs = read_each(bounded, "running_processes", readable)
    finally:
        if bounded is not backend:
            bounded.release()
    states: list[GpuState] = []
    for i in selected:
        info, sample = infos[i], samples.get(i)
        error = next((v for v in (info, sample) if isinstance(v, DeviceError)), None)
        if error is not None or sample is None:
            states.append(GpuState(backend.node_name, i, None, None, error=str(error)))
            continue
        listed = procs.get(i)
        pids = None if listed is None or isinstance(listed, DeviceError) else [p for p, _ in listed]
        states.append(GpuState(backend.node_name, i, info, sample, pids))
    return states


def _r(test: str, st: GpuState, status: Status, msg: str, **details: Any) -> TestResult:
    return TestResult(test, st.node, status, msg, gpu=st.index, details=dict(details))


def check_gpu(st: GpuState, thr: Thresholds, tests: set[str]) -> list[TestResult]:
    """The per-GPU level 1 checks that were asked for."""
    out: list[TestResult] = []
    if st.info is None or st.sample is None:
        for t in sorted(tests):
            out.append(_r(t, st, Status.FAIL, f"GPU unreadable: {st.error}"))
        return out
    info, s = st.info, st.sample
    if "persistence" in tests:
        on = info.persistence_mode
        out.append(
            _r(
                "persistence",
                st,
                Status.PASS if on or on is None else Status.FAIL,
                "persistence mode on"
                if on
                else "persistence mode OFF (nvidia-smi -pm 1)"
                if on is False
                else "persistence mode not reported",
                persistence_mode=on,
            )
        )
    if "ecc" in tests:
        ecc = info.ecc_current
        if ecc is False:
            out.append(_r("ecc", st, Status.FAIL, "ECC is disabled", ecc_current=ecc))
        elif info.ecc_pending is not None and info.ecc_pending != ecc:
            out.append(_r("ecc", st, Status.WARN, "ECC mode change pending a reset"))
        else:
            out.append(_r("ecc", st, Status.PASS, "ECC enabled", ecc_current=ecc))
    if "row_remap" in tests:
        if s.remap_failure:
            out.append(_r("row_remap", st, Status.FAIL, "row remapping FAILED: replace the GPU"))
        elif s.remap_pending:
            out.append(
                _r(
                    "row_remap",
                    st,
                    Status.FAIL,
                    "row remap pending: reset the GPU before use",
                    remapped_rows_correctable=s.remapped_rows_correctable,
                    remapped_rows_uncorrectable=s.remapped_rows_uncorrectable,
                )
            )
        else:
            out.append(_r("row_remap", st, Status.PASS, "no pending remap, no remap failure"))
    if "retired_pages" in tests:
        pages = (s.retired_pages_sbe or 0) + (s.retired_pages_dbe or 0)
        if s.retired_pages_sbe is None and s.retired_pages_dbe is None:
            out.append(_r("retired_pages", st, Status.PASS, "not reported (row remapping GPU)"))
        elif pages >= thr.retired_pages_limit:
            out.append(
                _r(
                    "retired_pages",
                    st,
                    Status.FAIL,
                    f"{pages} retired pages >= {thr.retired_pages_limit} (RMA limit)",
                )
            )
        elif s.retired_pages_pending:
            out.append(_r("retired_pages", st, Status.WARN, "page retirement pending a reset"))
        else:
            out.append(_r("retired_pages", st, Status.PASS, f"{pages} retired pages"))
    if "pcie_link" in tests:
        g, gm = info.pcie_gen_current, info.pcie_gen_max
        w, wm = info.pcie_width_current, info.pcie_width_max
        link = f"Gen{g} x{w}"
        if (g is not None and gm is not None and g < gm) or (
            w is not None and wm is not None and w < wm
        ):
            out.append(
                _r(
                    "pcie_link",
                    st,
                    Status.FAIL,
                    f"PCIe link {link}, below its max Gen{gm} x{wm}",
                    gen=g,
                    width=w,
                    gen_max=gm,
                    width_max=wm,
                )
            )
        else:
            out.append(_r("pcie_link", st, Status.PASS, f"PCIe link {link}", gen=g, width=w))
    if "mig_mode" in tests:
        mig = info.mig_current
        if thr.expect_mig is None or mig is None or mig == thr.expect_mig:
            word = "n/a" if mig is None else "on" if mig else "off"
            out.append(_r("mig_mode", st, Status.PASS, f"MIG {word}"))
        else:
            out.append(
                _r(
                    "mig_mode",
                    st,
                    Status.FAIL,
                    f"MIG is {'on' if mig else 'off'}, "
                    f"expected {'on' if thr.expect_mig else 'off'}",
                )
            )
    if "processes" in tests:
        if st.processes:
            out.append(
                _r(
                    "processes",
                    st,
                    Status.FAIL,
                    f"{len(st.processes)} process(es) already on the GPU: pids {st.processes}",
                    pids=st.processes,
                )
            )
        else:
            out.append(_r("processes", st, Status.PASS, "no compute processes"))
    return out  # "health_rules" runs per node (`health_rules`), with the node's events


def health_rules(
    backend: GpuBackend,
    *,
    gpus: list[int] | None = None,
    duration_s: float = HEALTH_WINDOW_S,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> list[TestResult]:
    """The same health rules as ``gpufleet health``, on the same input: a window of samples
    (``collect_node``, with its NVML deadlines) and the node's events (XIDs), judged by a
    `HealthTracker` with the default rule settings. One result per GPU (its findings: a fail
    finding fails the GPU) and one for the node when node-wide rules found something."""
    from gpufleet.health import HealthTracker, Severity, collect_node

    node = backend.node_name
    data = collect_node(backend, duration_s=duration_s, sleep=sleep, clock=clock)
    report = HealthTracker(None, clock=clock).evaluate(data)

    def result(component_gpu: int | None, findings: list[Any]) -> TestResult:
        worst = max((f.severity for f in findings), default=Severity.OK)
        status = (
            Status.FAIL
            if worst == Severity.FAIL
            else Status.WARN
            if worst == Severity.WARN
            else Status.PASS
        )
        return TestResult(
            "health_rules",
            node,
            status,
            "; ".join(f"{f.code}: {f.message}" for f in findings) or "no findings",
            gpu=component_gpu,
            details={"codes": [f.code for f in findings]},
        )

    relevant = [f for f in report.findings if f.severity in (Severity.WARN, Severity.FAIL)]
    out = [
        result(g.index, [f for f in relevant if f.gpu_index == g.index])
        for g in data.gpus
        if gpus is None or g.index in gpus
    ]
    node_findings = [f for f in relevant if f.gpu_index is None]
    if node_findings:
        out.append(result(None, node_findings))
    return out


def check_software(
    node: str, states: list[GpuState], cuda: CudaProbe, fleet_driver: str | None
) -> TestResult:
    """NVML loads, versions match (within the node and with the fleet), CUDA usable."""
    problems: list[str] = []
    warn: list[str] = []
    infos = [s.info for s in states if s.info is not None]
    for s in states:
        if s.info is None:
            problems.append(f"GPU {s.index} unreadable: {s.error}")
    drivers = Counter(i.driver_version for i in infos)
    if len(drivers) > 1:
        problems.append(f"driver versions differ: {dict(drivers)}")
    driver = next(iter(drivers), None)
    if fleet_driver is not None and driver is not None and driver != fleet_driver:
        problems.append(f"driver {driver} differs from the fleet's {fleet_driver}")
    by_model: dict[str | None, set[str | None]] = {}
    for i in infos:
        by_model.setdefault(i.model, set()).add(i.vbios_version)
    for model, vb in by_model.items():
        if len(vb) > 1:
            warn.append(f"VBIOS versions differ among {model}: {sorted(map(str, vb))}")
    for s in states:
        if s.info is None:
            continue
        ok, why = cuda(node, s.index)
        if not ok:
            problems.append(f"CUDA unusable on GPU {s.index}: {why}")
    cuda_v = next((i.cuda_driver_version for i in infos), None)
    details = {"driver_version": driver, "cuda_driver_version": cuda_v, "gpus": len(states)}
    if problems:
        return TestResult("software", node, Status.FAIL, "; ".join(problems), details=details)
    if warn:
        return TestResult("software", node, Status.WARN, "; ".join(warn), details=details)
    return TestResult(
        "software",
        node,
        Status.PASS,
        f"{len(states)} GPU(s), driver {driver}, CUDA {cuda_v}, CUDA usable",
        details=details,
    )
