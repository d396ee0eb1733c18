"""Pass thresholds per GPU model: the catalog's peak x an expected efficiency.

Expected figures come from the catalog's performance model (``gpufleet.catalog.performance``,
data in ``catalog/data/performance.yaml`` and each model's measured ``efficiency``, every figure
with its source): e.g. on an H200 bf16 matmul 0.80 of peak, HBM copy 0.88 of the data-sheet
bandwidth, PCIe Gen5 x16 55.5 GB/s pinned (``tests/fixtures/nvidia-h200/load_trace.json``). A figure
passes at >= ``pass_fraction`` (default 0.90) of the expected value; a figure between
``pass_fraction`` and ``warn_fraction`` (default 0.95) passes with a warning. Both can be set per
test in a YAML file (``--config``)::

    defaults: {pass_fraction: 0.9, warn_fraction: 0.95}
    tests:
      matmul: {pass_fraction: 0.85}
      targeted_power: {min_power_fraction: 0.95}
    expect_mig: false
    straggler_z: 3.5
    straggler_min_deviation: 0.05
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.catalog import GpuModel
from gpufleet.catalog import performance as perf
from gpufleet.errors import ConfigError, UnknownNameError
from gpufleet.validate.results import Metric, Status
from gpufleet.validate.suite import TESTS
from gpufleet.yamldoc import Document, field_error, read_text_file, read_yaml, validate

DEFAULT_PASS_FRACTION = 0.90
DEFAULT_WARN_FRACTION = 0.95
# Targeted power must reach this fraction of the enforced limit (issue 4; like DCGM's targeted
# power plugin, which checks that the GPU reaches the requested power).
MIN_POWER_FRACTION = 0.95
# NVIDIA "Dynamic Page Retirement" (docs.nvidia.com/deploy/dynamic-page-retirement): a board
# that has retired 60 or more pages qualifies for RMA.
RETIRED_PAGES_LIMIT = 60
# Iglewicz & Hoaglin (1993), "How to Detect and Handle Outliers": modified z-scores with
# |z| > 3.5 are potential outliers.
STRAGGLER_Z = 3.5
# A straggler must also sit this far from its peers' median: on a very uniform fleet the MAD is
# tiny and a 1-2 % difference reaches any z-score, yet the pass lines accept a figure down to
# the warn line (0.95 of expected) without a word; 5 % is that band (issue 14 item 4).
STRAGGLER_MIN_DEVIATION = 0.05
MATMUL_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8")


@dataclass(frozen=True)
class TestLimits:
    """Pass and warn lines of one test, as fractions of the expected value."""

    __test__ = False  # not a pytest test class

    pass_fraction: float = DEFAULT_PASS_FRACTION
    warn_fraction: float = DEFAULT_WARN_FRACTION
    min_power_fraction: float = MIN_POWER_FRACTION


@dataclass(frozen=True)
class Thresholds:
    """All thresholds of a run."""

    default: TestLimits = TestLimits()
    per_test: dict[str, TestLimits] = field(default_factory=dict)
    expect_mig: bool | None = False  # None: either is fine
    straggler_z: float = STRAGGLER_Z
    straggler_min_deviation: float = STRAGGLER_MIN_DEVIATION
    retired_pages_limit: int = RETIRED_PAGES_LIMIT

    def limits(self, test: str) -> TestLimits:
        return self.per_test.get(test, self.default)

    def judge(
        self, test: str, name: str, value: float, expected: float | None, unit: str
    ) -> Metric:
        """A higher-is-better figure against its expected value."""
        if expected is None or expected <= 0:
            return Metric(name, value, unit, expected, None, Status.PASS)
        lim = self.limits(test)
        pass_min = lim.pass_fraction * expected
        if value < pass_min:
            status = Status.FAIL
        elif value < lim.warn_fraction * expected:
            status = Status.WARN
        else:
            status = Status.PASS
        return Metric(name, value, unit, expected, pass_min, status)


Fraction = Annotated[float, Field(strict=True, gt=0.0, le=1.5)]


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LimitsDoc(_Doc):
    """Pass and warn lines as written in a thresholds file (unset: inherited)."""

    pass_fraction: Fraction | None = None
    warn_fraction: Fraction | None = None
    min_power_fraction: Fraction | None = None


class ThresholdsDoc(_Doc):
    """A thresholds file (format in the module doc)."""

    defaults: LimitsDoc | None = None
    tests: dict[str, LimitsDoc | None] | None = None
    expect_mig: Annotated[bool, Field(strict=True)] | None = False
    straggler_z: Annotated[float, Field(strict=True, gt=0.0)] = STRAGGLER_Z
    straggler_min_deviation: Annotated[float, Field(strict=True, ge=0.0, lt=1.0)] = (
        STRAGGLER_MIN_DEVIATION
    )
    retired_pages_limit: Annotated[int, Field(strict=True, ge=0)] = RETIRED_PAGES_LIMIT


def _limits(
    base: TestLimits, item: LimitsDoc | None, doc: Document, loc: tuple[str, ...]
) -> TestLimits:
    out = replace(base, **item.model_dump(exclude_none=True)) if item else base
    if out.warn_fraction < out.pass_fraction:
        raise field_error(
            doc,
            (*loc, "warn_fraction"),
            f"warn_fraction {out.warn_fraction} must be >= pass_fraction {out.pass_fraction}",
        )
    return out


def parse_thresholds(text: str, source: str = "<thresholds>") -> Thresholds:
    """Parse a thresholds YAML document; errors name the file, line and field."""
    doc = read_yaml(text, source)
    if doc.data is None:
        doc.data = {}
    if not isinstance(doc.data, dict):
        raise field_error(doc, (), "expected a mapping (defaults, tests, expect_mig, ...)")
    parsed = validate(ThresholdsDoc, doc)
    default = _limits(TestLimits(), parsed.defaults, doc, ("defaults",))
    per: dict[str, TestLimits] = {}
    for name, item in (parsed.tests or {}).items():
        if name not in TESTS:
            err = UnknownNameError("test", name, list(TESTS))
            raise field_error(doc, ("tests", name), str(err))
        per[name] = _limits(default, item, doc, ("tests", name))
    return Thresholds(
        default=default,
        per_test=per,
        expect_mig=parsed.expect_mig,
        straggler_z=parsed.straggler_z,
        straggler_min_deviation=parsed.straggler_min_deviation,
        retired_pages_limit=parsed.retired_pages_limit,
    )


def load_thresholds(path: Path | None) -> Thresholds:
    if path is None:
        return Thresholds()
    if not path.is_file():
        raise ConfigError(f"{path}: no such thresholds file")
    return parse_thresholds(read_text_file(path, "thresholds file"), source=str(path))


# ----- expected values per model (the catalog's performance model) --------------------------
expected_matmul_tflops = perf.matmul_tflops
expected_sustained_tflops = perf.sustained_tflops
expected_hbm_gbps = perf.hbm_copy_gbps
expected_collective_busbw = perf.collective_busbw_gbps
expected_busbw_by_op = perf.expected_busbw_by_op
node_network_gbps = perf.node_network_gbps
expected_p2p_gbps = perf.p2p_gbps


def expected_pcie_gbps(model: GpuModel, direction: str) -> float:
    """At the model's full link (a downgraded link is what this test must catch)."""
    return perf.pcie_gbps(model, None, None, direction)
