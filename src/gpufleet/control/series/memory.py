"""One GPU's series from this controller's own memory and database: raw samples from the
telemetry rings, per-minute rollups (mean, min, max) from the rollup table, and the one place
the series API's answer is shaped (`build_series`, which the Prometheus source uses too)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from gpufleet.control.db.models import Rollup
from gpufleet.control.state.store import ControlStore, NodeView, NotFound
from gpufleet.wire import views as sc

Raw = tuple[list[float], dict[str, list[float | None]]]
Minutes = tuple[
    list[float],
    dict[str, list[float | None]],
    dict[str, list[float | None]],
    dict[str, list[float | None]],
]


def build_series(
    nc: NodeView,
    gpu: int,
    resolution: str,
    raw: Callable[[], Raw],
    minutes: Callable[[], Minutes],
) -> sc.Series:
    """The series API's answer for one GPU from whichever store reads it (``raw`` samples or
    per-minute ``minutes``: mean, min, max); the one place its shape is made."""
    if gpu not in nc.gpus:
        raise NotFound(f"node {nc.name} has no GPU {gpu}")
    limit = nc.gpus[gpu].power_limit_w
    if resolution == "raw":
        t, cols = raw()
        return sc.Series(
            node=nc.name, gpu=gpu, resolution="raw", t=t, fields=cols, power_limit_w=limit
        )
    tm, mean, lo, hi = minutes()
    return sc.Series(
        node=nc.name,
        gpu=gpu,
        resolution="minute",
        t=tm,
        fields=mean,
        min=lo,
        max=hi,
        power_limit_w=limit,
    )


def series(
    store: ControlStore,
    nc: NodeView,
    gpu: int,
    names: list[str],
    *,
    resolution: str,
    since_s: float | None,
) -> sc.Series:
    """One GPU's series from the controller's rings (raw) and rollup table (minutes)."""
    return build_series(
        nc,
        gpu,
        resolution,
        lambda: store.telemetry.series(nc.name, gpu, names, since_s),
        lambda: _rollup_minutes(store, nc.name, gpu, names, since_s),
    )


def _rollup_minutes(
    store: ControlStore, node: str, gpu: int, names: list[str], since_s: float | None
) -> Minutes:
    with store.sessions() as s:
        q = select(Rollup).where(Rollup.node == node, Rollup.gpu_index == gpu)
        if since_s is not None:
            q = q.where(Rollup.minute_s >= int(since_s) - 60)
        rows = list(s.scalars(q.order_by(Rollup.minute_s).limit(10_080)))
    mean: dict[str, list[float | None]] = {n: [] for n in names}
    lo: dict[str, list[float | None]] = {n: [] for n in names}
    hi: dict[str, list[float | None]] = {n: [] for n in names}
    for r in rows:
        for n in names:
            st = r.stats.get(n)
            if not (isinstance(st, list) and len(st) == 4):
                st = [None, None, None, None]
            mean[n].append(_num(st[2]))
            lo[n].append(_num(st[1]))
            hi[n].append(_num(st[3]))
    return [float(r.minute_s) for r in rows], mean, lo, hi


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None
