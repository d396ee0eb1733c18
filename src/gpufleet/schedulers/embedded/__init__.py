"""The embedded scheduler: one server or a small lab, nothing else to install.

``EmbeddedScheduler`` (engine) over a ``JobStore`` (store) and a ``JobExecutor`` (executor:
``LocalProcessExecutor`` for real processes, ``SimExecutor`` for the simulator); queue order and
quotas in ``queue``, placement in ``placement``, failover and fencing in ``failover``.

The names below load on first use: the per-job fencing wrapper (``python -m
gpufleet.schedulers.embedded.runner``, one per job copy) needs none of them, and importing the
engine (SQLAlchemy) cost every job start most of a second of CPU.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_MODULE = {
    "EmbeddedScheduler": "engine",
    "TickResult": "engine",
    "CopyReport": "executor",
    "ExecutorError": "executor",
    "JobExecutor": "executor",
    "Launch": "executor",
    "LocalProcessExecutor": "executor",
    "NodeUnreachable": "executor",
    "GpuSlot": "placement",
    "NodeInfo": "placement",
    "Placement": "placement",
    "nodes_from_sim": "placement",
    "place": "placement",
    "SimExecutor": "simexec",
    "JobRow": "store",
    "JobStore": "store",
    "NodeRow": "store",
}


def __getattr__(name: str) -> Any:
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
