"""Energy minutes written straight into a controller's database, for the power-savings tests
(API, CLI and the dashboard's Energy view): whole minutes of power samples only."""

from __future__ import annotations

from gpufleet.control.db.models import EnergyMinute
from gpufleet.control.service import ControlService


def power_minutes(
    svc: ControlService, node: str, start: float, n: int, watts: float, gpu: int = 0
) -> None:
    """``n`` whole minutes of GPU ``gpu`` of ``node`` from ``start`` at constant ``watts``."""
    with svc.store.sessions.begin() as s:
        for m in range(n):
            s.add(
                EnergyMinute(
                    node=node,
                    gpu_index=gpu,
                    minute_s=int(start + 60 * m),
                    tenant=None,
                    model="h100-sxm",
                    window_j=0.0,
                    window_s=0.0,
                    fallback_j=0.0,
                    power_j=watts * 60.0,
                    power_s=60.0,
                    idle_j=0.0,
                    idle_s=0.0,
                )
            )
