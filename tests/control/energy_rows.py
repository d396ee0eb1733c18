"""Rows written straight into a controller's database for the power-savings tests (API, CLI
and the dashboard's Energy view): whole energy minutes of power samples, and a running job."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert

from gpufleet.control.db.models import EnergyMinute
from gpufleet.control.service import ControlService
from gpufleet.schedulers.embedded.store import sched_attempts, sched_jobs


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


def running_job(svc: ControlService, start: float, gpu: int = 0) -> str:
    """A running job of the embedded scheduler's tables holding ``gpu`` of n1 since ``start``."""
    with svc.store.sessions.begin() as s:
        res: Any = s.execute(
            insert(sched_jobs).values(
                name="train", tenant="default", spec="{}", state="running", started_at=start
            )
        )
        seq = res.inserted_primary_key[0]
        s.execute(
            insert(sched_attempts).values(
                job_seq=seq, generation=1, nodes='["n1"]', gpus=f"[[{gpu}]]", started_at=start
            )
        )
    return str(seq)
