"""Run a suite: level 1 checks on every node, the engine's device tests, thresholds, fleet
analysis (stragglers, pairwise matrix), one ValidationReport."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.catalog import GpuModel
from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.deadline import with_deadlines
from gpufleet.devices.types import Sample
from gpufleet.validate import analysis, checks_quick, fabric_groups
from gpufleet.validate import thresholds as th
from gpufleet.validate.fabric_groups import Topology
from gpufleet.validate.judge import Target
from gpufleet.validate.nvlink import link_errors, nvlink_pairs
from gpufleet.validate.results import (
    CollectiveRow,
    GpuEnv,
    Metric,
    Status,
    TestResult,
    TracePoint,
    ValidationReport,
)
from gpufleet.validate.suite import TESTS

DEFAULT_STRESS_S = 900.0  # level 3: about 15 minutes per node
DEFAULT_POWER_S = 120.0

# progress(test, component, status or None when started, message)
Progress = Callable[[str, str, Status | None, str], None]


class Engine(Protocol):
    """What the runner needs from an engine (simulator or PyTorch)."""

    name: str

    def backends(self) -> dict[str, GpuBackend]: ...
    def now(self) -> float: ...
    def cuda_usable(self, node: str, gpu: int) -> tuple[bool, str]: ...
    def pcie_bandwidth(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]: ...
    def hbm_bandwidth(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]: ...
    def memory(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]: ...
    def matmul(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]: ...
    def nvlink_p2p(self, node: str, targets: list[Target]) -> dict[int, dict[int, float]]: ...
    def stress(
        self,
        targets: list[Target],
        thr: th.Thresholds,
        duration_s: float,
        traces_out: dict[str, list[TracePoint]],
    ) -> list[TestResult]: ...
    def targeted_power(
        self, targets: list[Target], thr: th.Thresholds, duration_s: float
    ) -> list[TestResult]: ...
    def collectives(
        self, node: str, targets: list[Target], thr: th.Thresholds
    ) -> tuple[TestResult, list[CollectiveRow]]: ...
    def multinode_collectives(
        self, by_node: dict[str, list[Target]], thr: th.Thresholds
    ) -> tuple[TestResult, list[CollectiveRow]]: ...
    def pairwise(self, nodes: list[str]) -> dict[str, dict[str, float]]: ...


@dataclass
class RunOptions:
    """How to run: which tests, level, durations, GPUs, thresholds."""

    tests: list[str]
    level: int = 1
    stress_s: float = DEFAULT_STRESS_S
    power_s: float = DEFAULT_POWER_S
    gpus: list[int] | None = None
    thresholds: th.Thresholds = field(default_factory=th.Thresholds)
    topology: Topology | None = None  # leaf switches (and rails) to group pairwise results by


def _noop(test: str, component: str, status: Status | None, message: str) -> None:
    return None


GPU_TESTS_L2 = ("pcie_bandwidth", "hbm_bandwidth", "memory", "matmul")


def _readiness(engine: str, node: str, backend: GpuBackend) -> TestResult:
    """Level 1's readiness result: this host's driver, CUDA, container, GPUDirect, network and
    host checks (`gpufleet.readiness`); skipped on simulated nodes, which are not this host."""
    if engine == "sim":
        return TestResult(
            "readiness", node, Status.SKIP, "simulated node: readiness reads this host, not it"
        )
    from gpufleet.readiness.run import nvml_facts, readiness_test_result, run_readiness

    return readiness_test_result(node, run_readiness(nvml=nvml_facts(backend)))


def run_suite(engine: Engine, opts: RunOptions, progress: Progress = _noop) -> ValidationReport:
    """Run the selected tests on every node the engine serves."""
    wall0 = time.monotonic()
    t0 = engine.now()
    report = ValidationReport(
        engine=engine.name, level=opts.level, tests=list(opts.tests), started_s=t0
    )
    thr = opts.thresholds
    wanted = set(opts.tests)
    # Level 1 reads through NVML deadlines, one set per node shared by its checks: a hung GPU
    # costs one deadline in all (`gpufleet.devices.deadline`).
    backends = {n: with_deadlines(b) for n, b in engine.backends().items()}
    states: dict[str, list[checks_quick.GpuState]] = {}
    for node, backend in backends.items():
        states[node] = checks_quick.read_node(backend, opts.gpus)
        for s in states[node]:
            if s.info is not None:
                i = s.info
                report.env.append(
                    GpuEnv(
                        node,
                        s.index,
                        i.uuid,
                        i.name,
                        i.model,
                        i.driver_version,
                        i.cuda_driver_version,
                        i.vbios_version,
                        i.serial,
                        i.pci_bus_id,
                    )
                )
    drivers = [e.driver_version for e in report.env if e.driver_version]
    fleet_driver = max(set(drivers), key=drivers.count) if drivers else None

    def add(results: list[TestResult]) -> None:
        for r in results:
            report.results.append(r)
            progress(r.test, r.component, r.status, r.message)

    # ----- level 1 -------------------------------------------------------------------------
    gpu_l1 = {n for n in wanted if TESTS[n].level == 1 and TESTS[n].scope == "gpu"}
    gpu_l1.discard("health_rules")  # per node below, with the node's events
    for node, sts in states.items():
        if "software" in wanted:
            progress("software", node, None, "")
            add([checks_quick.check_software(node, sts, engine.cuda_usable, fleet_driver)])
        for s in sts:
            if gpu_l1:
                add(checks_quick.check_gpu(s, thr, gpu_l1))
        if "health_rules" in wanted:
            # The same rules and input as `gpufleet health` (a sample window and the events):
            # a fail finding there fails validation at every level.
            progress("health_rules", node, None, "")
            add(
                checks_quick.health_rules(
                    backends[node],
                    gpus=opts.gpus,
                    sleep=getattr(engine, "sleep", time.sleep),
                    clock=engine.now,
                )
            )
        if "readiness" in wanted:
            progress("readiness", node, None, "")
            add([_readiness(engine.name, node, backends[node])])
    for backend in backends.values():
        backend.release()

    # ----- device tests on every readable GPU ------------------------------------------------
    from gpufleet.catalog import load_catalog

    cat = load_catalog()
    targets: list[Target] = []
    for node, sts in states.items():
        for s in sts:
            if s.info is None:
                continue
            model: GpuModel | None = cat.find_gpu(s.info.model) if s.info.model else None
            targets.append(Target(node, s.index, model))
    by_node: dict[str, list[Target]] = {}
    for t in targets:
        by_node.setdefault(t.node, []).append(t)

    def phase(name: str, fn: Callable[[], list[TestResult]]) -> None:
        if name in wanted and targets:
            progress(name, "*", None, "")
            add(fn())

    phase("pcie_bandwidth", lambda: engine.pcie_bandwidth(targets, thr))
    phase("hbm_bandwidth", lambda: engine.hbm_bandwidth(targets, thr))
    phase("memory", lambda: engine.memory(targets, thr))
    phase("matmul", lambda: engine.matmul(targets, thr))
    if "nvlink_p2p" in wanted:
        for node, ts in by_node.items():
            add(_nvlink_p2p(engine, node, ts, thr, progress, backends.get(node)))
        for backend in backends.values():
            backend.release()
    phase("stress", lambda: engine.stress(targets, thr, opts.stress_s, report.traces))
    phase("targeted_power", lambda: engine.targeted_power(targets, thr, opts.power_s))
    if "collectives" in wanted:
        for node, ts in by_node.items():
            if len(ts) < 2:
                add([TestResult("collectives", node, Status.SKIP, "fewer than 2 GPUs")])
                continue
            progress("collectives", node, None, "")
            res, rows = engine.collectives(node, ts, thr)
            report.collectives[node] = rows
            add([_explain_collective(res, report.results)])
    multi = len(by_node) > 1
    if "multinode_collectives" in wanted and multi:
        progress("multinode_collectives", "fleet", None, "")
        res, rows = engine.multinode_collectives(by_node, thr)
        report.collectives["fleet"] = rows
        add([res])
    if "pairwise" in wanted and multi:
        progress("pairwise", "fleet", None, "")
        add(_pairwise(engine, sorted(by_node), by_node, thr, report, opts.topology))

    # ----- fleet analysis ------------------------------------------------------------------
    models = {f"{t.node}/gpu{t.gpu}": (t.model.key if t.model else "unknown") for t in targets}
    for node, ts in by_node.items():
        models[node] = ts[0].model.key if ts[0].model else "unknown"
    # a node figure already put down to one of its GPUs (`_explain_collective`) is that
    # GPU's straggler line, not a second one for the node
    obs = analysis.observations_from(
        [
            r
            for r in report.results
            if r.test in TESTS and TESTS[r.test].level > 1 and "slowed_by" not in r.details
        ],
        models,
    )
    report.stragglers = analysis.find_stragglers(obs, thr.straggler_z, thr.straggler_min_deviation)
    report.duration_s = engine.now() - t0
    report.wall_s = time.monotonic() - wall0
    return report


def _nvlink_p2p(
    engine: Engine,
    node: str,
    ts: list[Target],
    thr: th.Thresholds,
    progress: Progress,
    backend: GpuBackend | None = None,
) -> list[TestResult]:
    """Every GPU pair of a node over NVLink, judged against the catalog's NVLink bandwidth x the
    peer-copy efficiency (`gpufleet.catalog.performance.p2p_gbps`)."""
    model = ts[0].model
    expected = th.expected_p2p_gbps(model) if model else None
    if len(ts) < 2:
        return [TestResult("nvlink_p2p", node, Status.SKIP, "fewer than 2 GPUs")]
    if model is not None and expected is None:
        return [TestResult("nvlink_p2p", node, Status.SKIP, f"{model.key} has no NVLink")]
    progress("nvlink_p2p", node, None, "")
    gpus = [t.gpu for t in ts]
    before = _slow_samples(backend, gpus)
    matrix = engine.nvlink_p2p(node, ts)
    after = _slow_samples(backend, gpus)
    errors = {g: link_errors(before.get(g), after.get(g)) for g in gpus}
    return nvlink_pairs(node, matrix, expected, thr, errors)


def _explain_collective(res: TestResult, results: list[TestResult]) -> TestResult:
    """A node's collective waits for its slowest GPU: where it is below its pass line and the
    node's NVLink test named bad GPUs (or GPU pairs), the result says which, with their links."""
    if res.status is Status.PASS:
        return res
    named = [
        r
        for r in results
        if r.test == "nvlink_p2p" and r.node == res.node and r.status is Status.FAIL
    ]
    if not named:
        return res
    parts = []
    for r in named:
        links = r.details.get("links")
        parts.append(r.component + (f" (NVLink {', '.join(map(str, links))})" if links else ""))
    res.message += f"; slowed by {', '.join(parts)}: see nvlink_p2p"
    res.details["slowed_by"] = [r.component for r in named]
    return res


