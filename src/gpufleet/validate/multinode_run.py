"""Multi-node validation on real nodes: launch the ranks, read rank 0's result, judge it into the
same :class:`~gpufleet.validate.results.ValidationReport` the simulator engine produces
(``multinode_collectives`` with its nccl-tests table under ``collectives["fleet"]``, ``pairwise``
results per node and per bad link, ``pair_matrix``, stragglers).

Expected figures come from the catalog when the ranks' GPUs are a known model
(:func:`gpufleet.validate.pairwise.expected_pair_gbps`); without one (gloo on CPUs) the pairwise
test judges against its peers (:func:`gpufleet.validate.pairwise.peer_reference_gbps`) and only
gross outliers fail (:data:`gpufleet.validate.pairwise.PEER_LIMITS`, unless the thresholds file
sets ``tests.pairwise``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.catalog import GpuModel, load_catalog
from gpufleet.errors import GpufleetError
from gpufleet.validate import analysis, fabric_groups, judge
from gpufleet.validate import thresholds as th
from gpufleet.validate.collectives import row
from gpufleet.validate.fabric_groups import Topology
from gpufleet.validate.launch import Launcher, LaunchSpec, ProcessOutcome
from gpufleet.validate.multinode import RESULT_MARK, SCHEMA
from gpufleet.validate.pairwise import (
    PEER_LIMITS,
    PairSample,
    build_matrix,
    expected_multinode_busbw,
    expected_pair_gbps,
    peer_reference_gbps,
)
from gpufleet.validate.results import Status, TestResult, ValidationReport
from gpufleet.validate.runner import judge_pairs

MULTINODE_TESTS = ("multinode_collectives", "pairwise")
# progress(test, component, status or None when started, message), as the runner's
Progress = Callable[[str, str, Status | None, str], None]


@dataclass
class MultiNodePlan:
    """What to run across the hosts, and how big."""

    hosts: list[str]
    tests: list[str] = field(default_factory=lambda: list(MULTINODE_TESTS))
    ranks_per_node: int = 1
    backend: str = "auto"  # nccl where CUDA is available, else gloo
    min_bytes: int = 8
    max_bytes: int = 8 * 2**30  # nccl-tests -b 8 -e 8G
    iters: int = 5
    pair_bytes: int = 2**30
    pair_iters: int = 10
    pair_serial: bool = False  # True: one pair at a time (default: disjoint pairs at once)
    timeout_s: float = 600.0
    master_addr: str | None = None
    master_port: int = 29500
    env: dict[str, str] = field(default_factory=dict)
    topology: Topology | None = None  # leaf switches and rails to group pairwise results by

    def worker_args(self) -> list[str]:
        wanted = [{"multinode_collectives": "collectives"}.get(t, t) for t in self.tests]
        return [
            "--backend",
            self.backend,
            "--tests",
            ",".join(w for w in wanted if w in ("collectives", "pairwise")),
            "--min-bytes",
            str(self.min_bytes),
            "--max-bytes",
            str(self.max_bytes),
            "--iters",
            str(self.iters),
            "--pair-bytes",
            str(self.pair_bytes),
            "--pair-iters",
            str(self.pair_iters),
            "--timeout-s",
            str(max(30.0, self.timeout_s - 10.0)),
            *(["--pair-serial"] if self.pair_serial else []),
        ]

    def spec(self) -> LaunchSpec:
        return LaunchSpec(
            hosts=tuple(self.hosts),
            ranks_per_node=self.ranks_per_node,
            worker_args=tuple(self.worker_args()),
            master_addr=self.master_addr,
            master_port=self.master_port,
            env=tuple(sorted(self.env.items())),
        )


def parse_outcomes(outcomes: list[ProcessOutcome], launcher: str) -> dict[str, Any]:
    """Rank 0's result from the launched processes' output, or a clear error."""
    for o in outcomes:
        for line in o.stdout.splitlines():
            if line.startswith(RESULT_MARK):
                try:
                    doc: dict[str, Any] = json.loads(line[len(RESULT_MARK) :])
                except json.JSONDecodeError as exc:
                    raise GpufleetError(f"{launcher}: rank 0 wrote a broken result: {exc}") from exc
                if doc.get("schema") != SCHEMA:
                    raise GpufleetError(f"{launcher}: result schema {doc.get('schema')!r}")
                return doc
    bad = [o for o in outcomes if o.returncode != 0] or outcomes
    why = "; ".join(
        f"{o.label}: {'killed at the deadline' if o.returncode is None else f'exit {o.returncode}'}"
        f"{': ' + _tail(o.stderr) if o.stderr.strip() else ''}"
        for o in bad[:4]
    )
    raise GpufleetError(
        f"multi-node validation ({launcher}) produced no result: {why}",
        hint="check that every host can reach MASTER_ADDR:MASTER_PORT and has gpufleet and torch",
    )


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _model(doc: dict[str, Any]) -> GpuModel | None:
    names = {r.get("device") for r in doc.get("ranks", [])}
    if len(names) != 1:
        return None
    name = next(iter(names))
    if not name or name == "cpu":
        return None
    return load_catalog().gpu_by_nvml_name(str(name))


def report_from_result(
    doc: dict[str, Any], plan: MultiNodePlan, thr: th.Thresholds, level: int, engine: str
) -> ValidationReport:
    """Judge rank 0's result document into a ValidationReport."""
    t0 = time.time()
    report = ValidationReport(engine=engine, level=level, tests=list(plan.tests), started_s=t0)
    nodes: list[str] = list(doc["nodes"])
    world = int(doc["world_size"])
    rpn = max(1, world // max(1, len(nodes)))
    model = _model(doc)
    key = model.key if model else "unknown"
    details = {"backend": doc["backend"], "ranks": world, "torch": doc.get("torch_version")}
    if "multinode_collectives" in plan.tests:
        rows = [
            row(c["op"], int(c["size_bytes"]), float(c["seconds"]), world)
            for c in doc["collectives"]
        ]
        exp = expected_multinode_busbw(model, rpn, len(nodes)) if model else None
        res = judge.collectives("fleet", "multinode_collectives", rows, world, exp, thr)
        res.details.update(details, nodes=nodes)
        report.collectives["fleet"] = rows
        report.results.append(res)
    if "pairwise" in plan.tests:
        samples = [PairSample(**s) for s in doc["pairs"]]
        matrix = build_matrix(nodes, samples)
        report.pair_matrix = matrix
        missing = [
            f"{a}<->{b}" for i, a in enumerate(nodes) for b in nodes[i + 1 :] if b not in matrix[a]
        ]
        if missing:
            raise GpufleetError(f"pairwise: no measurement for {missing}")
        if model:
            expected, pthr = expected_pair_gbps(model, rpn), thr
        else:
            expected = peer_reference_gbps(matrix)
            per = dict(thr.per_test)
            per.setdefault("pairwise", PEER_LIMITS)
            pthr = replace(thr, per_test=per)
            report.notes.append(
                f"pairwise: no catalog figure for these devices; judged against the peers' "
                f"median link {expected:.3f} GB/s (fail below "
                f"{pthr.limits('pairwise').pass_fraction:.0%} of it)"
            )
        if doc.get("rechecked"):
            report.notes.append(
                f"pairwise: measured twice (slow the first time), the better pass kept: "
                f"{', '.join(doc['rechecked'])}"
            )
        pair_results = judge_pairs(matrix, nodes, expected, pthr)
        for r in pair_results:
            r.details.update(details)
        rails = plan.topology is not None and plan.topology.rails
        by_rail, by_node = fabric_groups.port_gbps, fabric_groups.node_port_gbps
        ports = by_rail(samples) if rails else by_node(matrix)
        # a rail carries one rank's share; without a catalog figure the ports judge each other
        port_expected = (expected / rpn if rails else expected) if model else None
        grouped, notes = fabric_groups.group(
            ports, plan.topology, port_expected, pthr.limits("pairwise").pass_fraction
        )
        report.notes.extend(notes)
        report.results.extend(fabric_groups.apply(pair_results, grouped))
    if doc.get("slow_send_hook"):
        report.notes.append(f"test hook active: GPUFLEET_TEST_SLOW_SEND={doc['slow_send_hook']}")
    report.notes.append(
        "multi-node run: per-GPU tests (levels 1-3) run on each node with "
        "`gpufleet validate --level N` there (e.g. under srun)"
    )
    models = {n: key for n in nodes}
    obs = analysis.observations_from(report.results, models)
    report.stragglers = analysis.find_stragglers(obs, thr.straggler_z, thr.straggler_min_deviation)
    return report


def _noop(test: str, component: str, status: Status | None, message: str) -> None:
    return None


def run_multinode(
    launcher: Launcher,
    plan: MultiNodePlan,
    thr: th.Thresholds | None = None,
    level: int = 3,
    progress: Progress = _noop,
) -> ValidationReport:
    """Launch the ranks on the hosts, wait (bounded by ``plan.timeout_s``), judge the result."""
    thr = thr or th.Thresholds()
    if not plan.tests:
        raise GpufleetError("multi-node validation: no multi-node test selected")
    wall0 = time.monotonic()
    for t in plan.tests:
        progress(t, "fleet", None, f"{len(plan.hosts)} nodes via {launcher.name}")
    outcomes = launcher.run(plan.spec(), plan.timeout_s)
    doc = parse_outcomes(outcomes, launcher.name)
    report = report_from_result(doc, plan, thr, level, engine=f"torch-{doc['backend']}")
    for r in report.results:
        progress(r.test, r.component, r.status, r.message)
    report.wall_s = report.duration_s = time.monotonic() - wall0
    return report


def run_for_cli(
    hosts: list[str],
    *,
    launcher: str,
    level: int,
    only: list[str],
    skip: list[str],
    thr: th.Thresholds,
    ranks_per_node: int | None = None,
    master_addr: str | None = None,
    progress: Progress = _noop,
    topology: Topology | None = None,
) -> ValidationReport:
    """What ``gpufleet validate --nodes/--slurm`` runs on real nodes."""
    import os

    from gpufleet.errors import UsageError
    from gpufleet.validate.launch import DEFAULT_MASTER_PORT, make_launcher, slurm_port
    from gpufleet.validate.suite import select_tests

    tests = [t for t in select_tests(level, only, skip, multi_node=True) if t in MULTINODE_TESTS]
    if not tests:
        raise UsageError(
            "multi-node validation runs multinode_collectives and pairwise: use --level 3 or "
            "--only pairwise,multinode_collectives",
            hint="per-GPU tests run on each node: srun gpufleet validate --level 2",
        )
    rpn = ranks_per_node or _default_ranks_per_node(launcher)
    port_env = os.environ.get("MASTER_PORT", "")
    if port_env.isdigit():
        port = int(port_env)
    elif launcher == "slurm":
        port = slurm_port(os.environ.get("SLURM_JOB_ID"))
    else:  # ssh; the local launcher meets through a file
        port = DEFAULT_MASTER_PORT
    plan = MultiNodePlan(
        hosts=hosts,
        tests=tests,
        ranks_per_node=rpn,
        master_addr=master_addr,
        master_port=port,
        topology=topology,
    )
    return run_multinode(make_launcher(launcher), plan, thr, level, progress)


def _default_ranks_per_node(launcher: str) -> int:
    """Slurm's tasks per node inside an allocation, else this host's CUDA GPUs, else 1."""
    import os

    v = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    if launcher == "slurm" and v.isdigit():
        return int(v)
    try:
        import torch

        n = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except ImportError:
        n = 0
    return max(1, n)


__all__ = [
    "MULTINODE_TESTS",
    "MultiNodePlan",
    "TestResult",
    "parse_outcomes",
    "report_from_result",
    "run_for_cli",
    "run_multinode",
]
