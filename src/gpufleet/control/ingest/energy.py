"""Ingest's call into the energy ledger (after the batch's transaction committed): only the
batch's energy-counter readings are queued here (slow-tier blocks, a list append); the power
samples are integrated in bulk from the telemetry store's rings at the next flush
(`gpufleet.control.state.energy_store.flush_energy`), so ingest's hot path stays as it was."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.control.state.cache import IngestItem
from gpufleet.wire.limits import SAMPLE_AHEAD_S, SAMPLE_BEHIND_S

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore


def _readings(item: IngestItem) -> list[tuple[int, Any, Any]]:
    if item.sample_count is not None:
        return list(item.energy)
    return [
        (ws.gpu_index, ws.t, ws.fields["energy_mj"])
        for ws in item.batch.samples
        if "energy_mj" in ws.fields
    ]


def account_energy(store: ControlStore, item: IngestItem) -> None:
    """Queue one committed batch's counter readings (inside the time window ingest keeps)."""
    readings = _readings(item)
    if not readings:
        return
    lo, hi = item.received_s - SAMPLE_BEHIND_S, item.received_s + SAMPLE_AHEAD_S
    kept = []
    for gpu, ts, vals in readings:
        pairs = [(t, v) for t, v in zip(ts, vals, strict=False) if lo <= t <= hi]
        if pairs:
            kept.append((gpu, [t for t, _ in pairs], [v for _, v in pairs]))
    if kept:
        store.energy.queue_readings(item.batch.node, kept)