def _slow_samples(backend: GpuBackend | None, gpus: list[int]) -> dict[int, Sample]:
    """Each GPU's slow-tier sample (its per-link NVLink counters), within one NVML deadline;
    a GPU that does not answer is left out (its links are then not named)."""
    if backend is None:
        return {}
    got = with_deadlines(backend).each("sample_slow", gpus)
    return {g: s for g, s in got.items() if isinstance(s, Sample)}


def _pairwise(
    engine: Engine,
    nodes: list[str],
    by_node: dict[str, list[Target]],
    thr: th.Thresholds,
    report: ValidationReport,
    topology: Topology | None = None,
) -> list[TestResult]:
    matrix = engine.pairwise(nodes)
    report.pair_matrix = matrix
    model = by_node[nodes[0]][0].model
    expected = th.node_network_gbps(model, len(by_node[nodes[0]])) if model else 0.0
    results = judge_pairs(matrix, nodes, expected, thr)
    if topology is not None and topology.rails:
        report.notes.append(
            f"pairwise: {topology.source} maps rails, but this engine measures whole nodes; "
            "not grouped by leaf or rail"
        )
        return results
    grouped, notes = fabric_groups.group(
        fabric_groups.node_port_gbps(matrix),
        topology,
        expected,
        thr.limits("pairwise").pass_fraction,
    )
    report.notes.extend(notes)
    return fabric_groups.apply(results, grouped)


