"""A campaign drain's deadline (issue 15): jobs still running on a draining node when
``drain_deadline_s`` has passed are evacuated through the scheduler protocol
(`SchedulerBackend.evacuate`): each gets the campaign's checkpoint signal and
``checkpoint_grace_s`` seconds to save its state, then is killed if needed and requeued as an
infrastructure requeue (never against the job's own restarts). The campaign then waits for the
node to become idle as in an ordinary drain.

The engine (`gpufleet.control.campaigns.engine`) records the ``evacuating`` step in its transaction;
the backend's call runs after the commit on the scheduler's thread, and its answer (how many
jobs were requeued after the signal, how many only killed) comes back to the writer and is
added to that step's row and to an event. A controller killed between the commit and the
call loses the call: the engine sends it again once per process for a step whose row holds
no answer yet (`needs_call`), so the jobs are never left running past the deadline.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from gpufleet.control.campaigns.spec import EVACUATING, CampaignSpec
from gpufleet.control.db.models import EventRow, MaintStep
from gpufleet.schedulers.base import Evacuation

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from gpufleet.control.state import lifecycle as lc
    from gpufleet.control.state.store import ControlStore

log = logging.getLogger("gpufleet.control.campaigns")
# (campaign, node) whose evacuation this process has sent (see the module docstring)
_sent: weakref.WeakKeyDictionary[ControlStore, set[tuple[int, str]]] = weakref.WeakKeyDictionary()


def evacuate_after(
    store: ControlStore, cid: int, node: str, spec: CampaignSpec, after: lc.PostCommit
) -> None:
    """After the commit: ask the scheduler to evacuate ``node``; its answer is recorded."""
    _sent.setdefault(store, set()).add((cid, node))
    hook = store.hook
    reason = f"maintenance campaign {cid}: drain deadline ({spec.drain_deadline_s:g} s) passed"

    def then(ev: Evacuation) -> None:
        store.writer.submit(lambda: record(store, cid, node, spec.checkpoint_signal, ev))

    after.append(
        lambda: hook.evacuate(
            node, reason, signal=spec.checkpoint_signal, grace_s=spec.checkpoint_grace_s, then=then
        )
    )


def needs_call(store: ControlStore, s: Session, cid: int, node: str) -> bool:
    """Is this an ``evacuating`` step whose call this process never sent and whose answer
    never came (a controller restarted between the step and the call)?"""
    if (cid, node) in _sent.get(store, set()):
        return False
    row = _step_row(s, cid, node)
    return row is not None and "signalled" not in (row.detail or {})


def _step_row(s: Session, cid: int, node: str) -> MaintStep | None:
    q = select(MaintStep).where(
        MaintStep.campaign_id == cid, MaintStep.node == node, MaintStep.step == EVACUATING
    )
    return s.scalars(q).first()


def record(store: ControlStore, cid: int, node: str, sig: str, ev: Evacuation) -> None:
    """The scheduler's answer, on the writer: summed into the step's row, plus an event."""
    with store.sessions.begin() as s:
        row = _step_row(s, cid, node)
        if row is None:
            return
        detail: dict[str, Any] = dict(row.detail or {})
        detail["signalled"] = int(detail.get("signalled", 0)) + ev.signalled
        detail["killed"] = int(detail.get("killed", 0)) + ev.killed
        detail["jobs"] = [*detail.get("jobs", []), *ev.jobs][:100]
        if ev.note:
            detail["note"] = ev.note[:300]
        row.detail = detail
        msg = (
            f"campaign {cid}: drain deadline: {ev.signalled} job(s) requeued after {sig}, "
            f"{ev.killed} killed without it"
        )
        s.add(
            EventRow(
                at_s=store.clock(),
                node=node,
                kind="maintenance_evacuated",
                severity=1 if ev.killed else 0,
                message=msg + (f" ({ev.note})" if ev.note else ""),
                data={"campaign": cid, **ev.as_dict()},
            )
        )
    log.info("%s on %s", msg, node)


def requeue_counts(s: Session, cid: int) -> dict[str, int]:
    """Jobs the campaign requeued after the checkpoint signal, and killed without it."""
    q = select(MaintStep.detail).where(MaintStep.campaign_id == cid, MaintStep.step == EVACUATING)
    out = {"signalled": 0, "killed": 0, "nodes": 0}
    for detail in s.scalars(q):
        out["nodes"] += 1
        out["signalled"] += int((detail or {}).get("signalled", 0))
        out["killed"] += int((detail or {}).get("killed", 0))
    return out
