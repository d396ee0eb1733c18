"""The simulator's validation engine, a layer of its own above `gpufleet.validate` and
`gpufleet.devices.sim`: importing it registers the ``sim`` engine in validate's engine
registry (`gpufleet.validate.engines`), so ``validate --sim`` and the Python API's
``run_validation`` on a simulated fleet find it there, while `gpufleet.validate` itself never
imports the simulator (its pass lines come from the catalog's performance model)."""

from __future__ import annotations

from gpufleet.simvalidate.engine import SimEngine
from gpufleet.validate.engines import register_engine

register_engine("sim", SimEngine)

__all__ = ["SimEngine"]
