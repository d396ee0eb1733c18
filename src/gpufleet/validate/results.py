"""Result objects of a validation run, the same for the simulator and the PyTorch engine.

The JSON form (``ValidationReport.to_dict``) is versioned (``schema``) and documented in
``docs/validate.md``; a control plane maps ``status`` (pass/warn/fail) to node lifecycle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpufleet.errors import ConfigError
from gpufleet.jsonable import to_jsonable

SCHEMA = "gpufleet.validate/v1"


class Status(StrEnum):
    """Outcome of one test or of a whole run; ``exit_code`` is what the CLI returns."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"

    @property
    def rank(self) -> int:
        return {"skip": 0, "pass": 0, "warn": 1, "fail": 2}[self.value]

    @property
    def exit_code(self) -> int:
        return self.rank


def worst(statuses: list[Status]) -> Status:
    """The most serious status; PASS for an empty list."""
    out = Status.PASS
    for s in statuses:
        if s.rank > out.rank:
            out = s
    return out


@dataclass
class Metric:
    """One measured figure, with what was expected and the pass line."""

    name: str
    value: float
    unit: str
    expected: float | None = None
    pass_min: float | None = None  # pass at value >= pass_min (higher is better)
    status: Status = Status.PASS

    @property
    def ratio(self) -> float | None:
        return None if not self.expected else self.value / self.expected


@dataclass
class TestResult:
    """One test on one component: a GPU (``gpu`` set), a node, or a link ``a<->b``."""

    __test__ = False  # not a pytest test class

    test: str
    node: str
    status: Status
    message: str
    gpu: int | None = None
    link: str | None = None
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def component(self) -> str:
        if self.link:
            return self.link
        return self.node if self.gpu is None else f"{self.node}/gpu{self.gpu}"

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


@dataclass(frozen=True)
class Straggler:
    """A component far from its peers of the same model on one figure (robust z-score)."""

    test: str
    metric: str
    component: str  # "node/gpuN", "node" or "a<->b"
    model: str
    value: float
    median: float
    mad: float
    z: float
    deviation_pct: float  # (value - median) / median x 100


@dataclass(frozen=True)
class GpuEnv:
    """Environment of one GPU: what it is and what runs it."""

    node: str
    index: int
    uuid: str
    name: str
    model: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    vbios_version: str | None
    serial: str | None = None
    pci_bus_id: str | None = None


@dataclass
class TracePoint:
    """One sample of the stress run's trace."""

    t_s: float
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: int | None
    reasons: int | None


@dataclass
class CollectiveRow:
    """One line of an nccl-tests style table."""

    op: str
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass
class ValidationReport:
    """Everything one run produced; ``status``/``exit_code`` summarise it."""

    engine: str
    level: int
    tests: list[str]
    started_s: float
    results: list[TestResult] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    env: list[GpuEnv] = field(default_factory=list)
    traces: dict[str, list[TracePoint]] = field(default_factory=dict)  # component -> points
    collectives: dict[str, list[CollectiveRow]] = field(default_factory=dict)  # scope -> rows
    pair_matrix: dict[str, dict[str, float]] = field(default_factory=dict)  # GB/s
    duration_s: float = 0.0  # device (or simulated) seconds
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> Status:
        s = worst([r.status for r in self.results])
        if s is Status.PASS and self.stragglers:
            return Status.WARN
        return s

    @property
    def exit_code(self) -> int:
        return self.status.exit_code

    def by_component(self) -> dict[str, Status]:
        """Worst status per GPU, node or link (stragglers count as warn)."""
        out: dict[str, Status] = {}
        for r in self.results:
            out[r.component] = worst([out.get(r.component, Status.PASS), r.status])
        for s in self.stragglers:
            out[s.component] = worst([out.get(s.component, Status.PASS), Status.WARN])
        return out

    def node_status(self) -> dict[str, Status]:
        """Worst status per node (GPU and link results count for their nodes)."""
        out: dict[str, Status] = {}
        for comp, st in self.by_component().items():
            nodes = comp.split("<->") if "<->" in comp else [comp.split("/")[0]]
            for n in nodes:
                out[n] = worst([out.get(n, Status.PASS), st])
        return out

    def failures(self) -> list[TestResult]:
        return [r for r in self.results if r.status in (Status.FAIL, Status.WARN)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"schema": SCHEMA, "status": self.status.value, "exit_code": self.exit_code, **d}
        d["nodes"] = {k: v.value for k, v in sorted(self.node_status().items())}
        return to_jsonable(d)  # type: ignore[no-any-return]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def write_json(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<result>") -> ValidationReport:
        """Read a result file back (the control plane's ingest path)."""
        if d.get("schema") != SCHEMA:
            raise ConfigError(f"{source}: schema {d.get('schema')!r} is not {SCHEMA!r}")
        try:
            results = [
                TestResult(
                    **{k: v for k, v in r.items() if k not in ("metrics", "status")},
                    status=Status(r["status"]),
                    metrics=[Metric(**{**m, "status": Status(m["status"])}) for m in r["metrics"]],
                )
                for r in d["results"]
            ]
            return cls(
                engine=d["engine"],
                level=int(d["level"]),
                tests=list(d["tests"]),
                started_s=float(d["started_s"]),
                results=results,
                stragglers=[Straggler(**s) for s in d["stragglers"]],
                env=[GpuEnv(**e) for e in d["env"]],
                traces={k: [TracePoint(**p) for p in v] for k, v in d["traces"].items()},
                collectives={
                    k: [CollectiveRow(**c) for c in v] for k, v in d["collectives"].items()
                },
                pair_matrix=d["pair_matrix"],
                duration_s=float(d["duration_s"]),
                wall_s=float(d["wall_s"]),
                notes=list(d["notes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: not a gpufleet validation result: {exc}") from exc
