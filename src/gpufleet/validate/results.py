"""Result objects of a validation run, the same for the simulator and the PyTorch engine.

They are defined with their JSON form in `gpufleet.wire.validation_report` (the file is a
message: `gpufleet validate --out` writes it, the control plane reads it); the form is
versioned (``schema``) and documented in ``docs/validate.md``; a control plane maps ``status``
(pass/warn/fail) to node lifecycle.
"""

from __future__ import annotations

from gpufleet.wire.validation_report import (
    SCHEMA,
    CollectiveRow,
    GpuEnv,
    Metric,
    Status,
    Straggler,
    TestResult,
    TracePoint,
    ValidationReport,
    worst,
)

__all__ = [
    "SCHEMA",
    "CollectiveRow",
    "GpuEnv",
    "Metric",
    "Status",
    "Straggler",
    "TestResult",
    "TracePoint",
    "ValidationReport",
    "worst",
]
