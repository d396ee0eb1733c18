"""Which part of an agent's jobs report the control plane believes.

Job slots decide where jobs (with their commands and env, secrets included) are sent, so only a
node-bound agent token may offer them, and only for GPUs its node registered: an unbound token
that registered a fake node claiming 64 GPUs must never be handed a 16-GPU job. Reports from
any other token are dropped (its telemetry is still stored); slots for GPU indexes the node did
not register are dropped one by one.
"""

from __future__ import annotations

import logging

from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.cache import NodeView
from gpufleet.wire import Batch

log = logging.getLogger("gpufleet.control.job_slots")
_warned: set[tuple[str, str]] = set()  # (node, what): each problem logged once per node


def _warn_once(node: str, what: str, msg: str, *args: object) -> None:
    if (node, what) in _warned:
        return
    if len(_warned) > 10_000:
        _warned.clear()
    _warned.add((node, what))
    log.warning(msg, *args)


def trusted_jobs_report(batch: Batch, who: Principal, node: NodeView | None) -> Batch:
    """``batch`` with its jobs report kept only as far as ``who`` may offer it for ``node``."""
    rep = batch.jobs
    if rep is None:
        return batch
    if who.role is not Role.AGENT or who.node != batch.node or node is None:
        _warn_once(
            batch.node,
            "unbound",
            "node %s: jobs report ignored; only an agent token bound to the node may offer "
            "job slots (this one is %s)",
            batch.node,
            who.actor,
        )
        return batch.model_copy(update={"jobs": None})
    slots = [s for s in rep.slots if s.index in node.gpus]
    if len(slots) == len(rep.slots):
        return batch
    _warn_once(
        batch.node,
        "slots",
        "node %s: %d job slot(s) for GPUs it never registered ignored",
        batch.node,
        len(rep.slots) - len(slots),
    )
    return batch.model_copy(update={"jobs": rep.model_copy(update={"slots": slots})})
