"""The validation report as it travels: the JSON file `gpufleet validate --out` writes, the
control plane reads and an operator posts (`docs/validate.md`), and the record types the
validation engines build it from.

One serialiser: ``REPORT`` (a pydantic ``TypeAdapter`` over the dataclasses) reads a file back
with every field checked and the first problem named by its path; ``to_dict`` writes through
the one NaN-to-null cleaner (`gpufleet.jsonable`), and a ``null`` figure reads back as NaN (a
value nobody measured is never a fake 0).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, TypeAdapter, ValidationError

from gpufleet.errors import ConfigError
from gpufleet.jsonable import to_jsonable
from gpufleet.wire.problems import reason


def _null_is_nan(value: object) -> object:
    return math.nan if value is None else value


#: A measured figure in the file: ``null`` (written for NaN) reads back as NaN.
Figure = Annotated[float, BeforeValidator(_null_is_nan)]

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
    value: Figure
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
    value: Figure
    median: Figure
    mad: Figure
    z: Figure
    deviation_pct: Figure  # (value - median) / median x 100
    # One straggler line per component: its worst figure above, every other figure that is also
    # far from its peers here ("test/metric -14.9 % (z -9.8)").
    also: list[str] = field(default_factory=list)


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
    time_us: Figure
    algbw_gbps: Figure
    busbw_gbps: Figure


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
            nodes = {side.split("/")[0] for side in comp.split("<->")}
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
        """Read a result file back (the control plane's ingest path); a bad field raises
        `ConfigError` naming the file and the field's path."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise ConfigError(f"{source}: schema {got!r} is not {SCHEMA!r}")
        fields = {k: v for k, v in d.items() if k not in _DERIVED}
        try:
            return REPORT.validate_python(fields)
        except ValidationError as exc:
            raise ConfigError(f"{source}: not a gpufleet validation result: {reason(exc)}") from exc


#: Keys ``to_dict`` adds that are derived from the rest (not read back).
_DERIVED = frozenset({"schema", "status", "exit_code", "nodes"})

#: The one reader of the report file.
REPORT: TypeAdapter[ValidationReport] = TypeAdapter(ValidationReport)
