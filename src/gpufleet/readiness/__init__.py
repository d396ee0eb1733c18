"""Day-one readiness checks of a GPU node, by phase (driver, CUDA, containers, GPUDirect,
network, host), read through an injectable root filesystem and command runner."""

from gpufleet.readiness.host import FileRunner, Host, SystemRunner
from gpufleet.readiness.run import (
    PHASES,
    nvml_facts,
    readiness_findings,
    readiness_test_result,
    run_readiness,
    to_findings,
)
from gpufleet.readiness.types import Expectations, NvmlFacts

__all__ = [
    "PHASES",
    "Expectations",
    "FileRunner",
    "Host",
    "NvmlFacts",
    "SystemRunner",
    "nvml_facts",
    "readiness_findings",
    "readiness_test_result",
    "run_readiness",
    "to_findings",
]
