"""The embedded scheduler: one server or a small lab, nothing else to install.

``EmbeddedScheduler`` (engine) over a ``JobStore`` (store) and a ``JobExecutor`` (executor:
``LocalProcessExecutor`` for real processes, ``SimExecutor`` for the simulator); queue order and
quotas in ``queue``, placement in ``placement``, failover and fencing in ``failover``.
"""

from gpufleet.schedulers.embedded.engine import EmbeddedScheduler, TickResult
from gpufleet.schedulers.embedded.executor import (
    CopyReport,
    ExecutorError,
    JobExecutor,
    Launch,
    LocalProcessExecutor,
    NodeUnreachable,
)
from gpufleet.schedulers.embedded.placement import (
    GpuSlot,
    NodeInfo,
    Placement,
    nodes_from_sim,
    place,
)
from gpufleet.schedulers.embedded.simexec import SimExecutor
from gpufleet.schedulers.embedded.store import JobRow, JobStore, NodeRow

__all__ = [
    "CopyReport",
    "EmbeddedScheduler",
    "ExecutorError",
    "GpuSlot",
    "JobExecutor",
    "JobRow",
    "JobStore",
    "Launch",
    "LocalProcessExecutor",
    "NodeInfo",
    "NodeRow",
    "NodeUnreachable",
    "Placement",
    "SimExecutor",
    "TickResult",
    "nodes_from_sim",
    "place",
]
