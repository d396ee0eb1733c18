"""Ingest's call into the energy ledger (after the batch's transaction committed): the batch's
power samples (as arrays) and energy-counter readings, with the node's tenant, its GPUs'
models and whether it is in service (idle time counts only then)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.control.cache import IngestItem
from gpufleet.control.lifecycle import NodeState
from gpufleet.wire.limits import SAMPLE_AHEAD_S, SAMPLE_BEHIND_S

if TYPE_CHECKING:
    from gpufleet.control.store import ControlStore


def _readings(item: IngestItem) -> list[tuple[int, Any, Any]]:
    if item.sample_count is not None:
        return list(item.energy)
    return [
        (ws.gpu_index, ws.t, ws.fields["energy_mj"])
        for ws in item.batch.samples
        if "energy_mj" in ws.fields
    ]


def account_energy(store: ControlStore, item: IngestItem) -> None:
    """Add one committed batch to the ledger."""
    node = item.batch.node
    nc = store.nodes.get(node)
    if nc is None:
        return
    labels = {i: (nc.tenant, g.model) for i, g in nc.gpus.items()}
    arrays = item.arrays
    if arrays is None:
        from gpufleet.control.ingest import sample_arrays  # ingest imports the store

        arrays = sample_arrays(item.batch.samples)
    store.energy.add_groups(
        node,
        arrays,
        in_service=nc.state == NodeState.IN_SERVICE.value,
        idle_util_pct=store.policy.idle_util_pct,
        labels=labels,
    )
    readings = _readings(item)
    if readings:
        lo, hi = item.received_s - SAMPLE_BEHIND_S, item.received_s + SAMPLE_AHEAD_S
        kept = []
        for gpu, ts, vals in readings:
            pairs = [(t, v) for t, v in zip(ts, vals, strict=False) if lo <= t <= hi]
            if pairs:
                kept.append((gpu, [t for t, _ in pairs], [v for _, v in pairs]))
        store.energy.add_readings(node, kept, labels)