def judge_pairs(
    matrix: dict[str, dict[str, float]], nodes: list[str], expected: float, thr: th.Thresholds
) -> list[TestResult]:
    """Pairwise results from a bandwidth matrix (GB/s): one per node, one per bad link."""
    lim = thr.limits("pairwise")
    verdict = analysis.analyse_pairs(matrix, expected, lim.pass_fraction)
    out: list[TestResult] = []
    for n in nodes:
        vals = sorted(v for p, v in matrix[n].items() if p != n)
        med = vals[len(vals) // 2] if vals else 0.0
        m = thr.judge("pairwise", "median_link", med, expected, "GB/s")
        if n in verdict.bad_nodes:
            m.status = Status.FAIL
            msg = (
                f"every link of {n} is slow: median {med:.1f} GB/s, expected "
                f"{expected:.1f} GB/s (the node's NICs or cabling)"
            )
        else:
            msg = f"median link {med:.1f} GB/s over {len(vals)} peers"
        out.append(TestResult("pairwise", n, m.status, msg, metrics=[m]))
    for link in verdict.bad_links:
        a, b = link.split("<->")
        v = matrix[a][b]
        m = Metric("bandwidth", v, "GB/s", expected, lim.pass_fraction * expected, Status.FAIL)
        out.append(
            TestResult(
                "pairwise",
                a,
                Status.FAIL,
                f"link {link} at {v:.1f} GB/s, expected {expected:.1f} GB/s",
                link=link,
                metrics=[m],
            )
        )
    return out
